#!/usr/bin/env bash
# /metrics and the access log of a real linattn-server on 127.0.0.1, read
# by the real tools:
#   - promtool check metrics accepts the exposition (after gRPC calls, HTTP
#     requests, a streamed completion, attention decode steps);
#   - deploy/prometheus/rules.yml passes promtool check rules and its unit
#     tests (rules_test.yml);
#   - Debian's Prometheus, started here with those rules, scrapes the
#     server and answers queries about it (requests by method and code, a
#     recording rule evaluated);
#   - every line of --log-json is one JSON object, access lines included,
#     with their fields, whatever a request's path holds;
#   - --metrics-listen serves /metrics with the HTTP listener off.
#
#   tests/observability/run_prometheus.sh SERVER_BINARY CLI_BINARY
set -euo pipefail

server=$1
cli=$2
here=$(cd "$(dirname "$0")" && pwd)
rules=$here/../../deploy/prometheus
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

wait_for_file() {  # FILE PID
  for _ in $(seq 400); do
    [[ -s $1 ]] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

echo "== the rules"
promtool check rules "$rules/rules.yml"
(cd "$rules" && promtool test rules rules_test.yml)

echo "== a server with --log-json"
"$server" --listen 127.0.0.1:0 --port-file "$work/port" \
  --http-listen 127.0.0.1:0 --http-port-file "$work/http_port" \
  --log-json > "$work/server.log" 2>&1 &
pids+=($!)
wait_for_file "$work/http_port" "${pids[0]}" || { cat "$work/server.log"; exit 1; }
wait_for_file "$work/port" "${pids[0]}"
grpc=127.0.0.1:$(cat "$work/port")
http=http://127.0.0.1:$(cat "$work/http_port")

# Work of every kind: a generation over gRPC, a streamed completion over
# HTTP, attention decode steps, a refused request, a hostile path.
"$cli" generate --server "$grpc" --max-tokens 6 --seed 1 "And God said" > /dev/null
curl -sS -o /dev/null -H 'Content-Type: application/json' \
  -d '{"prompt":"In the beginning","max_tokens":5,"stream":true}' "$http/v1/completions"
/usr/bin/python3 - "$work" <<'PY'
import numpy as np, sys
rng = np.random.default_rng(0)
for name, shape in (("q", (8, 2, 4)), ("k", (8, 2, 4)), ("v", (8, 2, 3))):
    np.save(f"{sys.argv[1]}/{name}.npy", rng.standard_normal(shape).astype(np.float32))
PY
"$cli" attend --q "$work/q.npy" --k "$work/k.npy" --v "$work/v.npy" \
  --out "$work/y.npy" --mode decode --server "$grpc"
code=$(curl -sS -o /dev/null -w '%{http_code}' "$http/v1/sessions/nobody")
[[ $code == 404 ]]
curl -sS -o /dev/null "$http/v1/sessions/a%22b%0Ac%5C%FF%00d" || true

curl -sS "$http/metrics" > "$work/metrics.txt"
promtool check metrics < "$work/metrics.txt"
/usr/bin/python3 - "$work/metrics.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def value(pattern):
    m = re.search(r"^" + pattern + r" (\S+)$", text, re.M)
    assert m, f"no sample {pattern}"
    return float(m.group(1))
assert value(r'linattn_requests_total\{code="OK",method="Generate",service="GenerationService"\}') == 1
assert value(r'linattn_requests_total\{code="OK",method="Decode",service="AttentionService"\}') == 1
assert value(r'linattn_requests_total\{code="200",method="POST /v1/completions",service="http"\}') == 1
assert value(r'linattn_requests_total\{code="404",method="GET /v1/sessions/\{id\}",service="http"\}') >= 1
assert value(r"linattn_decode_step_seconds_count") == 8
assert value(r"linattn_time_to_first_token_seconds_count") == 2
assert value(r"linattn_time_between_tokens_seconds_count") == 5 + 4
assert value(r'linattn_decode_tokens_total\{service="attention"\}') == 8
assert value(r'linattn_decode_tokens_total\{service="generation"\}') == 11
for name in ("linattn_num_requests_waiting", "linattn_num_requests_running",
             "linattn_kv_cache_usage_perc", "linattn_state_budget_bytes"):
    value(name)
print("metrics: the samples agree with the work done")
PY

echo "== Prometheus scrapes it"
prom_port=$(free_port)
target=${http#http://}
cat > "$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $rules/rules.yml
scrape_configs:
  - job_name: linattn
    static_configs:
      - targets: ["$target"]
YML
promtool check config "$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" \
  --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" \
  > "$work/prometheus.log" 2>&1 &
pids+=($!)
/usr/bin/python3 - "$prom_port" "$target" <<'PY'
import json, sys, time, urllib.parse, urllib.request
port, target = sys.argv[1], sys.argv[2]
def query(q):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]
deadline = time.time() + 60
while True:
    try:
        up = query('up{job="linattn"}')
        gen = query('sum(linattn_requests_total{job="linattn",method="Generate",code="OK"})')
        rule = query('linattn:decode_tokens:rate1m{service="generation"}')
        if up and up[0]["value"][1] == "1" and gen and rule:
            break
    except OSError:
        pass
    if time.time() > deadline:
        raise SystemExit("Prometheus did not scrape the server in 60 s")
    time.sleep(0.5)
assert up[0]["metric"]["instance"] == target, up
assert float(gen[0]["value"][1]) == 1, gen
with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5) as r:
    groups = json.load(r)["data"]["groups"]
