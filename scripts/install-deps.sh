#!/usr/bin/env bash
# Installs the Debian 12 packages linattn builds, tests and runs with.
# Idempotent: only packages that are missing are installed; nothing is
# downloaded from outside Debian's archive.
#
#   scripts/install-deps.sh          build, test and benchmark dependencies
#   scripts/install-deps.sh --no-python
#                                    without the Python reference stack
#                                    (the container's build stage)
set -euo pipefail

python=1
for arg in "$@"; do
  case "$arg" in
    --no-python) python=0 ;;
    *) echo "install-deps: unknown option $arg" >&2; exit 2 ;;
  esac
done

packages=(
  # toolchain (ccache: every make build goes through it, so a rebuild
  # reuses objects)
  build-essential cmake make pkg-config git clang-format ccache
  # RPC: gRPC C++ and Protocol Buffers (compiler, plugin, headers)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # compute: oneDNN 2.6 (v2 API)
  libdnnl-dev
  # support libraries
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  # model tokenizers: SentencePiece, and for tokenizer.json PCRE2 (its
  # split patterns) and utf8proc (Unicode properties and normalization)
  libsentencepiece-dev libpcre2-dev libutf8proc-dev
  # the shared state store's Redis client, and the HTTP listener
  libhiredis-dev libcpp-httplib-dev
  # operations: Prometheus metrics (prometheus-cpp's core library), and
  # OpenSSL (API keys' hashes, TLS)
  prometheus-cpp-dev libssl-dev
  # tests and benchmarks (python3: the report scripts in bench/ and the
  # container check, standard library only)
  libgtest-dev libgmock-dev libbenchmark-dev python3
  # `make fuzz`: clang with libFuzzer and the sanitizer runtimes, and LLVM's
  # OpenMP for the clang build
  clang libclang-rt-14-dev libomp-dev
)
if ((python)); then
  packages+=(
    # the PyTorch reference forward the model tests compare against, and the
    # training of the built-in model (tools/); OpenBLAS so that torch's GEMMs
    # do not fall back to the reference BLAS
    python3-torch python3-numpy libopenblas0-pthread python3-sentencepiece
    # bench/compare's figures (bench/plots.py), and perf for its profile of
    # the serving path (bench/serving_profile.py)
    python3-matplotlib linux-perf
    # a standard gRPC client (grpcio, with protobuf) for the tests that check
    # what clients in other languages see
    python3-grpcio python3-protobuf
    # installing the Python client package (clients/python) offline into a
    # venv: venv, pip, and the setuptools and wheel that build it
    python3-venv python3-pip python3-setuptools python3-wheel
    # the built-in model's training text: the King James Bible
    bible-kjv
    # the reference Jinja engine the chat-template tests render against
    python3-jinja2
    # the real engines replicas run behind and on (tools/scaleout_check.sh):
    # Redis for the shared state store, HAProxy for session routing; and
    # what checks deploy/ (scripts/deploy-check.sh): podman-compose, which
    # asks podman itself even for a dry run
    redis-server haproxy podman podman-compose
    # the HTTP listener's tests: raw Server-Sent Events through curl, and
    # the explorer page in a headless Chromium (driven by playwright-core
    # from npm, tests/http)
    curl chromium
    # the observability tests: Prometheus (and promtool) scraping a server
    # and checking deploy/prometheus's rules; openssl makes the TLS tests'
    # certificates
    prometheus openssl
  )
  # kubectl renders deploy/k8s (`kubectl kustomize`), and Node.js runs the
  # schema check: Debian's, unless the machine has its own.
  command -v kubectl >/dev/null || packages+=(kubernetes-client)
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
