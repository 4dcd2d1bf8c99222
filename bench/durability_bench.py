#!/usr/bin/python3
"""Durable sessions: what recording costs, what recovery takes, what disk holds.

    /usr/bin/python3 bench/durability_bench.py [--build build] [--quick]

  decode       64 sessions through a loopback linattn-server, one Decode
               stream each (H = 8, d = 64, closed loop, BUILD/bin/linattn-load):
               without --state-dir, with --durability always (fsync per round)
               and with --durability batch (fsync every 100 ms); the three
               runs interleaved, three times, each rate the median
  recovery     10,000 attention sessions (H = 8, d = 64, 16 decode steps each)
               and 1,000 model sessions of the built-in model (a 64-token
               prompt and 16 generated tokens each), recovered after kill -9
               (snapshot files compaction wrote, plus the journal) and after
               SIGTERM (every session in its snapshot file): the server's own
               recovery time and exec to SERVING
  disk         bytes in the state dir per session, beside the state's bytes

Prints JSON (--json) or a Markdown table; bench/compare includes it.
Python's grpcio (Debian's python3-grpcio) drives the model sessions, with
code generated from proto/ by protoc.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[durability {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Server:
    """linattn-server on an ephemeral loopback port, its log in a file."""

    def __init__(self, build, work, *args):
        self.port_file = os.path.join(work, "port")
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.log_path = os.path.join(work, "server.log")
        self.log = open(self.log_path, "a")
        start = time.monotonic()
        self.proc = subprocess.Popen(
            [os.path.join(build, "bin", "linattn-server"), "--listen", "127.0.0.1:0", "--http-listen", "none",
             "--port-file", self.port_file, *args], stdout=self.log, stderr=subprocess.STDOUT)
        while not (os.path.exists(self.port_file) and open(self.port_file).read().strip()):
            if self.proc.poll() is not None:
                sys.exit("linattn-server stopped: " + open(self.log_path).read()[-2000:])
            time.sleep(0.01)
        self.start_seconds = time.monotonic() - start  # exec to SERVING
        self.address = "127.0.0.1:" + open(self.port_file).read().strip()

    def recovery_seconds(self):
        found = re.findall(r"recovered .* in ([0-9.]+) s", open(self.log_path).read())
        return float(found[-1]) if found else None

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)
        return time.monotonic() - start


def load(build, address, *args):
    out = subprocess.run([os.path.join(build, "bin", "linattn-load"), "--server", address,
                          "--heads", "8", "--dim", "64", "--json", "--no-progress",
                          "--duration", "600", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"linattn-load failed: {out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def disk_bytes(path):
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "**", "*"), recursive=True)
               if os.path.isfile(f))


def decode(build, work, steps, repeats):
    """64 sessions, one Decode stream each, by durability; medians."""
    modes = {"memory only": [], "always": ["--durability", "always"],
             "batch": ["--durability", "batch", "--sync-interval-ms", "100"]}
    rates = {m: [] for m in modes}
    for _ in range(repeats):
        for mode, flags in modes.items():
            state = os.path.join(work, "decode-state")
            shutil.rmtree(state, ignore_errors=True)
            extra = ["--model", "none", "--log-level", "warn"]
            if flags:
                extra += ["--state-dir", state, *flags]
            server = Server(build, work, *extra)
            try:
                r = load(build, server.address, "--sessions", "64", "--steps", str(steps),
                         "--verify", "2")
                rates[mode].append(r["steps_per_second"])
            finally:
                server.stop()
    return {m: {"runs": v, "steps_per_second": statistics.median(v)} for m, v in rates.items()}


def generate_protos(work):
    """Python code for every file under proto/, importable from here on."""
    gen = os.path.join(work, "gen")
    os.makedirs(gen, exist_ok=True)
    protos = sorted(glob.glob(os.path.join(ROOT, "proto", "**", "*.proto"), recursive=True))
    subprocess.run(["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"--python_out={gen}",
                    f"--grpc_out={gen}",
                    f"--plugin=protoc-gen-grpc={shutil.which('grpc_python_plugin')}", *protos],
                   check=True)
    sys.path.insert(0, gen)


def grpc_modules(work):
    generate_protos(work)
    import grpc  # noqa: E402
    from linattn.v1 import generation_pb2, generation_pb2_grpc  # noqa: E402
    return grpc, generation_pb2, generation_pb2_grpc


def model_sessions(address, n, mods):
    """n model sessions, each a 64-token prompt appended and 16 tokens generated."""
    grpc, g, gg = mods
    with grpc.insecure_channel(address) as channel:
        stub = gg.GenerationServiceStub(channel)

        def one(i):
            sid = f"m-{i}"
            stub.CreateSession(g.CreateModelSessionRequest(session_id=sid))
            prompt = [65 + (i + j) % 26 for j in range(64)]
            stub.Append(g.AppendRequest(session_id=sid, token_ids=prompt))
            for _ in stub.Generate(g.GenerateRequest(
                    session_id=sid, sampling=g.SamplingParams(max_tokens=16))):
                pass

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            list(pool.map(one, range(n)))


def recovery(build, work, kind, n, mods):
    state = os.path.join(work, f"{kind}-state")
    shutil.rmtree(state, ignore_errors=True)
    model = os.path.join(ROOT, "models", "tiny")
    flags = ["--state-dir", state, "--max-sessions", str(2 * n), "--max-state-memory", "16GiB",
             "--idle-ttl", "0", "--model", model if kind == "model" else "none"]
    server = Server(build, work, *flags)
    log(f"{n} {kind} sessions")
    if kind == "attention":
        load(build, server.address, "--sessions", str(n), "--steps", "16", "--concurrency", "64",
             "--verify", "0", "--session-prefix", "rec")
        state_bytes = 8 * (64 * 64 + 64) * 4
    else:
        model_sessions(server.address, n, mods)
        state_bytes = int(re.findall(r"([0-9]+) bytes of state per session",
                                     open(server.log_path).read())[-1])
    time.sleep(1.5)  # the maintenance thread's snapshots of the busiest sessions
    disk_running = disk_bytes(state)
    server.kill()
    log("after kill -9")
    server = Server(build, work, *flags)
    after_kill = {"recovery_seconds": server.recovery_seconds(),
                  "start_seconds": server.start_seconds}
    drain = server.stop()
    disk_files = disk_bytes(state)
    log("after SIGTERM")
    server = Server(build, work, *flags)
    after_term = {"recovery_seconds": server.recovery_seconds(),
                  "start_seconds": server.start_seconds}
    server.stop()
    return {"sessions": n, "state_bytes": state_bytes, "after_kill": after_kill,
            "drain_seconds": drain, "after_sigterm": after_term,
            "disk_bytes_per_session_running": disk_running / n,
            "disk_bytes_per_session_files": disk_files / n}


def measure(build, quick):
    work = tempfile.mkdtemp(prefix="linattn_durability_")
    try:
        log("decode at 64 sessions by durability")
        out = {"decode": decode(build, work, 200 if quick else 1000, 1 if quick else 3)}
        mods = grpc_modules(work)
        out["attention"] = recovery(build, work, "attention", 1000 if quick else 10000, mods)
        out["model"] = recovery(build, work, "model", 100 if quick else 1000, mods)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(res):
    d = res["decode"]
    base = d["memory only"]["steps_per_second"]
    lines = ["| durability | steps/s (64 sessions, one Decode stream each) | / memory only |",
             "|---|---|---|"]
    for mode, r in d.items():
        lines.append(f"| {mode} | {r['steps_per_second']:,.0f} | "
                     f"{r['steps_per_second'] / base:.2f} |")
    lines += ["", "| sessions | state bytes | disk bytes per session (running / after SIGTERM) | "
              "drain | recovery after kill -9 (exec to SERVING) | after SIGTERM |",
              "|---|---|---|---|---|---|"]
    for kind in ("attention", "model"):
        r = res[kind]
        lines.append(
            f"| {r['sessions']:,} {kind} | {r['state_bytes']:,} | "
            f"{r['disk_bytes_per_session_running']:,.0f} / {r['disk_bytes_per_session_files']:,.0f} | "
            f"{r['drain_seconds']:.2f} s | {r['after_kill']['recovery_seconds']:.2f} s "
            f"({r['after_kill']['start_seconds']:.2f} s) | "
            f"{r['after_sigterm']['recovery_seconds']:.2f} s "
            f"({r['after_sigterm']['start_seconds']:.2f} s) |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(args.build, args.quick)
    print(json.dumps(res) if args.json else table(res))


if __name__ == "__main__":
    main()
