#!/usr/bin/python3
"""Snapshot and Fork of model sessions while they generate: how long they take.

    /usr/bin/python3 bench/checkpoint_bench.py [--build build] [--calls 200] [--json]

Starts BUILD/bin/linattn-server (the built-in model, loopback, ephemeral
port), memory only and again with a state dir, and keeps `--streams` greedy
Generate streams running (3,000 tokens each, started again when they end);
one of them is read by a client that stopped reading after its first 8
messages. Meanwhile it calls Snapshot and Fork of those sessions, one call
at a time, alternating, `--calls` of each, and reports their latency (p50,
p99, max) beside the target: p99 ≤ 50 ms while the session generates.
Client and server share the machine's cores. Python's grpcio (Debian's
python3-grpcio), with code generated from proto/ by protoc.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import durability_bench  # noqa: E402

TARGET_P99_MS = 50.0


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(build, work, mods, streams, calls, state_dir):
    grpc, g, gg = mods
    args = ["--model", os.path.join(durability_bench.ROOT, "models", "tiny"), "--log-level", "warn"]
    if state_dir:
        state = os.path.join(work, "state")
        shutil.rmtree(state, ignore_errors=True)
        args += ["--state-dir", state]
    server = durability_bench.Server(build, work, *args)
    stop = threading.Event()
    try:
        channel = grpc.insecure_channel(server.address)
        stub = gg.GenerationServiceStub(channel)
        ids = [stub.CreateSession(g.CreateModelSessionRequest()).session_id for _ in range(streams)]
        started = [threading.Event() for _ in ids]
        calls_open = []

        def generate(i, sid):
            # Session 0's reader stops after 8 messages, holding its stream open.
            while not stop.is_set():
                call = stub.Generate(g.GenerateRequest(
                    session_id=sid, prompt="And God said",
                    sampling=g.SamplingParams(max_tokens=3000)))
                calls_open.append(call)
                try:
                    for n, _ in enumerate(call):
                        if n == 8:
                            started[i].set()
                            if i == 0:
                                stop.wait()
                                break
                        if stop.is_set():
                            break
                except grpc.RpcError:
                    pass
                call.cancel()

        threads = [threading.Thread(target=generate, args=(i, sid), daemon=True)
                   for i, sid in enumerate(ids)]
        for t in threads:
            t.start()
        for e in started:
            e.wait(60)
        rng = random.Random(1)
        latency = {"Snapshot": [], "Fork": []}
        failures = 0
        for n in range(2 * calls):
            sid = ids[n % len(ids)]
            kind = "Snapshot" if n % 2 == 0 else "Fork"
            t0 = time.perf_counter()
            try:
                if kind == "Snapshot":
                    stub.Snapshot(g.SnapshotModelSessionRequest(session_id=sid), timeout=2)
                else:
                    fork = stub.Fork(g.ForkModelSessionRequest(session_id=sid), timeout=2)
                latency[kind].append((time.perf_counter() - t0) * 1e3)
                if kind == "Fork":
                    stub.DeleteSession(g.DeleteModelSessionRequest(session_id=fork.session_id))
            except grpc.RpcError:
                failures += 1
            time.sleep(rng.uniform(0.0, 0.02))
        stop.set()
        for call in calls_open:
            call.cancel()
        for t in threads:
            t.join(10)
        channel.close()
        out = {"failures": failures}
        for kind, values in latency.items():
            out[kind] = {"calls": len(values),
                         "p50_ms": statistics.median(values) if values else None,
                         "p99_ms": percentile(values, 0.99) if values else None,
                         "max_ms": max(values) if values else None}
        return out
    finally:
        stop.set()
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="linattn_checkpoint_")
    try:
        mods = durability_bench.grpc_modules(work)
        results = {mode: run(a.build, work, mods, a.streams, a.calls, mode == "state dir")
                   for mode in ("memory only", "state dir")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print(f"Snapshot and Fork while {a.streams} sessions generate (one stream unread), "
          f"{a.calls} calls each; target p99 ≤ {TARGET_P99_MS:.0f} ms\n")
    print("| server | call | p50 ms | p99 ms | max ms | failed | target |")
    print("|---|---|---:|---:|---:|---:|---|")
    for mode, r in results.items():
        for kind in ("Snapshot", "Fork"):
            m = r[kind]
            met = m["p99_ms"] is not None and m["p99_ms"] <= TARGET_P99_MS and r["failures"] == 0
            print(f"| {mode} | {kind} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | {m['max_ms']:.2f} "
                  f"| {r['failures']} | {'met' if met else 'missed'} |")


if __name__ == "__main__":
    main()
