#!/usr/bin/python3
"""Where a decode step through the server spends its CPU, on each side.

    /usr/bin/python3 bench/serving_profile.py [--build build] [--steps 1000]

Starts a loopback linattn-server (AttentionService, no model) and drives it
with linattn-load at 64 sessions (H = 8, d = 64, closed loop), once with one
Decode stream per session and once with DecodeBatch messages of 16 sessions.
`perf record` samples both processes (cpu-clock, kernel and user code) for
the whole run; every sample is charged to one component, and a component's
CPU time over the session-steps the run made is its µs per step:

  compute                linattn's kernels and oneDNN (the step itself)
  OpenMP waits           libgomp: worker threads spinning at barriers
  (de)serialisation      protobuf: parsing and writing messages
  transport              gRPC and the kernel's socket, TCP and epoll paths
  scheduling             linattn's scheduler, reactors and session table,
                         locks, and the kernel's futex and wake-up paths
  allocation             malloc/free, and the kernel's page faults
  copies                 memcpy/memmove/memset outside the kernel
  other                  everything else (named in the JSON by its top
                         symbols)

Kernel samples are charged by the kernel functions on their stack (socket
→ transport, futex or wake-up → scheduling, page fault → allocation); user
samples by the function they landed in (Debian's libraries have no frame
pointers, so a user stack is its leaf alone). Needs `perf` (linux-perf) and
permission to sample the processes (root, or kernel.perf_event_paranoid
≤ 1); without them it says so and measures nothing. Standard library only.
"""
import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import server_bench  # noqa: E402

FREQUENCY = 1999  # samples per second per CPU

COMPONENTS = ["compute", "OpenMP waits", "(de)serialisation", "transport", "scheduling",
              "allocation", "copies", "other"]

_KERNEL_RULES = [
    ("transport", re.compile(r"tcp|udp|sock|skb|\bip_|ip_rcv|ip_finish|net_rx|netif|"
                             r"sendmsg|recvmsg|epoll|ep_poll|_poll\b|loopback|"
                             r"inet_|unix_stream")),
    ("scheduling", re.compile(r"futex|schedule|wake_up|try_to_wake|nanosleep|sched_|"
                              r"finish_task_switch")),
    ("allocation", re.compile(r"page_fault|mm_fault|do_anonymous_page|mmap|munmap|brk|"
                              r"madvise|do_exit_mm")),
]

_USER_RULES = [
    ("OpenMP waits", lambda sym, dso: "libgomp" in dso or "libomp" in dso),
    # oneDNN's JIT kernels show as [JIT] or, with a perf map, perf-PID.map.
    ("compute", lambda sym, dso: "libdnnl" in dso or dso.startswith("[JIT]")
     or re.fullmatch(r"perf-\d+\.map", dso) is not None
     or re.search(r"linattn::(avx512|avx2|generic)::|StepBatch|StepHead|ReadOut|AllFinite|"
                  r"MaxAbsBits|Elu1|Chunkwise|Recurrent|FeatureMap|linattn::Attention::",
                  sym) is not None),
    ("(de)serialisation", lambda sym, dso: "libprotobuf" in dso or "protobuf" in sym
     or "::v1::" in sym or "_InternalParse" in sym or "_InternalSerialize" in sym
     or "ByteSizeLong" in sym),
    ("transport", lambda sym, dso: re.search(r"libgrpc|libgpr|libupb|libaddress_sorting|"
                                             r"libssl|libcrypto|libcares", dso) is not None
     or sym.startswith("grpc") or "grpc_" in sym or "grpc::" in sym),
    ("scheduling", lambda sym, dso: re.search(r"linattn::(Scheduler|SessionManager|"
                                              r"ComputeExecutor)|Reactor|OpenStream|"
                                              r"pthread_mutex|pthread_cond|futex|"
                                              r"__lll_lock|sem_", sym) is not None
     or "libabsl_synchronization" in dso or "libabsl_graphcycles" in dso),
    ("allocation", lambda sym, dso: re.fullmatch(r"(__libc_)?(malloc|free|calloc|realloc)|"
                                                 r"_int_(malloc|free)|cfree.*|"
                                                 r"malloc_consolidate|tcache.*|"
                                                 r"operator new.*|operator delete.*|"
                                                 r"sysmalloc.*|unlink_chunk.*", sym)
     is not None),
    ("copies", lambda sym, dso: re.match(r"__(memmove|memcpy|memset|mempcpy)", sym) is not None),
]


