# linattn-server in a container: built with the project's own scripts on
# Debian 12, run as a non-root user.
#
#   podman build -t linattn .          (or docker build)
#   KEY=$(deploy/make-api-keys.sh api-keys.json me)   # hashes only
#   podman run -p 50051:50051 -p 8080:8080 -v linattn-state:/var/lib/linattn \
#     -v ./api-keys.json:/etc/linattn/api-keys.json:ro \
#     -e LINATTN_API_KEYS=/etc/linattn/api-keys.json linattn   (gRPC, HTTP)
# The server listens on 0.0.0.0 here, so it refuses to start without keys
# (or --tls-client-ca, or LINATTN_ALLOW_UNAUTHENTICATED=true behind a proxy
# that authenticates). Configure with LINATTN_* environment variables (see
# linattn-server --help); clients send the key (LINATTN_API_KEY).

FROM debian:bookworm-slim AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh --no-python && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLINATTN_BUILD_BENCH=OFF \
 && cmake --build build -j2 --target linattn-server linattn linattn-load linattn_sentencepiece \
 && cmake --install build --prefix /opt/linattn

FROM debian:bookworm-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libabsl20220623 libdnnl2 libfmt9 libgomp1 libgrpc++1.51 libprotobuf32 libspdlog1.10 \
      libsentencepiece0 libhiredis0.14 libcpp-httplib0.11 libprometheus-cpp-core1.0 \
      libssl3 libpcre2-8-0 libutf8proc2 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin linattn \
 && mkdir -p /var/lib/linattn && chown linattn /var/lib/linattn
# The installed tree (bin/, lib/linattn/, share/linattn/ with the built-in
# model, share/doc/linattn/ with the LICENSE); the programs find the model
# and the SentencePiece module relative to themselves.
COPY --from=build /opt/linattn /usr/local
# Sessions are durable in the volume /var/lib/linattn (every change is
# there, fsynced, before it is acknowledged; a volume mounted here starts
# owned by the server's user): a restart of the container keeps them.
# LINATTN_STATE_DIR=none keeps them in memory only; replicas sharing Redis
# (LINATTN_STATE_STORE) set it to none too.
USER linattn
ENV LINATTN_LISTEN=0.0.0.0:50051 LINATTN_HTTP_LISTEN=0.0.0.0:8080 \
    LINATTN_STATE_DIR=/var/lib/linattn
VOLUME /var/lib/linattn
EXPOSE 50051 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["linattn", "health", "--server", "127.0.0.1:50051"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["linattn-server"]
