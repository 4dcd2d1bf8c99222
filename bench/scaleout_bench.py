#!/usr/bin/python3
"""Replicas behind HAProxy with their sessions in Redis: what it costs, how fast it heals.

    /usr/bin/python3 bench/scaleout_bench.py [--build build] [--quick] [--json]

  decode     64 sessions, one Decode stream each (H = 8, d = 64, closed loop,
             BUILD/bin/linattn-load), steps/s and p99 latency:
               one server, sessions in memory only
               one server, --state-dir (durability always: fsync per round)
               one server, --state-store redis (AOF, fsync always)
               one server behind HAProxy, --state-store redis
               three replicas behind HAProxy, --state-store redis
             the runs interleaved, three times each, medians
  failover   64 sessions through HAProxy over three replicas; the replica
             holding the most is killed with SIGKILL; from the kill, how long
             until each of its sessions answers GetSession through the proxy
             again (taken over by another replica after the dead one's lease
             lapsed): median and last, with --lease-ms 2000 (the default) and
             1000

Every process runs on 127.0.0.1 in a temporary directory: redis-server and
haproxy from Debian (deploy/haproxy/haproxy.cfg), linattn-server from BUILD.
Prints JSON (--json) or a Markdown table; bench/compare includes it.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import durability_bench  # noqa: E402


def log(msg):
    print(f"[scaleout {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for(check, what, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.02)
    sys.exit(f"{what} did not start")


class Cluster:
    """Redis, `replicas` linattn-servers with --state-store, optionally HAProxy."""

    def __init__(self, build, work, replicas, proxy, lease_ms=2000, store="redis"):
        self.build, self.work = build, work
        self.procs = []
        ports = free_ports(2 + 2 * 3)
        self.redis_port, self.proxy_port = ports[0], ports[1]
        self.grpc = ports[2:5]
        self.agent = ports[5:8]
        self.replicas = [None] * replicas
        self.lease_ms = lease_ms
        self.store = store
        if store == "redis":
            self.redis = self.spawn("redis.log", [
                "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                "--dir", work, "--appendonly", "yes", "--appendfsync", "always",
                "--save", ""])
            wait_for(lambda: subprocess.run(
                ["redis-cli", "-p", str(self.redis_port), "ping"],
                capture_output=True).returncode == 0, "redis")
        for i in range(replicas):
            self.start_replica(i)
        self.address = f"127.0.0.1:{self.grpc[0]}"
        if proxy:
            env = dict(os.environ, LINATTN_PROXY_BIND=f"127.0.0.1:{self.proxy_port}")
            for i in range(3):
                # Unused slots point at a port nothing listens on: HAProxy
                # marks them down at its first check.
                env[f"LINATTN_{i + 1}"] = f"127.0.0.1:{self.grpc[i]}"
                env[f"LINATTN_{i + 1}_AGENT"] = str(self.agent[i])
            self.spawn("haproxy.log", ["haproxy", "-db", "-f",
                                       os.path.join(ROOT, "deploy", "haproxy", "haproxy.cfg")],
                       env=env)
            self.address = f"127.0.0.1:{self.proxy_port}"
            wait_for(lambda: self.healthy(self.address), "haproxy")
            time.sleep(1.2)  # the checks of unused slots fail: out of the ring

    def spawn(self, log_name, argv, env=None):
        out = open(os.path.join(self.work, log_name), "a")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        return p

    def healthy(self, address):
        return subprocess.run([os.path.join(self.build, "bin", "linattn"), "health", "--server",
                               address], capture_output=True).returncode == 0

    def start_replica(self, i):
        args = [os.path.join(self.build, "bin", "linattn-server"),
                "--listen", f"127.0.0.1:{self.grpc[i]}", "--http-listen", "none",
                "--model", "none",
                "--log-level", "warn", "--haproxy-agent-listen", f"127.0.0.1:{self.agent[i]}"]
        if self.store == "redis":
            args += ["--state-store", f"redis://127.0.0.1:{self.redis_port}",
                     "--replica-name", f"r{i}", "--lease-ms", str(self.lease_ms)]
        elif self.store == "dir":
            args += ["--state-dir", os.path.join(self.work, f"state{i}")]
        self.replicas[i] = self.spawn(f"replica{i}.log", args)
        wait_for(lambda: self.healthy(f"127.0.0.1:{self.grpc[i]}"), f"replica {i}")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def load(build, address, *args):
    out = subprocess.run([os.path.join(build, "bin", "linattn-load"), "--server", address,
                          "--heads", "8", "--dim", "64", "--json", "--no-progress",
                          "--duration", "600", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"linattn-load failed: {out.stdout}{out.stderr}")
    return json.loads(out.stdout)


CONFIGS = {
    "one server, memory only": dict(replicas=1, proxy=False, store="memory"),
    "one server, --state-dir (always)": dict(replicas=1, proxy=False, store="dir"),
    "one server, --state-store redis": dict(replicas=1, proxy=False, store="redis"),
    "one server behind HAProxy, redis": dict(replicas=1, proxy=True, store="redis"),
    "three replicas behind HAProxy, redis": dict(replicas=3, proxy=True, store="redis"),
}


def decode(build, work, steps, repeats):
    runs = {name: [] for name in CONFIGS}
    for r in range(repeats):
        for name, cfg in CONFIGS.items():
            d = tempfile.mkdtemp(dir=work)
            cluster = Cluster(build, d, **cfg)
            try:
                res = load(build, cluster.address, "--sessions", "64", "--steps", str(steps),
                           "--verify", "2", "--session-prefix", f"d{r}")
                runs[name].append((res["steps_per_second"], res["latency_us"]["p99"]))
                log(f"{name}: {res['steps_per_second']:.0f} steps/s, p99 "
                    f"{res['latency_us']['p99']:.0f} µs")
            finally:
                cluster.close()
    return {name: {"steps_per_second": statistics.median(x[0] for x in v),
                   "p99_us": statistics.median(x[1] for x in v),
                   "runs": v} for name, v in runs.items()}


def grpc_modules(work):
    durability_bench.generate_protos(work)
    import grpc  # noqa: E402
    from linattn.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402
    return grpc, attention_pb2, attention_pb2_grpc


def failover(build, work, lease_ms, mods):
    grpc, a, ag = mods
    cluster = Cluster(build, tempfile.mkdtemp(dir=work), 3, True, lease_ms=lease_ms)
    try:
        load(build, cluster.address, "--sessions", "64", "--steps", "50", "--verify", "0",
             "--session-prefix", "f")
        owners = {}
        for i in range(64):
            out = subprocess.run(["redis-cli", "-p", str(cluster.redis_port), "hget",
                                  f"la:s:{{f-{i}}}:meta", "owner"],
                                 capture_output=True, text=True).stdout.strip()
            owners.setdefault(out.split("-")[0], []).append(f"f-{i}")
        victim_name, victims = max(owners.items(), key=lambda kv: len(kv[1]))
        victim = int(victim_name[1:])
        time.sleep(0.3)
        with grpc.insecure_channel(cluster.address) as channel:
            stub = ag.AttentionServiceStub(channel)
            # Warm the channel so the measurement is the takeover, not a
            # connection.
            stub.GetSession(a.GetSessionRequest(session_id=victims[0]),
                            metadata=[("x-session-id", victims[0])], timeout=5)
            killed = time.monotonic()
            cluster.replicas[victim].kill()

            def served(sid):
                while True:
                    try:
                        stub.GetSession(a.GetSessionRequest(session_id=sid),
                                        metadata=[("x-session-id", sid)], timeout=10)
                        return time.monotonic() - killed
                    except grpc.RpcError:
                        time.sleep(0.01)
                    if time.monotonic() - killed > 60:
                        sys.exit(f"session {sid} was not served again within 60 s")

            with concurrent.futures.ThreadPoolExecutor(len(victims)) as pool:
                times = sorted(pool.map(served, victims))
        return {"lease_ms": lease_ms, "sessions": len(victims),
                "median_seconds": statistics.median(times), "last_seconds": times[-1]}
    finally:
        cluster.close()


def measure(build, quick):
    work = tempfile.mkdtemp(prefix="linattn_scaleout_")
    try:
        log("decode at 64 sessions")
        out = {"decode": decode(build, work, 300 if quick else 1000, 1 if quick else 3)}
        mods = grpc_modules(work)
        out["failover"] = [failover(build, work, lease, mods) for lease in (2000, 1000)]
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(res):
    d = res["decode"]
    base = d["one server, memory only"]["steps_per_second"]
    lines = ["| 64 sessions, one Decode stream each | steps/s | / memory only | p99 µs |",
             "|---|---:|---:|---:|"]
    for name, v in d.items():
        lines.append(f"| {name} | {v['steps_per_second']:.0f} | "
                     f"{v['steps_per_second'] / base:.2f} | {v['p99_us']:.0f} |")
    lines += ["", "| replica killed (kill -9) | its sessions | served again: median | last |",
              "|---|---:|---:|---:|"]
    for f in res["failover"]:
        lines.append(f"| --lease-ms {f['lease_ms']} | {f['sessions']} | "
                     f"{f['median_seconds']:.2f} s | {f['last_seconds']:.2f} s |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(os.path.abspath(args.build), args.quick)
    print(json.dumps(res, indent=1) if args.json else table(res))


if __name__ == "__main__":
    main()
