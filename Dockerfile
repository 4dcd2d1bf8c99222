# linattn-server in a container: built with the project's own scripts on
# Debian 12, run as a non-root user.
#
#   podman build -t linattn .          (or docker build)
#   podman run -p 50051:50051 linattn
# Configure with LINATTN_* environment variables (see linattn-server --help).

FROM debian:bookworm-slim AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh --no-python && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLINATTN_BUILD_BENCH=OFF \
 && cmake --build build -j2 --target linattn-server linattn linattn-load linattn_sentencepiece

FROM debian:bookworm-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libabsl20220623 libdnnl2 libfmt9 libgomp1 libgrpc++1.51 libprotobuf32 libspdlog1.10 \
      libsentencepiece0 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin linattn
COPY --from=build /src/build/bin/linattn-server /src/build/bin/linattn /src/build/bin/linattn-load \
     /usr/local/bin/
COPY --from=build /src/build/bin/liblinattn_sentencepiece.so /usr/local/lib/linattn/
COPY models/tiny /usr/share/linattn/models/tiny
USER linattn
ENV LINATTN_LISTEN=0.0.0.0:50051 \
    LINATTN_MODEL=/usr/share/linattn/models/tiny
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["linattn", "health", "--server", "127.0.0.1:50051"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["linattn-server"]
