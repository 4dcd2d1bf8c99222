#!/usr/bin/python3
"""Time to first token with bf16 products against f32, at hidden 1024 × 12.

    /usr/bin/python3 bench/bf16_ttft_bench.py [--build build] [--types retnet,gla,...]
                                              [--prompt 4096] [--runs 3]

For each model type of bench/model_types_bench.py, its random model at hidden
1024 × 12 layers (BUILD/bench_models/<type>-large, written once by
tools/linattn_ref.py), BUILD/bin/model_benchmark times the prefill of a
random prompt of --prompt tokens twice over: with f32 products, and with
`--weights bf16 --prefill-precision bf16` (the projections' weights and the
rule's chunkwise products in bf16, fp32 sums), as a user would start the
server. The two runs of a type alternate, --runs times; the fastest of each
counts (the VM's speed drifts). The target: bf16 ≥ 1.6× f32. (rwkv7 at
head size 64 prefills its rule token by token, so there only the weights
change.)

bf16 products need AVX512_BF16 or AMX; on a CPU without them the script
says so and stops (exit status 0: nothing to measure there). JSON goes to
BUILD/bf16_ttft_bench.json, a Markdown table to stdout.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_types_bench  # noqa: E402

BF16 = ["--weights", "bf16", "--prefill-precision", "bf16"]


def log(msg):
    print(f"[bf16_ttft_bench] {msg}", file=sys.stderr, flush=True)


def ttft(build, path, prompt, extra):
    cmd = [os.path.join(build, "bin", "model_benchmark"), "--model", path,
           "--prompts", str(prompt), "--batches", "1", "--contexts", "100",
           "--decode-tokens", "2"] + extra
    log("+ " + " ".join(cmd))
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return json.loads(out.stdout)["ttft"][0]["seconds"], ""


def measure(build, types, prompt, runs):
    rows = []
    for model_type in types:
        path = model_types_bench.ensure_model(build, model_type, "large")
        best = {"f32": float("inf"), "bf16": float("inf")}
        for _ in range(runs):
            # bf16 first: a CPU without it is told at once.
            for name, extra in (("bf16", BF16), ("f32", [])):
                seconds, error = ttft(build, path, prompt, extra)
                if seconds is None:
                    if name == "bf16" and "AVX512_BF16" in error:
                        return {"skipped": error, "rows": []}
                    sys.exit(f"model_benchmark failed: {error}")
                best[name] = min(best[name], seconds)
        rows.append({"type": model_type, "f32_s": best["f32"], "bf16_s": best["bf16"],
                     "speedup": best["f32"] / best["bf16"]})
    return {"prompt_tokens": prompt, "runs": runs, "rows": rows}


def markdown(res):
    if res.get("skipped"):
        return f"skipped: {res['skipped']}"
    lines = [f"| type (hidden 1024 × 12) | TTFT {res['prompt_tokens']}, f32 "
             "| TTFT, bf16 weights and prefill | bf16 / f32 speed (≥ 1.6) |",
             "|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['type']} | {r['f32_s'] * 1e3:,.0f} ms | {r['bf16_s'] * 1e3:,.0f} ms "
                     f"| {r['speedup']:.2f}× |")
    lines.append("")
    lines.append(f"The fastest of {res['runs']} alternating runs of each.")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--types", default=",".join(model_types_bench.TYPES))
    p.add_argument("--prompt", type=int, default=4096)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    res = measure(args.build, args.types.split(","), args.prompt, args.runs)
    with open(os.path.join(args.build, "bf16_ttft_bench.json"), "w") as out:
        json.dump(res, out, indent=1)
    print(markdown(res))


if __name__ == "__main__":
    main()
