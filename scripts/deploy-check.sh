#!/usr/bin/env bash
# Checks deploy/ from outside: the Kubernetes base renders (`kubectl
# kustomize deploy/k8s`) and every object it renders is valid against the
# Kubernetes API schemas (tests/deploy/validate.mjs); HAProxy accepts the
# proxy configuration with the addresses the compose file and the manifests
# give it; podman-compose reads the compose file (--dry-run: what it would
# run).
#
#   scripts/deploy-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d /tmp/linattn-deploy.XXXXXX)"
trap 'rm -rf "$work"' EXIT

for tool in kubectl node npm haproxy podman-compose; do
  if ! command -v "$tool" >/dev/null; then
    echo "deploy-check: $tool is missing (scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
done

kubectl kustomize deploy/k8s > "$work/k8s.yaml" 2> "$work/kustomize.err" || {
  cat "$work/kustomize.err" >&2
  echo "deploy-check: deploy/k8s does not render" >&2
  exit 1
}
echo "deploy/k8s renders: $(grep -c '^kind:' "$work/k8s.yaml") objects"

# The schemas (npm, pinned by tests/deploy/package-lock.json).
if [[ ! -d tests/deploy/node_modules/kubernetes-models ]]; then
  (cd tests/deploy && npm ci --no-audit --no-fund --silent)
fi
node tests/deploy/validate.mjs "$work/k8s.yaml"

# The proxy configuration, as the manifests and the compose file fill it in
# (their replica names resolve only there: HAProxy starts without them and
# finds them through DNS when they appear).
for env in "linattn-0.linattn linattn-1.linattn linattn-2.linattn" \
           "linattn-1 linattn-2 linattn-3"; do
  read -r r1 r2 r3 <<< "$env"
  LINATTN_PROXY_BIND=127.0.0.1:50051 \
  LINATTN_1="$r1:50051" LINATTN_2="$r2:50051" LINATTN_3="$r3:50051" \
  LINATTN_1_AGENT=50061 LINATTN_2_AGENT=50061 LINATTN_3_AGENT=50061 \
    haproxy -c -q -f deploy/haproxy/haproxy.cfg
done
echo "deploy/haproxy/haproxy.cfg: valid"

# podman-compose reads the compose file and says what it would run (a dry
# run still makes the project's volume and network: removed after). It
# reads a copy, beside a keys file of its own: for a bind mount whose file
# is missing podman-compose makes a directory, which must not land in the
# source tree.
project=linattn-deploy-check-$$
trap 'rm -rf "$work"; podman volume rm -f "${project}_redis-data" >/dev/null 2>&1 || true;
      podman network rm -f "${project}_default" >/dev/null 2>&1 || true' EXIT
mkdir -p "$work/deploy"
cp -r deploy/compose deploy/images "$work/deploy/"
echo '{"keys": []}' > "$work/deploy/compose/api-keys.json"
(cd "$work/deploy/compose" &&
  podman-compose --dry-run -p "$project" -f compose.yaml up -d > "$work/compose.txt" 2>&1) || {
  cat "$work/compose.txt" >&2
  echo "deploy-check: podman-compose cannot read deploy/compose/compose.yaml" >&2
  exit 1
}
for service in redis linattn-1 linattn-2 linattn-3 proxy; do
  grep -q "^podman run --name=${project}_${service}_1 " "$work/compose.txt" || {
    cat "$work/compose.txt" >&2
    echo "deploy-check: the compose file does not run $service" >&2
    exit 1
  }
done
echo "deploy/compose/compose.yaml: valid"
echo "OK"
