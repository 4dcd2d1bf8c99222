#!/usr/bin/python3
"""Turns attention_benchmark's JSON into the Markdown tables of docs/benchmarks.md.

    build/bin/attention_benchmark --benchmark_out=bench.json --benchmark_out_format=json
    /usr/bin/python3 bench/report.py bench.json

Every number comes from the one run in the JSON, including the machine
limits the ratios are taken against (RMW bandwidth, oneDNN's GEMM peak).
Standard library only.
"""
import json
import sys


def parse(name):
    """'BM_DecodeStep/64/1/real_time' -> ('BM_DecodeStep', [64, 1])."""
    parts = name.split("/")
    return parts[0], [int(p) for p in parts[1:] if p.isdigit()]


def main(path):
    with open(path) as f:
        data = json.load(f)
    ctx = data["context"]
    runs = [b for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    decode, prefill, recurrent, one_by_one = [], {}, {}, {}
    for b in runs:
        kind, args = parse(b["name"])
        if kind == "BM_DecodeStep":
            decode.append((args, b))
        elif kind == "BM_ChunkwisePrefill":
            prefill[(args[0], args[1])] = (args, b)
        elif kind == "BM_RecurrentPrefill":
            recurrent[(args[0], args[1])] = b
        elif kind == "BM_DecodeOneByOne":
            one_by_one[(args[0], args[1])] = b

    print(f"Machine: {ctx.get('num_cpus')} CPUs at {ctx.get('mhz_per_cpu')} MHz; "
          f"run {ctx.get('date')}; decode kernels: "
          f"{decode[0][1].get('label', '?') if decode else '?'}\n")
    print("(a) Decode step, H = 8 heads, one token per session")
    print()
    print("| d | sessions B | time per batch step | per session | state read+written | achieved | RMW bound (same size) | fraction of bound |")
    print("|---|---|---|---|---|---|---|---|")
    for (d, B), b in sorted(decode, key=lambda x: x[0]):
        t_us = b["real_time"] * {"ns": 1e-3, "us": 1, "ms": 1e3}[b["time_unit"]]
        print(f"| {d} | {B} | {t_us:.2f} µs | {b['us_per_session_step']:.2f} µs | "
              f"{b['state_bytes_rw'] / 1e6:.3f} MB | {b['bytes_per_second'] / 1e9:.1f} GB/s | "
              f"{b['rmw_GBps']:.1f} GB/s | {b['frac_of_rmw']:.2f} |")
    for (d, B), b in sorted(one_by_one.items()):
        batched = next((x for a, x in decode if a == [d, B]), None)
        if batched:
            print(f"\nBatching: {B} sessions stepped one call each take "
                  f"{b['us_per_session_step']:.2f} µs per session, one batched call "
                  f"{batched['us_per_session_step']:.2f} µs "
                  f"({b['us_per_session_step'] / batched['us_per_session_step']:.2f}× faster).")
    print()
    print("(b) Chunkwise prefill (C = 64), one session, H = 8;  (c) vs token-by-token")
    print()
    print("| d | T | time | tokens/s | GFLOP/s | oneDNN GEMM peak | fraction of peak | token-by-token tokens/s | chunkwise / token-by-token |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (d, T), (args, b) in sorted(prefill.items()):
        t_ms = b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1}[b["time_unit"]]
        rec = recurrent.get((d, T))
        rec_tps = rec["items_per_second"] if rec else float("nan")
        print(f"| {d} | {T} | {t_ms:.1f} ms | {b['items_per_second'] / 1e3:.0f} k | "
              f"{b['GFLOPs']:.0f} | {b['gemm_peak_GFLOPs']:.0f} | {b['frac_of_peak']:.2f} | "
              f"{rec_tps / 1e3:.0f} k | {b['items_per_second'] / rec_tps:.2f}× |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py BENCH.json")
    main(sys.argv[1])
