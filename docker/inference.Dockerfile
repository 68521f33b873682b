# The inference service on the CUDA build of vLLM, pinned to the version the
# project's `gpu` extra pins, so the image and `pip install loraserve[gpu]` agree.
FROM vllm/vllm-openai:v0.32.0

WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY services ./services
RUN pip install --no-cache-dir '.[gpu]'

EXPOSE 50052 9102 8000
ENTRYPOINT ["inference"]
CMD ["serve"]
