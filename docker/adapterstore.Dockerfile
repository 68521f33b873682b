# The adapter store: gRPC in front of S3. No engine, no GPU.
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY services ./services
RUN pip install --no-cache-dir . && useradd --system --uid 10001 loraserve

USER loraserve
EXPOSE 50051 9101
ENTRYPOINT ["adapterstore"]
CMD ["serve"]
