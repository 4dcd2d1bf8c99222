#!/usr/bin/env bash
# The HTTP listener through clients nobody here wrote, against a real
# linattn-server on 127.0.0.1 (ephemeral ports):
#   - the official OpenAI JavaScript client (openai_client.mjs);
#   - curl, reading the raw Server-Sent Events of a streamed completion;
#   - the explorer page in Debian's headless Chromium through playwright-core
#     (explorer.mjs), saving screenshots into OUT_DIR.
#
#   tests/http/run_clients.sh SERVER_BINARY OUT_DIR
set -euo pipefail

server=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
work=$(mktemp -d)
pid=""
tools_pid=""
tls_pid=""
cleanup() {
  for p in $pid $tools_pid $tls_pid; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

wait_for_port() {  # PORT_FILE PID LOG: until the server wrote its port
  for _ in $(seq 200); do
    [[ -s $1 ]] && return 0
    kill -0 "$2" 2>/dev/null || { cat "$3"; exit 1; }
    sleep 0.05
  done
  cat "$3"; exit 1
}

# The npm packages, pinned by package-lock.json.
(cd "$here" && { [[ -d node_modules/openai && -d node_modules/playwright-core ]] ||
  npm ci --no-audit --no-fund --silent; })

"$server" --listen 127.0.0.1:0 --port-file "$work/port" \
  --http-listen 127.0.0.1:0 --http-port-file "$work/http_port" \
  --log-level warn > "$out/server.log" 2>&1 &
pid=$!
wait_for_port "$work/http_port" "$pid" "$out/server.log"
base="http://127.0.0.1:$(cat "$work/http_port")"
echo "server: $base"

echo "== the official OpenAI client (npm openai)"
timeout 120 node "$here/openai_client.mjs" "$base"

echo "== raw Server-Sent Events through curl"
curl -sS -N --max-time 30 -D "$work/headers" -o "$work/events" \
  -H 'Content-Type: application/json' \
  -d '{"prompt": "And God said", "max_tokens": 16, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' \
  "$base/v1/completions"
/usr/bin/python3 - "$work/headers" "$work/events" <<'PY'
import json, sys
headers = open(sys.argv[1], encoding="latin-1").read().lower()
assert "content-type: text/event-stream" in headers, headers
assert "transfer-encoding: chunked" in headers, headers
raw = open(sys.argv[2], encoding="utf-8").read()
# Every event is one "data: ..." line followed by a blank line.
events = raw.split("\n\n")
assert events[-1] == "", repr(raw[-40:])
events = events[:-1]
assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
payloads = [e[len("data: "):] for e in events]
assert payloads[-1] == "[DONE]", payloads[-1]
chunks = [json.loads(p) for p in payloads[:-1]]
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
usage = chunks[-1]["usage"]
assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 16, chunks[-1]
assert all(c["object"] == "text_completion" for c in chunks)
reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
assert reasons[-1] == "length" and all(r is None for r in reasons[:-1]), reasons
print(f"ok    {len(events)} events, text {text!r}, then usage and [DONE]")
PY
# The whole completion says the same.
whole=$(curl -sS --max-time 30 -H 'Content-Type: application/json' \
  -d '{"prompt": "And God said", "max_tokens": 16, "temperature": 0}' \
  "$base/v1/completions")
/usr/bin/python3 - "$work/events" "$whole" <<'PY'
import json, sys
chunks = [json.loads(e[6:]) for e in open(sys.argv[1]).read().split("\n\n") if e.startswith("data: {")]
streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
assert streamed == json.loads(sys.argv[2])["choices"][0]["text"], (streamed, sys.argv[2])
print("ok    the streamed text is the whole completion's")
PY

echo "== tool calls through the official OpenAI client"
/usr/bin/python3 "$here/make_tool_model.py" "$work/tools"
"$server" --model "$work/tools" --listen 127.0.0.1:0 --port-file "$work/tools_port" \
  --http-listen 127.0.0.1:0 --http-port-file "$work/tools_http_port" \
  --log-level warn > "$out/tools_server.log" 2>&1 &
tools_pid=$!
wait_for_port "$work/tools_http_port" "$tools_pid" "$out/tools_server.log"
timeout 90 node "$here/openai_tools.mjs" \
  "http://127.0.0.1:$(cat "$work/tools_http_port")" "$work/follow_up.json"
kill -TERM "$tools_pid"; wait "$tools_pid" || true
# The follow-up's prompt, as transformers renders it (python3-jinja2,
# configured as tests/chat/render_reference.py configures it, with the
# call's arguments as the object transformers' templates expect) and as
# the model's tokenizer splits it (bytes, and its three added tokens whole):
# as many tokens as the server counted.
/usr/bin/python3 "$here/check_tool_prompt.py" "$work/follow_up.json" "$work/tools"

echo "== the explorer page in headless Chromium"
timeout 120 node "$here/explorer.mjs" "$base" "$out"
ls "$out"/*.png

echo "== the OpenAI client over TLS with an API key"
bash "$here/../tls/make_certs.sh" "$work/certs"
key=$(openssl rand -hex 24)
printf '{"keys": [{"sha256": "%s", "tenant": "node"}]}\n' \
  "$(printf %s "$key" | sha256sum | cut -d' ' -f1)" > "$work/keys.json"
"$server" --listen 127.0.0.1:0 --port-file "$work/tls_port" \
  --http-listen 127.0.0.1:0 --http-port-file "$work/tls_http_port" \
  --tls-cert "$work/certs/server.pem" --tls-key "$work/certs/server.key" \
  --api-keys "$work/keys.json" --log-level warn > "$out/tls_server.log" 2>&1 &
tls_pid=$!
wait_for_port "$work/tls_http_port" "$tls_pid" "$out/tls_server.log"
tls_base="https://127.0.0.1:$(cat "$work/tls_http_port")"
NODE_EXTRA_CA_CERTS="$work/certs/ca.pem" timeout 90 \
  node "$here/openai_tls.mjs" "$tls_base" "$key"
# Plain HTTP to the TLS listener gets no answer.
if curl -sS --max-time 5 -o /dev/null "http://127.0.0.1:$(cat "$work/tls_http_port")/health" 2>/dev/null; then
  echo "FAIL: the TLS listener answered plain HTTP"; exit 1
fi
echo "ok    plain HTTP to the TLS listener is refused"
kill -TERM "$tls_pid"; wait "$tls_pid" || true
