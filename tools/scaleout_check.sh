#!/usr/bin/env bash
# Replicas behind HAProxy with their sessions in Redis, checked from outside
# in one command:
#
#   tools/scaleout_check.sh [--sessions N] [--bin DIR] [--phases LIST]
#                           [--keep]
#
# Starts redis-server (AOF on, fsync always), three linattn-server replicas
# with --state-store and their HAProxy agents, and HAProxy with
# deploy/haproxy/haproxy.cfg, all on 127.0.0.1 in a temporary directory.
# Then, each with linattn-load through the proxy (sessions named sc-0 …
# sc-(N-1), Decode streams, --failover) and `linattn-load --check` after it
# (every session at least at its acknowledged position, its state equal bit
# for bit to a local step-by-step recomputation):
#   load      a run with output verification
#   kill      kill -9 of one replica mid-run; it is started again after
#   stop      SIGSTOP of one replica past its lease while another client
#             continues its sessions on another replica, then SIGCONT: its
#             late writes must be refused (fenced) and nothing may fork
#   redis     Redis shut down mid-run and started again
#   rolling   every replica restarted in turn (SIGTERM, start) under load
#   ring      one replica stopped (SIGTERM), then started again: only the
#             sessions it held move (to the others, then back to it); every
#             other session stays with the replica that held it
# Exit status 0 only if every check passed. Everything stops by itself:
# each load run is bounded by --duration, and every process started here is
# killed on exit.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$here/build/bin"
sessions=24
phases="load kill stop redis rolling ring"
keep=0
lease_ms=1000
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sessions) sessions="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --phases) phases="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "scaleout_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in redis-server redis-cli haproxy; do
  if ! command -v "$tool" >/dev/null; then
    echo "scaleout_check: $tool is missing (scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
done