def classify(frames):
    """The component of one sample; `frames` is its stack as (symbol, dso)
    pairs, leaf first."""
    kernel = [sym for sym, dso in frames if dso == "[kernel.kallsyms]"]
    if kernel:
        for name, rule in _KERNEL_RULES:
            if any(rule.search(sym) for sym in kernel):
                return name
    user = [(sym, dso) for sym, dso in frames if dso != "[kernel.kallsyms]"]
    if not user:
        return "other"
    sym, dso = user[0]
    for name, rule in _USER_RULES:
        if rule(sym, dso):
            return name
    return "other"


_HEADER = re.compile(r"^\S.*?\s(\d+)\s+cpu-clock")
_FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.*?)(?:\+0x[0-9a-f]+)?\s+\((.*)\)\s*$")


def parse_script(text):
    """perf script's samples as (period in ns, [(symbol, dso), ...]) pairs."""
    samples, period, frames = [], None, []
    for line in text.splitlines() + [""]:
        if not line.strip():
            if period is not None:
                samples.append((period, frames))
            period, frames = None, []
            continue
        m = _HEADER.match(line)
        if m and period is None:
            period = int(m.group(1))
            continue
        f = _FRAME.match(line)
        if f and period is not None:
            dso = f.group(2)
            frames.append((f.group(1), os.path.basename(dso) if dso.startswith("/") else dso))
    return samples


def attribute(samples, session_steps):
    """{component: µs per session-step}, the CPU seconds, and the top
    symbols of "other"."""
    ns = collections.Counter()
    other = collections.Counter()
    for period, frames in samples:
        c = classify(frames)
        ns[c] += period
        if c == "other" and frames:
            other[f"{frames[0][0]} ({frames[0][1]})"] += period
    total = sum(ns.values())
    return {"cpu_seconds": total / 1e9,
            "us_per_step": {c: ns[c] / 1e3 / session_steps for c in COMPONENTS},
            "us_per_step_total": total / 1e3 / session_steps,
            "other_top": [[s, v / total] for s, v in other.most_common(8)] if total else []}


def perf_available():
    """None when perf can sample processes here, else why not."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian package linux-perf)"
    probe = subprocess.run(["perf", "record", "-e", "cpu-clock", "-o", os.devnull, "--", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return "perf cannot sample here: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
    return None


def script(data):
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,period,event,ip,sym,dso"],
                         capture_output=True, text=True, check=True)
    return out.stdout


def profile_run(build, sessions, steps, batch, tmp):
    """One loopback run under perf: the load's JSON and each side's
    attribution per session-step."""
    proc, address = server_bench.start_server(build, "--model", "none")
    srv_data, cli_data = os.path.join(tmp, "server.data"), os.path.join(tmp, "client.data")
    recorder = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQUENCY),
                                 "-g", "-p", str(proc.pid), "-o", srv_data],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # perf attaches before the load starts
        out = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQUENCY),
                              "-g", "-o", cli_data, "--",
                              f"{build}/bin/linattn-load", "--server", address, "--sessions",
                              str(sessions), "--steps", str(steps), "--batch", str(batch),
                              "--heads", "8", "--dim", "64", "--json", "--no-progress",
                              "--duration", "120"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"linattn-load failed: {out.stdout}{out.stderr}")
        load = json.loads(out.stdout)
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    session_steps = load["steps"]
    return {"load": {k: load[k] for k in ("steps", "seconds", "steps_per_second", "latency_us")},
            "session_steps": session_steps,
            "sessions_per_message": max(batch, 1),
            "server": attribute(parse_script(script(srv_data)), session_steps),
            "client": attribute(parse_script(script(cli_data)), session_steps)}


def measure(build, quick=False):
    """Both runs, or {"unavailable": why} when perf cannot sample here."""
    why = perf_available()
    if why is not None:
        print(f"serving_profile: {why}; no profile", file=sys.stderr)
        return {"unavailable": why}
    steps = 200 if quick else 1000
    with tempfile.TemporaryDirectory(prefix="linattn_profile_") as tmp:
        return {"frequency_hz": FREQUENCY,
                "decode_64_streams": profile_run(build, 64, steps, 0, tmp),
                "decode_64_batch16": profile_run(build, 64, steps, 16, tmp)}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--quick", action="store_true", help="200 steps per session, not 1000")
    args = p.parse_args()
    print(json.dumps(measure(args.build, args.quick), indent=2))


if __name__ == "__main__":
    main()
