#!/usr/bin/env python3
"""make soak: mixed, verified load on both services of one linattn-server for
a set time, watching the server's resident memory and open file descriptors.

- Attention: linattn-load runs back to back (sessions created, prefilled,
  decoded, every session recomputed locally and compared, then deleted),
  alternating Decode streams and DecodeBatch groups and the feature maps.
- Generation: sessions of the built-in model are created, given a prompt,
  generated from with a fixed seed (the text must equal the first run's for
  that prompt and seed), forked, snapshotted and restored (the restored
  session must continue exactly as the original), and deleted.

It fails on any error or verification mismatch, on resident memory that
grows past what it reached during the warm-up (the first quarter, at least
20 s) by more than 10% + 16 MiB, and on file descriptors that grow past the
warm-up's by more than 8. Loopback only; it stops by itself.

    /usr/bin/python3 tools/soak.py --build build --seconds 600
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seconds", type=float, default=600)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="linattn_soak_")
    gen = os.path.join(work, "gen")
    os.makedirs(gen)
    protos = sorted(glob.glob(os.path.join(ROOT, "proto", "**", "*.proto"), recursive=True))
    subprocess.run(["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"--python_out={gen}",
                    f"--grpc_out={gen}",
                    f"--plugin=protoc-gen-grpc={shutil.which('grpc_python_plugin')}", *protos],
                   check=True)
    sys.path.insert(0, gen)
    import grpc
    from linattn.v1 import generation_pb2 as g, generation_pb2_grpc as gg

    port_file = os.path.join(work, "port")
    log = open(os.path.join(work, "server.log"), "w")
    server = subprocess.Popen(
        [os.path.join(args.build, "bin", "linattn-server"), "--listen", "127.0.0.1:0", "--http-listen", "none",
         "--port-file", port_file, "--log-level", "warn", "--idle-ttl", "60"],
        stdout=log, stderr=subprocess.STDOUT)
    port = None
    for _ in range(400):
        try:
            with open(port_file) as f:
                port = int(f.read())
            break
        except (OSError, ValueError):
            time.sleep(0.05)
    if port is None:
        print("soak: the server did not start")
        return 1
    address = f"127.0.0.1:{port}"
    failures, counts = [], {"load runs": 0, "attention steps": 0, "generations": 0}
    stop = threading.Event()
    end = time.time() + args.seconds

    def attention_loop():
        maps = ["elu1", "relu", "favor", "cosine"]
        i = 0
        while not stop.is_set():
            batch = ["--batch", "8"] if i % 2 else []
            left = max(1.0, min(30.0, end - time.time()))
            r = subprocess.run(
                [os.path.join(args.build, "bin", "linattn-load"), "--server", address,
                 "--sessions", "16", "--steps", "300", "--prefill", "64", "--verify", "16",
                 "--heads", "4", "--dim", "32", "--feature-map", maps[i % len(maps)],
                 "--seed", str(i + 1), "--duration", str(left), "--json", "--no-progress",
                 *batch], capture_output=True, text=True)
            i += 1
            try:
                summary = json.loads(r.stdout)
            except ValueError:
                failures.append(f"linattn-load: {r.stderr.strip()[-300:]}")
                return
            if summary["errors"] or summary["mismatched_sessions"] or not summary["ok"]:
                failures.append(f"linattn-load run {i}: {json.dumps(summary)[:400]}")
                return
            counts["load runs"] += 1
            counts["attention steps"] += summary["steps"]

    def generation_loop():
        stub = gg.GenerationServiceStub(grpc.insecure_channel(address))
        expected = {}
        prompts = ["In the beginning", "And God said", "Let there be light", "And the earth"]
        i = 0
        while not stop.is_set():
            prompt, seed = prompts[i % len(prompts)], i % 7
            params = g.SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=seed)
            try:
                sid = stub.CreateSession(g.CreateModelSessionRequest()).session_id
                text = "".join(r.text for r in stub.Generate(
                    g.GenerateRequest(session_id=sid, prompt=prompt, sampling=params)))
                key = (prompt, seed)
                if expected.setdefault(key, text) != text:
                    failures.append(f"generation {key}: {text!r} != {expected[key]!r}")
                    return
                # A fork and a restored snapshot continue exactly as the original.
                fork = stub.Fork(g.ForkModelSessionRequest(session_id=sid)).session_id
                blob = stub.Snapshot(g.SnapshotModelSessionRequest(session_id=sid)).state
                restored = stub.Restore(g.RestoreModelSessionRequest(state=blob)).session_id
                more = g.SamplingParams(max_tokens=8, seed=seed + 100)
                outs = ["".join(r.text for r in stub.Generate(
                    g.GenerateRequest(session_id=s, sampling=more))) for s in (sid, fork, restored)]
                if len(set(outs)) != 1:
                    failures.append(f"fork/restore diverged: {outs}")
                    return
                for s in (sid, fork, restored):
                    stub.DeleteSession(g.DeleteModelSessionRequest(session_id=s))
            except grpc.RpcError as e:
                failures.append(f"generation: {e.code()}: {e.details()}")
                return
            counts["generations"] += 1
            i += 1

    threads = [threading.Thread(target=attention_loop), threading.Thread(target=generation_loop)]
    for t in threads:
        t.start()
    warmup_end = time.time() + max(20.0, args.seconds / 4)
    warm_rss = warm_fds = 0
    peak_rss = peak_fds = 0
    while time.time() < end and not failures:
        if server.poll() is not None:
            failures.append(f"the server exited with {server.returncode}")
            break
        now_rss, now_fds = rss(server.pid), fds(server.pid)
        if time.time() < warmup_end:
            warm_rss, warm_fds = max(warm_rss, now_rss), max(warm_fds, now_fds)
        else:
            peak_rss, peak_fds = max(peak_rss, now_rss), max(peak_fds, now_fds)
            if now_rss > warm_rss * 1.10 + 16 * MIB:
                failures.append(f"RSS grew after the warm-up: {warm_rss / MIB:.1f} MiB → "
                                f"{now_rss / MIB:.1f} MiB")
            if now_fds > warm_fds + 8:
                failures.append(f"file descriptors grew after the warm-up: {warm_fds} → {now_fds}")
        time.sleep(2)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        failures.append("the server did not stop within 30 s of SIGTERM")
    log.close()
    print(f"soak: {args.seconds:.0f} s, {counts['load runs']} verified linattn-load runs "
          f"({counts['attention steps']} steps), {counts['generations']} checked generation "
          f"rounds; server RSS {warm_rss / MIB:.1f} MiB at warm-up, {peak_rss / MIB:.1f} MiB "
          f"peak after; fds {warm_fds} → {peak_fds}")
    if failures:
        for f in failures:
            print("soak: FAILED:", f)
        print(f"soak: server log kept in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("soak: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
