#!/usr/bin/env bash
# Builds the Dockerfile with podman and checks the container for real: it
# must report healthy, answer an `attend --server` call from the host, and
# stream the built-in model's continuation exactly as a host-side server does.
# Runs as root (CI). Registries are not used: the base image is a Debian 12
# rootfs made with debootstrap, tagged as the Dockerfile's FROM image, and
# the build runs with --pull=never. The rootfs tarball is cached in
# $LINATTN_CACHE_DIR (default /var/cache/linattn) when the machine keeps it;
# without the cache it is made afresh.
#
#   scripts/container-check.sh [path/to/linattn]   (the host-side client)
set -euo pipefail
cd "$(dirname "$0")/.."
client=${1:-build/bin/linattn}
image=localhost/linattn:check
base=docker.io/library/debian:bookworm-slim
cache_dir=${LINATTN_CACHE_DIR:-/var/cache/linattn}
rootfs_tar=$cache_dir/debian-bookworm-minbase.tar

need=()
for p in podman buildah debootstrap runc uidmap slirp4netns fuse-overlayfs containernetworking-plugins \
         golang-github-containernetworking-plugin-dnsname podman-compose catatonit; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

mkdir -p /etc/containers
if ! grep -qs 'runtime = "runc"' /etc/containers/containers.conf; then
  cat > /etc/containers/containers.conf <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
fi

if ! podman image exists "$base"; then
  if [[ ! -s $rootfs_tar ]]; then
    echo "container-check: debootstrap a Debian 12 base (cached in $cache_dir)"
    work=$(mktemp -d)
    debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >/dev/null
    mkdir -p "$cache_dir"
    tar -C "$work/rootfs" -cf "$rootfs_tar.tmp" . && mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$work"
  fi
  podman import "$rootfs_tar" "$base" >/dev/null
fi

echo "container-check: building $image"
podman build --pull=never --format docker -t "$image" . > /tmp/linattn-container-build.log 2>&1 || {
  tail -40 /tmp/linattn-container-build.log; exit 1; }

name=linattn-check-$$
port=$(( 20000 + RANDOM % 20000 ))
http_port=$(( port + 1 ))
keys_dir=$(mktemp -d)
cleanup() {
  podman rm -f "$name" "$name-open" >/dev/null 2>&1 || true
  rm -rf "$keys_dir"
}
trap cleanup EXIT
# The image listens on 0.0.0.0: without keys it refuses to start, saying
# what to give.
podman run --name "$name-open" "$image" > "$keys_dir/open.log" 2>&1 && {
  echo "container-check: the image served without API keys"; exit 1; }
grep -q "is not a loopback address" "$keys_dir/open.log" || {
  cat "$keys_dir/open.log"; exit 1; }
echo "container-check: without API keys the image refuses to start"
# Keys as the deployment gives them: a file of hashes, mounted read-only;
# the clients below send the key (LINATTN_API_KEY, curl's header).
export LINATTN_API_KEY
LINATTN_API_KEY=$(deploy/make-api-keys.sh "$keys_dir/api-keys.json" check)
keys_mount=(-v "$keys_dir/api-keys.json:/etc/linattn/api-keys.json:ro"
            -e LINATTN_API_KEYS=/etc/linattn/api-keys.json)
podman run -d --name "$name" -p "127.0.0.1:$port:50051" -p "127.0.0.1:$http_port:8080" \
  "${keys_mount[@]}" "$image" >/dev/null

echo "container-check: waiting for health on 127.0.0.1:$port"
for _ in $(seq 1 60); do
  if "$client" health --server "127.0.0.1:$port" --timeout 1 >/dev/null 2>&1; then break; fi
  sleep 0.5
done
"$client" health --server "127.0.0.1:$port"
# The image's own HEALTHCHECK (kept because the image is built in docker
# format) must pass inside the container.
podman healthcheck run "$name"
echo "container-check: HEALTHCHECK passes inside the container"
[[ $(podman exec "$name" id -u) != 0 ]] || { echo "container runs as root"; exit 1; }

