#!/usr/bin/python3
"""Server decode throughput with TLS, API keys, metrics and access logs on,
against all of them off.

    /usr/bin/python3 bench/security_bench.py [--build build] [--quick]

Starts build/bin/linattn-server on loopback three times — all off (no TLS,
no keys, --metrics off, --access-log off); API keys, metrics and the access
log on (the log to a file); and the same with TLS (--tls-cert/--tls-key,
certificates tests/tls/make_certs.sh makes with openssl) — and drives each
with build/bin/linattn-load at 64 sessions, one Decode stream per session
(H = 8, d = 64, closed loop), interleaving them a few times; reports the
median steps/s of each against all off, and the CPU time each side spent
per step (the server's from /proc, the client's from its rusage). Client
and server share the machine's cores, so TLS is paid twice here (both ends
encrypt every byte). Standard library only.
"""
import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def start(build, work, name, extra):
    port_file = os.path.join(work, f"{name}.port")
    log = open(os.path.join(work, f"{name}.log"), "w")
    proc = subprocess.Popen([f"{build}/bin/linattn-server", "--listen", "127.0.0.1:0",
                             "--port-file", port_file, "--http-listen", "none",
                             "--model", "none", *extra], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(400):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, f"127.0.0.1:{open(port_file).read().strip()}"
        if proc.poll() is not None:
            sys.exit(f"linattn-server {name} exited; see {log.name}")
        time.sleep(0.05)
    proc.kill()
    sys.exit("linattn-server did not start")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def cpu_seconds(pid):
    """User + system CPU time of a running process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def load(build, server, steps, env_extra, connection):
    """(steps/s, server CPU µs per step, client CPU µs per step)."""
    proc, address = server
    env = dict(os.environ, **env_extra)
    server_cpu, client_cpu = cpu_seconds(proc.pid), children_cpu_seconds()
    out = subprocess.run([f"{build}/bin/linattn-load", "--server", address, "--sessions", "64",
                          "--steps", str(steps), "--heads", "8", "--dim", "64", "--json",
                          "--no-progress", "--duration", "120", *connection],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"linattn-load failed: {out.stdout}{out.stderr}")
    server_cpu = cpu_seconds(proc.pid) - server_cpu
    client_cpu = children_cpu_seconds() - client_cpu
    total = 64 * steps
    return (json.loads(out.stdout)["steps_per_second"], 1e6 * server_cpu / total,
            1e6 * client_cpu / total)


def measure(build, quick):
    work = tempfile.mkdtemp(prefix="linattn_security_bench_")
    try:
        certs = os.path.join(work, "certs")
        subprocess.run(["bash", os.path.join(ROOT, "tests", "tls", "make_certs.sh"), certs],
                       check=True)
        key = os.urandom(24).hex()
        keys = os.path.join(work, "keys.json")
        with open(keys, "w") as f:
            json.dump({"keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest(),
                                 "tenant": "bench"}]}, f)
        tls_client = ["--tls-ca", os.path.join(certs, "ca.pem")]
        keyed = {"LINATTN_API_KEY": key}
        on = ["--api-keys", keys, "--metrics", "on", "--access-log", "on",
              "--log-level", "info"]
        configs = {
            # name: server flags, client environment, client flags
            "plain": (["--metrics", "off", "--access-log", "off", "--log-level", "warn"],
                      {}, []),
            "keys_metrics_log": (on, keyed, []),
            "secured": (on + ["--tls-cert", os.path.join(certs, "server.pem"),
                              "--tls-key", os.path.join(certs, "server.key")],
                        keyed, tls_client),
        }
        servers = {n: start(build, work, n, c[0]) for n, c in configs.items()}
        steps = 200 if quick else 1000
        rounds = 2 if quick else 3
        rates = {n: [] for n in configs}
        server_us = {n: [] for n in configs}
        client_us = {n: [] for n in configs}
        try:
            # One run of each first, not counted: the first run against a
            # process pays for warming up caches and the allocator.
            for n, (_, env, conn) in configs.items():
                load(build, servers[n], steps // 4, env, conn)
            for _ in range(rounds):  # interleaved, so drift hits all alike
                for n, (_, env, conn) in configs.items():
                    rate, srv, cli = load(build, servers[n], steps, env, conn)
                    rates[n].append(rate)
                    server_us[n].append(srv)
                    client_us[n].append(cli)
        finally:
            for proc, _ in servers.values():
                stop(proc)
        med = {n: statistics.median(r) for n, r in rates.items()}
        return {"sessions": 64, "steps_per_session": steps, "runs": rounds,
                "steps_per_second": med, "all": rates,
                "server_cpu_us_per_step": {n: statistics.median(v) for n, v in server_us.items()},
                "client_cpu_us_per_step": {n: statistics.median(v) for n, v in client_us.items()},
                "ratio_secured": med["secured"] / med["plain"],
                "ratio_keys_metrics_log": med["keys_metrics_log"] / med["plain"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    r = measure(args.build, args.quick)
    print(json.dumps(r, indent=2))
    m = r["steps_per_second"]
    print(f"64 sessions, Decode streams: {m['plain']:.0f} steps/s all off, "
          f"{m['keys_metrics_log']:.0f} with keys + metrics + access log "
          f"({r['ratio_keys_metrics_log']:.2f}), {m['secured']:.0f} with TLS too "
          f"({r['ratio_secured']:.2f})", file=sys.stderr)
    srv, cli = r["server_cpu_us_per_step"], r["client_cpu_us_per_step"]
    for n in m:
        print(f"  {n}: server {srv[n]:.1f} µs CPU per step, client {cli[n]:.1f}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
