# The native Generate transport, built as `make native` builds it: Debian 12's rustc and
# packaged crates, offline, h2 with the advisories' fixes it lacks (patches/); one ABI3
# library for any CPython from 3.10.
FROM debian:bookworm-slim AS native
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      cargo patch python3 librust-pyo3-dev librust-h2-dev librust-tokio-dev librust-bytes-dev \
      librust-http-dev librust-futures-util-dev librust-tokio-rustls-dev \
      librust-rustls-pemfile-dev librust-flate2-dev \
 && rm -rf /var/lib/apt/lists/*
COPY services/inference/native /src/native
RUN mkdir -p /src/native/target \
 && cp -r /usr/share/cargo/registry/h2-0.3.13 /src/native/target/h2 \
 && for fix in /src/native/patches/h2-0.3.13-*.patch; do \
      patch --quiet --forward --batch -d /src/native/target/h2 -p1 < "$fix" || exit 1; \
    done \
 && cargo build --release --offline --manifest-path /src/native/Cargo.toml \
      --config 'source.crates-io.replace-with="debian"' \
      --config 'source.debian.directory="/usr/share/cargo/registry"'

# The inference service on the CUDA build of vLLM, pinned to the version the
# project's `gpu` extra pins, so the image and `pip install loraserve[gpu]` agree.
FROM vllm/vllm-openai:v0.32.0

WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY services ./services
COPY --from=native /src/native/target/release/libloraserve_native.so \
     services/inference/loraserve/inference/transport/loraserve_native.abi3.so
RUN pip install --no-cache-dir '.[gpu]' \
 && python3 -c 'from loraserve.inference.transport import load_native; load_native()'

EXPOSE 50052 9102 8000
ENTRYPOINT ["inference"]
CMD ["serve"]
