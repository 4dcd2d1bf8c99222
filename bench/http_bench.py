#!/usr/bin/python3
"""The HTTP listener against gRPC, and a stored response's state against resending.

    /usr/bin/python3 bench/http_bench.py [--build build] [--quick]

Starts build/bin/linattn-server (built-in model) with gRPC and HTTP on
ephemeral loopback ports and measures:

  streaming     tokens/s of one generation streamed by Server-Sent Events
                (POST /v1/completions, stream: true) and by gRPC Generate,
                alone and 32 at once (aggregate); Python clients for both
                (http.client reading the event stream, Debian's grpcio),
                sharing the machine's cores with the server
  follow-up     time to first token of a reply after a 32k-token
                conversation: POST /v1/responses with previous_response_id
                (the stored state is forked, only the new turn is
                prefilled) against the same conversation resent whole
                (median of runs; a one-token reply, so the time is the
                prefill and one step)

Prints JSON; bench/compare puts it in its report.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import durability_bench  # noqa: E402  (generate_protos)

PROMPT = "In the beginning God created the heaven and the earth. "


def start_server(build):
    work = tempfile.mkdtemp(prefix="linattn_http_bench_")
    grpc_file, http_file = os.path.join(work, "port"), os.path.join(work, "http_port")
    proc = subprocess.Popen([f"{build}/bin/linattn-server", "--listen", "127.0.0.1:0",
                             "--port-file", grpc_file, "--http-listen", "127.0.0.1:0",
                             "--http-port-file", http_file, "--log-level", "warn"])
    for _ in range(400):
        if os.path.exists(grpc_file) and open(grpc_file).read().strip():
            return proc, (f"127.0.0.1:{open(grpc_file).read().strip()}",
                          int(open(http_file).read().strip()))
        time.sleep(0.05)
    proc.kill()
    sys.exit("linattn-server did not start")


def post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    if r.status != 200:
        sys.exit(f"{path}: HTTP {r.status}: {data[:300]}")
    return json.loads(data)


def http_stream(port, tokens, seed):
    """Tokens of one streamed completion and its seconds."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps({
        "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.8, "seed": seed,
        "stream": True, "stream_options": {"include_usage": True}}),
        {"Content-Type": "application/json"})
    r = conn.getresponse()
    got = 0
    for line in r:
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                got = chunk["usage"]["completion_tokens"]
    conn.close()
    return got, time.perf_counter() - start


def grpc_stream(mods, address, tokens, seed):
    grpc, g, gg = mods
    start = time.perf_counter()
    with grpc.insecure_channel(address) as channel:
        stub = gg.GenerationServiceStub(channel)
        sid = stub.CreateSession(g.CreateModelSessionRequest()).session_id
        got = 0
        for m in stub.Generate(g.GenerateRequest(
                session_id=sid, prompt=PROMPT,
                sampling=g.SamplingParams(max_tokens=tokens, temperature=0.8, seed=seed))):
            if m.token_id >= 0:
                got += 1
        stub.DeleteSession(g.DeleteModelSessionRequest(session_id=sid))
    return got, time.perf_counter() - start


def rate(fn, streams, tokens):
    """Aggregate tokens/s of `streams` concurrent runs of fn(tokens, seed)."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda i: fn(tokens, i + 1), range(streams)))
    wall = time.perf_counter() - start
    total = sum(n for n, _ in results)
    if total != streams * tokens:
        sys.exit(f"expected {streams * tokens} tokens, got {total}")
    return total / wall


def followup(port, conversation_tokens, runs):
    """A reply's time after a long conversation: stored state vs resent."""
    long_input = (PROMPT * (conversation_tokens // len(PROMPT) + 1))[:conversation_tokens]
    first = post(port, "/v1/responses", {"input": long_input, "max_output_tokens": 16,
                                         "temperature": 0})
    reply = first["output"][0]["content"][0]["text"]
    turn = "And then?"

    def timed(body):
        start = time.perf_counter()
        r = post(port, "/v1/responses", body)
        return time.perf_counter() - start, r["usage"]

    stored, resent = [], []
    for _ in range(runs):
        t, usage = timed({"previous_response_id": first["id"], "input": turn,
                          "max_output_tokens": 1, "temperature": 0, "store": False})
        stored.append(t)
        stored_usage = usage
        t, usage = timed({"input": [{"role": "user", "content": long_input},
                                    {"role": "assistant", "content": reply},
                                    {"role": "user", "content": turn}],
                          "max_output_tokens": 1, "temperature": 0, "store": False})
        resent.append(t)
        resent_usage = usage
    # The same conversation either way. The stored session holds the reply
    # as the ids it was generated as; resent, the reply's text is tokenized
    # again, joined to the template around it. With a byte tokenizer the
    # counts are equal; a subword tokenizer may spell the reply and the
    # pieces at its joins differently, by at most one token per byte there.
    # The check is that no turn went missing, which would change the count
    # by hundreds.
    allowed = max(first["usage"]["output_tokens"], len(reply.encode())) + len(turn) + 2
    if abs(stored_usage["input_tokens"] - resent_usage["input_tokens"]) > allowed:
        sys.exit(f"the follow-up and the resent conversation differ by more than {allowed} "
                 f"tokens: {stored_usage} vs {resent_usage}")
    return {"conversation_tokens": first["usage"]["input_tokens"] + first["usage"]["output_tokens"],
            "stored_seconds": statistics.median(stored),
            "resent_seconds": statistics.median(resent),
            "stored_usage": stored_usage, "resent_usage": resent_usage,
            "ratio": statistics.median(resent) / statistics.median(stored)}


def measure(build, quick):
    work = tempfile.mkdtemp(prefix="linattn_http_bench_gen_")
    mods = durability_bench.grpc_modules(work)
    proc, (address, port) = start_server(build)
    try:
        one_tokens = 256 if quick else 2048
        many_tokens = 32 if quick else 256
        out = {"one_stream_tokens": one_tokens, "streams_32_tokens_each": many_tokens}
        out["http_1"] = rate(lambda n, s: http_stream(port, n, s), 1, one_tokens)
        out["grpc_1"] = rate(lambda n, s: grpc_stream(mods, address, n, s), 1, one_tokens)
        out["http_32"] = rate(lambda n, s: http_stream(port, n, s), 32, many_tokens)
        out["grpc_32"] = rate(lambda n, s: grpc_stream(mods, address, n, s), 32, many_tokens)
        out["followup"] = followup(port, 4096 if quick else 32768, 3 if quick else 5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(json.dumps(measure(args.build, args.quick), indent=2))


if __name__ == "__main__":
    main()
