#!/usr/bin/env bash
# The kill -9 check of durable sessions, in one command:
#
#   tools/crash_check.sh [--rounds N] [--sessions N] [--durability MODE]
#                        [--bin DIR] [--keep]
#
# Each round starts linattn-server with --state-dir on 127.0.0.1, checks
# that every session it recovered is at least at its last acknowledged step
# and holds exactly the state of a local step-by-step recomputation
# (linattn-load --check), runs linattn-load against it (sessions named
# crash-0 … crash-(N-1), continued from wherever they are, Decode streams
# and DecodeBatch groups on alternate rounds), and kills the server with
# SIGKILL at a random moment mid-run. After the last round it stops the
# server with SIGTERM (which writes every session's snapshot file), starts
# it again, and checks once more. Exit status 0 only if every check passed.
# Everything runs on loopback and in a temporary directory, and stops by
# itself: each load run is bounded by --duration.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$here/build/bin"
rounds=5
sessions=32
durability=always
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --sessions) sessions="$2"; shift 2 ;;
    --durability) durability="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "crash_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

work="$(mktemp -d /tmp/linattn-crash.XXXXXX)"
state="$work/state"
ledger="$work/ledger.json"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then kill -9 "$server_pid" 2>/dev/null || true; fi
  if [[ "$keep" == 0 ]]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT

start_server() {
  rm -f "$work/port"
  "$bin/linattn-server" --listen 127.0.0.1:0 --port-file "$work/port" --http-listen none \
    --state-dir "$state" --durability "$durability" --model none \
    >>"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 600); do
    if [[ -s "$work/port" ]]; then port="$(cat "$work/port")"; return 0; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "crash_check: the server did not start:" >&2
      tail -20 "$work/server.log" >&2
      exit 1
    fi
    sleep 0.05
  done
  echo "crash_check: the server did not start within 30 s" >&2
  exit 1
}

# The sum of the server's session positions (0 when it lists none).
positions() {
  "$bin/linattn" sessions list --server "127.0.0.1:$port" 2>/dev/null |
    awk '{ sum += $4 } END { print sum + 0 }'
}

# Waits (up to 30 s) until the positions move past where they stood.
wait_for_steps() {
  local before
  before="$(positions)"
  for _ in $(seq 1 600); do
    if (( $(positions) > before )); then return 0; fi
    if ! kill -0 "$load_pid" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "crash_check: the load did not start stepping within 30 s" >&2
  exit 1
}

check() {
  if [[ ! -s "$ledger" ]]; then return 0; fi
  if ! "$bin/linattn-load" --server "127.0.0.1:$port" --check \
      --ledger "$ledger" > "$work/check.txt"; then
    cat "$work/check.txt" >&2
    echo "crash_check: FAILED after round $1" >&2
    exit 1
  fi
  echo "round $1: $(tail -2 "$work/check.txt" | head -1)"
}

for round in $(seq 1 "$rounds"); do
  start_server
  check "$((round - 1))"
  batch=0
  if (( round % 2 == 0 )); then batch=4; fi
  "$bin/linattn-load" --server "127.0.0.1:$port" --sessions "$sessions" \
    --steps 1000000 --duration 20 --batch "$batch" --verify 4 \
    --session-prefix crash --ledger "$ledger" --no-progress \
    > "$work/load.txt" 2>&1 &
  load_pid=$!
  # Once the load is stepping (its sessions' positions move: a busy machine
  # can take longer than the delay below to start a client), somewhere
  # between 0.3 and 2.3 s into the run.
  wait_for_steps
  sleep "$(( RANDOM % 2000 / 1000 )).$(( RANDOM % 1000 + 300 ))"
  kill -9 "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  # The load ends with the server's streams (UNAVAILABLE), writing the
  # acknowledged positions to the ledger.
  wait "$load_pid" || true
  if ! grep -q "^steps:" "$work/load.txt"; then
    cat "$work/load.txt" >&2
    echo "crash_check: linattn-load did not finish its run" >&2
    exit 1
  fi
done

start_server
check "$rounds"
kill -TERM "$server_pid"
wait "$server_pid" || { echo "crash_check: the drain failed" >&2; exit 1; }
server_pid=""
start_server
check "$rounds (after SIGTERM and a restart)"
grep "recovered" "$work/server.log" | tail -1 | sed 's/^.*\] //'
echo "OK"