bad = [rule["name"] for g in groups for rule in g["rules"] if rule.get("health") not in ("ok", "unknown")]
assert not bad, bad
print("prometheus: up = 1, Generate calls = 1, recording rules healthy")
PY

echo "== the log"
kill -TERM "${pids[0]}"
wait "${pids[0]}" || true
/usr/bin/python3 - "$work/server.log" "$here/../../models/tiny/tokenizer.model" <<'PY'
import json, sys
import sentencepiece
access, other = [], []
for n, line in enumerate(open(sys.argv[1], encoding="utf-8"), 1):
    record = json.loads(line)  # every line is one JSON object
    assert isinstance(record, dict), line
    (access if record.get("logger") == "access" else other).append(record)
assert any("stopped:" in r["msg"] and "gRPC" in r["msg"] and "HTTP" in r["msg"] for r in other), other[-1]
fields = {"time", "level", "protocol", "method", "session", "tenant", "status",
          "code", "latency_ms", "tokens_in", "tokens_out", "peer"}
for r in access:
    assert fields <= set(r), r
gen = [r for r in access if r["method"] == "linattn.v1.GenerationService/Generate"]
# tokens_in: what the built-in model's tokenizer makes of "And God said".
prompt = len(sentencepiece.SentencePieceProcessor(model_file=sys.argv[2]).encode("And God said"))
assert len(gen) == 1 and gen[0]["tokens_in"] == prompt and gen[0]["tokens_out"] == 6, gen
assert gen[0]["session"], gen
completion = [r for r in access if r["method"] == "POST /v1/completions"]
assert completion[0]["status"] == "200" and completion[0]["tokens_out"] == 5, completion
decode = [r for r in access if r["method"].endswith("/Decode")]
assert decode[0]["tokens_in"] == 8, decode
hostile = [r for r in access if r["method"].startswith("GET /v1/sessions/a")]
assert hostile and '"' in hostile[0]["method"] and "\n" in hostile[0]["method"], hostile
print(f"log: {len(access)} access lines and {len(other)} others, all JSON")
PY
pids=("${pids[@]:1}")

echo "== --metrics-listen with the HTTP listener off"
metrics_port=$(free_port)
"$server" --listen 127.0.0.1:0 --port-file "$work/port2" --http-listen none \
  --metrics-listen "127.0.0.1:$metrics_port" --log-level warn --model none \
  > "$work/server2.log" 2>&1 &
pids+=($!)
wait_for_file "$work/port2" "${pids[-1]}" || { cat "$work/server2.log"; exit 1; }
curl -sS "http://127.0.0.1:$metrics_port/metrics" > "$work/metrics2.txt"
promtool check metrics < "$work/metrics2.txt"
grep -q '^linattn_sessions{kind="attention"} 0' "$work/metrics2.txt"
code=$(curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$metrics_port/v1/models")
[[ $code == 404 ]]
echo "all observability checks passed"