work="$(mktemp -d /tmp/linattn-scaleout.XXXXXX)"
ledger="$work/ledger.json"
declare -a pids=("" "" "" "")
redis_pid=""
proxy_pid=""
cleanup() {
  for p in "${pids[@]}" "$redis_pid" "$proxy_pid"; do
    if [[ -n "$p" ]]; then kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; fi
  done
  if [[ "$keep" == 0 ]]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT

fail() {
  echo "scaleout_check: FAILED: $*" >&2
  for f in "$work"/*.log; do echo "== $f" >&2; tail -15 "$f" >&2; done
  exit 1
}

# Free loopback ports, chosen once: the proxy's configuration names them.
read -r -a ports <<< "$(/usr/bin/python3 - <<'EOF'
import socket
socks = []
for _ in range(8):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)"
redis_port=${ports[0]}
proxy_port=${ports[1]}
grpc_port=("" "${ports[2]}" "${ports[3]}" "${ports[4]}")
agent_port=("" "${ports[5]}" "${ports[6]}" "${ports[7]}")
proxy="127.0.0.1:$proxy_port"

start_redis() {
  redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work" \
    --appendonly yes --appendfsync always --save "" \
    >>"$work/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 1 100); do
    if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then return 0; fi
    sleep 0.05
  done
  fail "redis did not start"
}

start_replica() {
  local i=$1
  "$bin/linattn-server" --listen "127.0.0.1:${grpc_port[$i]}" --http-listen none \
    --state-store "redis://127.0.0.1:$redis_port" --replica-name "r$i" \
    --lease-ms "$lease_ms" --haproxy-agent-listen "127.0.0.1:${agent_port[$i]}" \
    --model none --grace-period 5 >>"$work/replica$i.log" 2>&1 &
  pids[$i]=$!
  for _ in $(seq 1 300); do
    if "$bin/linattn" health --server "127.0.0.1:${grpc_port[$i]}" >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "${pids[$i]}" 2>/dev/null || fail "replica $i did not start"
    sleep 0.1
  done
  fail "replica $i did not become healthy"
}

start_proxy() {
  LINATTN_PROXY_BIND="127.0.0.1:$proxy_port" \
  LINATTN_1="127.0.0.1:${grpc_port[1]}" LINATTN_1_AGENT="${agent_port[1]}" \
  LINATTN_2="127.0.0.1:${grpc_port[2]}" LINATTN_2_AGENT="${agent_port[2]}" \
  LINATTN_3="127.0.0.1:${grpc_port[3]}" LINATTN_3_AGENT="${agent_port[3]}" \
    haproxy -db -f "$here/deploy/haproxy/haproxy.cfg" >>"$work/haproxy.log" 2>&1 &
  proxy_pid=$!
  for _ in $(seq 1 100); do
    if "$bin/linattn" health --server "$proxy" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  fail "haproxy did not start"
}

# linattn-load through the proxy, continuing the sessions; extra arguments
# follow. Its summary goes to $work/<name>.txt.
load() {
  local name=$1
  shift
  "$bin/linattn-load" --server "$proxy" --sessions "$sessions" \
    --session-prefix sc --ledger "$ledger" --failover --no-progress "$@" \
    > "$work/$name.txt" 2>&1
}

check() {
  local name=$1 target=${2:-$proxy}
  if ! "$bin/linattn-load" --server "$target" --check --ledger "$ledger" \
      > "$work/check-$name.txt" 2>&1; then
    cat "$work/check-$name.txt" >&2
    fail "the check after '$name'"
  fi
  echo "$name: $(grep -m1 '^checked' "$work/check-$name.txt")"
}

expect_ok() {
  local name=$1
  if ! tail -1 "$work/$name.txt" | grep -q '^OK'; then
    cat "$work/$name.txt" >&2
    fail "linattn-load in '$name'"
  fi
  echo "$name: $(grep -m1 '^steps:' "$work/$name.txt")"
  grep -m1 '^failover:' "$work/$name.txt" || true
}

start_redis
for i in 1 2 3; do start_replica "$i"; done
start_proxy

for phase in $phases; do
  case "$phase" in
    load)
      load load --steps 200 --verify "$sessions" --duration 60
      expect_ok load
      check load
      ;;
    kill)
      load kill --steps 100000 --duration 4 &
      loader=$!
      sleep 1.5
      kill -9 "${pids[2]}"
      wait "${pids[2]}" 2>/dev/null || true
      pids[2]=""
      wait "$loader" || true
      expect_ok kill
      check kill
      start_replica 2
      ;;
    stop)
      load stop --steps 100000 --duration 6 &
      loader=$!
      sleep 1
      kill -STOP "${pids[1]}"
      # Past the lease, another client continues the sessions replica 1
      # held, directly on replica 3, which takes them over.
      sleep "$(/usr/bin/python3 -c "print($lease_ms / 1000 + 0.5)")"
      held=""
      for s in $(seq 0 $((sessions - 1))); do
        owner="$(redis-cli -p "$redis_port" hget "la:s:{sc-$s}:meta" owner)"
        if [[ "$owner" == r1-* ]]; then held="$held${held:+,}$s"; fi
      done
      [[ -n "$held" ]] || fail "replica 1 held none of the sessions"
      "$bin/linattn-load" --server "127.0.0.1:${grpc_port[3]}" --only "$held" \
        --session-prefix sc --ledger "$ledger" --failover --no-progress \
        --steps 5 --duration 20 > "$work/stop-other.txt" 2>&1 || true
      expect_ok stop-other
      kill -CONT "${pids[1]}"
      wait "$loader" || true
      expect_ok stop
      check stop
      # Replica 1 came back to sessions another replica had taken: its
      # heartbeat let them go, or their writes were refused.
      grep -q -e "taken over by other replicas" -e "taken over by another replica" \
        "$work/replica1.log" \
        || fail "replica 1 did not notice that its sessions were taken over"
      ;;
    redis)
      load redis --steps 100000 --duration 6 &
      loader=$!
      sleep 1.5
      redis-cli -p "$redis_port" shutdown >/dev/null 2>&1 || true
      wait "$redis_pid" 2>/dev/null || true
      sleep 1
      start_redis
      wait "$loader" || true
      expect_ok redis
      check redis
      ;;
    rolling)
      load rolling --steps 100000 --duration 15 &
      loader=$!
      sleep 1
      for i in 1 2 3; do
        kill -TERM "${pids[$i]}"
        wait "${pids[$i]}" || fail "replica $i did not drain cleanly"
        pids[$i]=""
        start_replica "$i"
        sleep 1
      done
      wait "$loader" || true
      expect_ok rolling
      check rolling
      ;;
    ring)
      # Which replica holds each session (by name: r1, r2, r3), as Redis
      # records it, after every session was used.
      owners() {
        for s in $(seq 0 $((sessions - 1))); do
          redis-cli -p "$redis_port" hget "la:s:{sc-$s}:meta" owner | cut -d- -f1
        done
      }
      load ring-0 --steps 20 --duration 30
      expect_ok ring-0
      before=($(owners))
      kill -TERM "${pids[3]}"
      wait "${pids[3]}" || fail "replica 3 did not drain cleanly"
      pids[3]=""
      sleep 1  # HAProxy's checks take it out of the ring
      load ring-1 --steps 20 --duration 30
      expect_ok ring-1
      without=($(owners))
      start_replica 3
      sleep 1.5  # and back in
      load ring-2 --steps 20 --duration 30
      expect_ok ring-2
      after=($(owners))
      moved=0
      for s in $(seq 0 $((sessions - 1))); do
        if [[ "${before[$s]}" != r3 && "${without[$s]}" != "${before[$s]}" ]]; then
          fail "session sc-$s moved from ${before[$s]} to ${without[$s]} when r3 left"
        fi
        [[ "${without[$s]}" != r3 ]] || fail "session sc-$s stayed with the stopped r3"
        [[ "${after[$s]}" == "${before[$s]}" ]] \
          || fail "session sc-$s is on ${after[$s]} after r3 came back, was on ${before[$s]}"
        [[ "${before[$s]}" != r3 ]] || moved=$((moved + 1))
      done
      ((moved > 0)) || fail "r3 held none of the sessions"
      echo "ring: r3 left and came back: its $moved session(s) moved, the other $((sessions - moved)) stayed"
      check ring
      ;;
    *) fail "unknown phase $phase" ;;
  esac
done
echo "OK"
