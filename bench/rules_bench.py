#!/usr/bin/python3
"""The gated, delta, rwkv7 and rwkv6 rules against the machine's limits and PyTorch.

    /usr/bin/python3 bench/rules_bench.py [--build build] [--quick]

Runs, on this machine:
  * build/bin/attention_benchmark's BM_RuleDecodeStep (H = 8, d = 64/128,
    B = 1/64; each case's read-modify-write bandwidth measured right after
    it) and BM_RuleChunkwisePrefill (T = 4096/16384; oneDNN's GEMM peak
    measured right after it; rwkv7 in its chunkwise WY form and, as
    "rwkv7 (step)", token by token through its step), three repetitions,
    the fastest counting;
  * bench/peers/torch_rule_peers.py: the same recurrences and fla's chunk
    forms in PyTorch (each chunk form checked against its recurrence first);
  * build/bin/decode_flatness --rule: decode time per token of one session
    at positions 10³ and 10⁶ (gated, gated delta).
Prints one JSON object (bench/compare renders it). Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RULE_ARGS = {1: "gated_head", 2: "gated_key", 3: "delta", 4: "gated_delta", 5: "rwkv7",
             6: "rwkv6"}


def run_json(cmd):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def engine(build, quick):
    tokens = "4096" if quick else "4096|16384"
    flt = f"BM_RuleDecodeStep/|BM_RuleChunkwisePrefill/[1-6]/(64|128)/({tokens})/"
    data = run_json([os.path.join(build, "bin", "attention_benchmark"),
                     f"--benchmark_filter={flt}", "--benchmark_format=json",
                     f"--benchmark_repetitions={1 if quick else 3}"])
    fastest = {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        key = b.get("run_name", b["name"])
        if key not in fastest or b["real_time"] < fastest[key]["real_time"]:
            fastest[key] = b
    decode, chunkwise = {}, {}
    for key, b in fastest.items():
        parts = key.split("/")
        args = [int(p) for p in parts[1:] if p.isdigit()]
        seconds = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1}[b["time_unit"]]
        rule = RULE_ARGS[args[0]]
        if parts[0] == "BM_RuleDecodeStep":
            d, batch = args[1], args[2]
            decode[f"{rule}/{d}/{batch}"] = {
                "rule": rule, "d": d, "batch": batch, "seconds": seconds,
                "us_per_session_step": b["us_per_session_step"],
                "bound_gb_per_s": b["rmw_GBps"], "fraction_of_bound": b["frac_of_rmw"],
                "kernels": b.get("label", "")}
        else:
            d, tokens_ = args[1], args[2]
            if len(args) > 3 and args[3] == 1:
                rule += " (step)"
            chunkwise[f"{rule}/{d}/{tokens_}"] = {
                "rule": rule, "d": d, "tokens": tokens_, "seconds": seconds,
                "tokens_per_s": b["items_per_second"], "gflops": b["GFLOPs"],
                "gemm_peak_gflops": b["gemm_peak_GFLOPs"],
                "fraction_of_peak": b["frac_of_peak"]}
    return decode, chunkwise


def measure(build, quick):
    decode, chunkwise = engine(build, quick)
    peers = run_json([sys.executable, os.path.join(HERE, "peers", "torch_rule_peers.py")] +
                     (["--quick"] if quick else []))
    flat = {}
    for rule in ("gated", "gated_delta"):
        flat[rule] = run_json([os.path.join(build, "bin", "decode_flatness"), "--rule", rule,
                               "--positions", "1000,100000" if quick else "1000,1000000",
                               "--repeats", "11" if quick else "41"])
    for row in peers["rows"]:
        if row["op"] == "rule_decode":
            mine = decode.get(f"{row['rule']}/{row['d']}/{row['batch']}")
            if mine:
                mine["torch_seconds"] = row["seconds"]
                mine["torch_variant"] = row["variant"]
                mine["over_torch"] = row["seconds"] / mine["seconds"]
        elif row["op"] == "rule_chunkwise":
            mine = chunkwise.get(f"{row['rule']}/{row['d']}/{row['tokens']}")
            if mine:
                mine["torch_tokens_per_s"] = row["tokens_per_s"]
                mine["over_torch"] = mine["tokens_per_s"] / row["tokens_per_s"]
    return {"decode": decode, "chunkwise": chunkwise, "flatness": flat,
            "torch": peers["torch"], "quick": quick}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(json.dumps(measure(args.build, args.quick), indent=1))


if __name__ == "__main__":
    main()