# One attend --server call from the host, checked against the local result.
tmp=$(mktemp -d)
/usr/bin/python3 - "$tmp" <<'PY'
import sys, struct
d = sys.argv[1]
def write(name, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % ", ".join(map(str, shape))
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(f"{d}/{name}", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % len(values), *values))
T, H, D = 20, 2, 4
n = T * H * D
write("q.npy", (T, H, D), [((i * 37) % 17) / 8.0 - 1 for i in range(n)])
write("k.npy", (T, H, D), [((i * 11) % 13) / 6.0 - 1 for i in range(n)])
write("v.npy", (T, H, D), [((i * 7) % 19) / 9.0 - 1 for i in range(n)])
PY
"$client" attend --server "127.0.0.1:$port" --mode decode --epsilon 0 \
  --q "$tmp/q.npy" --k "$tmp/k.npy" --v "$tmp/v.npy" --out "$tmp/remote.npy"
"$client" attend --mode recurrent \
  --q "$tmp/q.npy" --k "$tmp/k.npy" --v "$tmp/v.npy" --out "$tmp/local.npy"
cmp "$tmp/remote.npy" "$tmp/local.npy"

# The built-in model through the container, against the same model served by
# the host's linattn-server (greedy without the CLI's default repeat penalty, so
# the text is determined and is what the HTTP completion below gives).
server_bin=$(dirname "$client")/linattn-server
"$server_bin" --listen 127.0.0.1:0 --port-file "$tmp/port" --http-listen none --log-level warn &
host_server=$!
for _ in $(seq 1 100); do [[ -s "$tmp/port" ]] && break; sleep 0.1; done
prompt="In the beginning God created"
"$client" generate --server "127.0.0.1:$port" --max-tokens 48 --temperature 0 --repeat-penalty 1 "$prompt" > "$tmp/container.txt"
"$client" generate --server "127.0.0.1:$(cat "$tmp/port")" --max-tokens 48 --temperature 0 --repeat-penalty 1 "$prompt" > "$tmp/host.txt"
kill -TERM "$host_server"; wait "$host_server" || true
[[ $(wc -c < "$tmp/container.txt") -gt 40 ]] || { echo "generate returned too little"; exit 1; }
cmp "$tmp/container.txt" "$tmp/host.txt"
# The same greedy text through the container's HTTP listener (OpenAI's API).
[[ $(curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/v1/models") == 401 ]] || {
  echo "container-check: the HTTP listener answered without a key"; exit 1; }
curl -sS --max-time 30 -H 'Content-Type: application/json' \
  -H "Authorization: Bearer $LINATTN_API_KEY" \
  -d "{\"prompt\": \"$prompt\", \"max_tokens\": 48, \"temperature\": 0}" \
  "http://127.0.0.1:$http_port/v1/completions" > "$tmp/http.json"
/usr/bin/python3 - "$tmp/http.json" "$tmp/container.txt" <<'PY'
import json, sys
text = json.load(open(sys.argv[1]))["choices"][0]["text"]
expected = open(sys.argv[2], encoding="utf-8").read()
assert expected.startswith(text) and len(expected) - len(text) <= 1, (text, expected)
PY
echo "container-check: the HTTP listener's completion is the same text"
rm -rf "$tmp"
# (podman without systemd logs that it has no healthcheck timer to remove.)
podman stop -t 10 "$name" >/dev/null 2>&1

# Durable sessions in a volume, as the image keeps them by default (no
# LINATTN_STATE_DIR given): sessions written by one container, killed with
# SIGKILL, are all there in the next one (at least at their acknowledged
# step, bit for bit), and again after a SIGTERM'd one.
load_bin=$(dirname "$client")/linattn-load
volume=linattn-check-state-$$
ledger=$(mktemp)
durable_cleanup() {
  podman rm -f "$name-durable" >/dev/null 2>&1 || true
  podman volume rm -f "$volume" >/dev/null 2>&1 || true
  rm -f "$ledger"
}
trap 'cleanup; durable_cleanup' EXIT
start_durable() {
  podman rm -f "$name-durable" >/dev/null 2>&1 || true
  podman run -d --name "$name-durable" -p "127.0.0.1:$port:50051" \
    -v "$volume:/var/lib/linattn" -e LINATTN_MODEL=none "${keys_mount[@]}" "$image" >/dev/null
  for _ in $(seq 1 60); do
    if "$client" health --server "127.0.0.1:$port" --timeout 1 >/dev/null 2>&1; then return; fi
    sleep 0.5
  done
  podman logs "$name-durable"; exit 1
}
start_durable
"$load_bin" --server "127.0.0.1:$port" --sessions 8 --steps 300 --session-prefix box \
  --ledger "$ledger" --no-progress >/dev/null
podman kill -s KILL "$name-durable" >/dev/null
start_durable
"$load_bin" --server "127.0.0.1:$port" --check --ledger "$ledger" | tail -2
podman stop -t 20 "$name-durable" >/dev/null 2>&1
start_durable
"$load_bin" --server "127.0.0.1:$port" --check --ledger "$ledger" | tail -1
podman stop -t 20 "$name-durable" >/dev/null 2>&1
# Replicas (deploy/compose/compose.yaml): three containers of this image
# sharing their sessions through Redis behind HAProxy, both built from
# deploy/images on the same Debian base, run with podman-compose and checked
# through the proxy, before and after one replica is killed.
echo "container-check: deploy/compose with podman-compose"
podman tag "$image" localhost/linattn:latest
for part in redis haproxy; do
  podman build --pull=never -t "localhost/linattn-$part:latest" \
    -f "deploy/images/$part.Containerfile" deploy/images \
    > "/tmp/linattn-$part-build.log" 2>&1 || { tail -20 "/tmp/linattn-$part-build.log"; exit 1; }
done
project=linattn-check-$$
compose() { (cd deploy/compose && podman-compose -p "$project" -f compose.yaml "$@"); }
compose_ledger=$(mktemp)
# The compose file mounts deploy/compose/api-keys.json (as its header says
# to make it); an operator's own file is kept aside and put back.
compose_keys=deploy/compose/api-keys.json
[[ -e $compose_keys ]] && mv "$compose_keys" "$keys_dir/operator-api-keys.json"
cp "$keys_dir/api-keys.json" "$compose_keys"
compose_cleaned=0
compose_cleanup() {
  # Once: podman-compose run again without the keys file would make a
  # directory in its place.
  ((compose_cleaned)) && return 0
  compose_cleaned=1
  compose down -v >/dev/null 2>&1 || true
  podman network rm -f "${project}_default" >/dev/null 2>&1 || true
  rm -f "$compose_ledger" "$compose_keys"
  [[ -e $keys_dir/operator-api-keys.json ]] && mv "$keys_dir/operator-api-keys.json" "$compose_keys"
  true
}
trap 'cleanup; durable_cleanup; compose_cleanup' EXIT
compose up -d > /tmp/linattn-compose-up.log 2>&1 || { tail -20 /tmp/linattn-compose-up.log; exit 1; }
proxy=127.0.0.1:50051
for _ in $(seq 1 120); do
  if "$client" health --server "$proxy" --timeout 1 >/dev/null 2>&1; then break; fi
  sleep 0.5
done
"$client" health --server "$proxy" || { compose logs 2>&1 | tail -40; exit 1; }
"$load_bin" --server "$proxy" --sessions 24 --steps 300 --session-prefix compose \
  --ledger "$compose_ledger" --failover --no-progress | tail -1
podman kill -s KILL "${project}_linattn-2_1" >/dev/null
"$load_bin" --server "$proxy" --sessions 24 --steps 300 --session-prefix compose \
  --ledger "$compose_ledger" --failover --no-progress | tail -1
"$load_bin" --server "$proxy" --check --ledger "$compose_ledger" | tail -2
compose_cleanup

# The Kubernetes base under `podman kube play`: what podman runs of it (the
# proxy's Deployment and ConfigMap, each StatefulSet's first pod with its
# claims: tests/deploy/podman_play.mjs) on one podman network, until the
# replica's pod reports SERVING with its sessions in the Redis pod and the
# proxy's pod runs HAProxy on its ConfigMap.
echo "container-check: deploy/k8s with podman kube play"
play_dir=$(mktemp -d)
play_net=linattn-play-$$
kubectl kustomize deploy/k8s > "$play_dir/k8s.yaml" 2>/dev/null
(cd tests/deploy && { [[ -d node_modules/yaml ]] || npm ci --no-audit --no-fund --silent; })
mkdir -p "$play_dir/api-keys"
cp "$keys_dir/api-keys.json" "$play_dir/api-keys/keys.json"
node tests/deploy/podman_play.mjs "$play_dir/k8s.yaml" \
  --secret "linattn-api-keys=$play_dir/api-keys" > "$play_dir/play.yaml"
play_cleanup() {
  podman kube down "$play_dir/play.yaml" >/dev/null 2>&1 || true
  podman volume rm -f data-redis >/dev/null 2>&1 || true
  podman volume ls -q | grep '^linattn-proxy-config-' | xargs -r podman volume rm -f >/dev/null 2>&1 || true
  podman network rm -f "$play_net" >/dev/null 2>&1 || true
  rm -rf "$play_dir"
}
trap 'cleanup; durable_cleanup; compose_cleanup; play_cleanup' EXIT
podman network create "$play_net" >/dev/null
podman kube play --network "$play_net" "$play_dir/play.yaml" > "$play_dir/play.log" 2>&1 || {
  cat "$play_dir/play.log"; exit 1; }
serving=0
for _ in $(seq 1 120); do
  if podman exec linattn-0-linattn linattn health --server 127.0.0.1:50051 >/dev/null 2>&1; then
    serving=1; break
  fi
  sleep 0.5
done
if ((serving == 0)); then
  podman logs linattn-0-linattn 2>&1 | tail -20; exit 1
fi
# (grep reads the whole log: `grep -q` would stop at its match, and under
# pipefail the writer's SIGPIPE would fail the check.)
podman logs linattn-0-linattn 2>&1 | grep "state store redis://redis:6379: replica" >/dev/null || {
  podman logs linattn-0-linattn 2>&1 | tail -20; exit 1; }
# Sessions through the replica's pod land in the Redis pod.
podman exec -e LINATTN_API_KEY linattn-0-linattn linattn-load --server 127.0.0.1:50051 --sessions 4 \
  --steps 100 --session-prefix play --no-progress | tail -1
[[ $(podman exec redis-redis redis-cli --raw exists 'la:s:{play-0}:meta' 'la:s:{play-3}:meta') == 2 ]] || {
  echo "the sessions are not in the Redis pod"; exit 1; }
proxy_ctr=$(podman ps --filter "label=app.kubernetes.io/name=linattn-proxy" --format '{{.Names}}' | head -1)
[[ -n "$proxy_ctr" ]] || proxy_ctr=$(podman ps --format '{{.Names}}' | grep -m1 '^linattn-proxy.*-haproxy$' || true)
[[ -n "$proxy_ctr" ]] && [[ $(podman inspect -f '{{.State.Running}}' "$proxy_ctr") == true ]] || {
  podman ps -a; exit 1; }
[[ $(podman exec linattn-0-linattn id -u) == 10001 ]] || { echo "the replica's pod runs as another user"; exit 1; }
play_cleanup
echo "container-check: OK (refuses to serve 0.0.0.0 without keys, keys from a mounted file, healthy, non-root, attend --server matches the local recurrent result, generate matches the host's server, sessions in a volume survive SIGKILL and SIGTERM, three replicas behind HAProxy with Redis lose nothing when one is killed, the Kubernetes base's pods run under podman kube play)"
