#!/usr/bin/python3
"""Server-side decode and prefill throughput against the in-process engine.

    /usr/bin/python3 bench/server_bench.py [--build build] [--steps 400]

Starts build/bin/linattn-server on an ephemeral loopback port, drives it with
build/bin/linattn-load (closed loop, H = 8, d = 64) at 1, 16, 64 and 256
concurrent sessions and with batches of prefilling sessions, runs the
in-process batched step (attention_benchmark BM_DecodeStep) at the same batch
sizes, and prints one Markdown table with the ratio server / in-process.
Client and server share the machine's cores. Standard library only.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def start_server(build, *extra, unix_path=None):
    """A loopback server on a free port, or on the unix socket `unix_path`;
    (process, address for --server)."""
    port_file = tempfile.mktemp(prefix="linattn_port_")
    listen = f"unix:{unix_path}" if unix_path else "127.0.0.1:0"
    proc = subprocess.Popen([f"{build}/bin/linattn-server", "--listen", listen, "--http-listen", "none",
                             "--port-file", port_file, "--log-level", "warn", *extra])
    for _ in range(200):
        if os.path.exists(port_file) and open(port_file).read().strip():
            port = open(port_file).read().strip()
            os.remove(port_file)
            return proc, listen if unix_path else f"127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    sys.exit("linattn-server did not start")


def load(build, server, sessions, steps, prefill=0, batch=0, concurrency=0,
         shared_memory=False):
    """linattn-load's JSON summary; batch > 1: DecodeBatch groups of `batch`;
    concurrency > 0: at most that many sessions' streams at once;
    shared_memory: prefills' tensors through memfds (a unix-socket server
    started with --shared-memory)."""
    out = subprocess.run([f"{build}/bin/linattn-load", "--server", server, "--sessions",
                          str(sessions), "--steps", str(steps), "--prefill", str(prefill),
                          "--batch", str(batch), "--concurrency", str(concurrency),
                          "--heads", "8", "--dim", "64", "--json",
                          "--no-progress", "--duration", "120"]
                         + (["--shared-memory"] if shared_memory else []),
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"linattn-load failed: {out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def in_process(build, batches):
    flt = "BM_DecodeStep/64/(%s)/" % "|".join(map(str, batches))
    out = subprocess.run([f"{build}/bin/attention_benchmark", f"--benchmark_filter={flt}",
                          "--benchmark_format=json"], capture_output=True, text=True, check=True)
    rates = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        B = int(b["name"].split("/")[2])
        rates[B] = 1e6 / b["us_per_session_step"]
    return rates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    batches = [1, 16, 64, 256]
    engine = in_process(args.build, batches)
    proc, server = start_server(args.build)
    try:
        print("Decode, H = 8, d = 64, closed loop (one Decode stream per session)\n")
        print("| sessions | server steps/s | p50 | p90 | p99 | max | in-process steps/s (same B) | server / in-process |")
        print("|---|---|---|---|---|---|---|---|")
        for n in batches:
            r = load(args.build, server, n, args.steps if n <= 64 else args.steps // 2)
            lat = r["latency_us"]
            print(f"| {n} | {r['steps_per_second']:.0f} | {lat['p50'] / 1e3:.2f} ms | "
                  f"{lat['p90'] / 1e3:.2f} ms | {lat['p99'] / 1e3:.2f} ms | {lat['max'] / 1e3:.2f} ms | "
                  f"{engine[n]:.0f} | {r['steps_per_second'] / engine[n]:.2f} |")
        print("\nPrefill, H = 8, d = 64: sessions each sending one 2048-token Prefill at once\n")
        print("| sessions | prefill tokens | seconds | tokens/s through the server | p50 request |")
        print("|---|---|---|---|---|")
        for n in (1, 4, 16):
            r = load(args.build, server, n, 1, prefill=2048)
            p = r["prefill"]
            print(f"| {n} | {r['prefill_tokens']} | {p['seconds']:.2f} | "
                  f"{p['tokens_per_second']:.0f} | {p['latency_us']['p50'] / 1e3:.1f} ms |")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    # What batching buys: the same 64-session run with batches of one.
    proc, server = start_server(args.build, "--max-batch", "1")
    try:
        r = load(args.build, server, 64, args.steps)
        print("\nBatching at 64 sessions: with --max-batch 1 (every step its own kernel call) the "
              f"server does {r['steps_per_second']:.0f} steps/s, p99 "
              f"{r['latency_us']['p99'] / 1e3:.2f} ms; compare the 64-session row above.")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
