#!/usr/bin/python3
"""Model serving numbers: linattn's forward against the PyTorch reference.

    /usr/bin/python3 bench/model_bench.py [--build build] [--quick]

For the built-in model (models/tiny) and a larger random model of the same
architecture (hidden 1024, 12 layers, 16 heads, written once into
BUILD/bench_models/large with tools/linattn_ref.py), it runs

  BUILD/bin/model_benchmark   time to first token (1k, 8k, 32k prompts),
                              decode tokens/s at batch 1, 8, 32, 128, decode
                              time per token at two context lengths, state
  tools/linattn_ref.py bench  the same model in PyTorch (Debian's
                              python3-torch on OpenBLAS), on the same
                              machine: decode with a recurrent state at
                              batch 1 and 32, and decode by recomputing the
                              whole 1k context per token (what fla's own
                              model does: its layer keeps no cache)

and prints one Markdown table with the ratios the targets are stated in:
linattn batch-1 decode / PyTorch's best batch-1 decode (target ≥ 5), and
linattn aggregate at 32 sessions / linattn batch 1 (target ≥ 8). JSON goes
to BUILD/model_bench.json.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REF = os.path.join(ROOT, "tools", "linattn_ref.py")


def run_json(cmd, env=None):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, env=env).stdout
    return json.loads(out)


def ensure_large(build):
    path = os.path.join(build, "bench_models", "large")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        subprocess.run([sys.executable, REF, "random", "--out", path, "--hidden-size", "1024",
                        "--layers", "12", "--num-heads", "16", "--vocab-size", "256",
                        "--feature-map", "elu", "--normalized", "--dtype", "BF16",
                        "--seed", "1"], check=True)
    return path


def measure(build, quick=False, prompts="1024,8192,32768", tiny_contexts="1000,100000"):
    """(name, linattn JSON, PyTorch JSON) for the built-in and the large model."""
    bench = os.path.join(build, "bin", "model_benchmark")
    models = [("built-in (models/tiny)", os.path.join(ROOT, "models", "tiny"),
               prompts, tiny_contexts),
              ("random hidden 1024 × 12 layers", ensure_large(build), prompts, "1000,32768")]
    if quick:
        models = [(n, d, "1024,4096", "1000,8192") for n, d, _, _ in models]
    rows = []
    for name, path, model_prompts, contexts in models:
        ours = run_json([bench, "--model", path, "--prompts", model_prompts,
                         "--contexts", contexts, "--batches", "1,8,32,128",
                         "--decode-tokens", "16" if quick else "48"])
        ours["dir"] = path
        ref = run_json([sys.executable, REF, "bench", "--model", path, "--prompt-tokens", "1024",
                        "--decode-tokens", "8" if quick else "32", "--batches", "32",
                        "--recompute-tokens", "2"])
        rows.append((name, ours, ref))
    return rows


def decode_rate(ours, batch):
    return next(d for d in ours["decode"] if d["batch"] == batch)["aggregate_tokens_per_s"]


def batching_ceiling(ours, batch=32):
    """batch × (batch-1 step) / (products + state updates alone at `batch`).

    model_benchmark times a step's projections alone and its state updates
    alone at each batch size; a step runs the two one after the other, so
    no step of `batch` sessions is faster than their sum, and the aggregate
    over batch 1 cannot pass this ratio at today's batch-1 speed."""
    one = next(d for d in ours["decode"] if d["batch"] == 1)
    many = next(d for d in ours["decode"] if d["batch"] == batch)
    return batch * one["step_seconds"] / (many["products_step_seconds"] +
                                          many["rule_step_seconds"])


def markdown(rows):
    def fmt(x, unit=""):
        if x >= 100:
            return f"{x:,.0f}{unit}"
        return f"{x:.3g}{unit}"

    lines = ["| | " + " | ".join(n for n, _, _ in rows) + " |",
             "|---|" + "---|" * len(rows)]

    def row(label, values):
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    row("parameters", [f"{o['parameters'] / 1e6:.1f} M" for _, o, _ in rows])
    row("state per session", [f"{o['state_bytes_per_session'] / 1024:,.0f} KiB"
                              for _, o, _ in rows])
    for i in range(len(rows[0][1]["ttft"])):
        n = rows[0][1]["ttft"][i]["prompt_tokens"]
        row(f"time to first token, {n:,}-token prompt",
            [f"{o['ttft'][i]['seconds'] * 1e3:,.0f} ms "
             f"({fmt(o['ttft'][i]['prefill_tokens_per_s'])} tok/s)" for _, o, _ in rows])
    dec = {}
    for _, o, _ in rows:
        for d in o["decode"]:
            dec.setdefault(d["batch"], []).append(d)
    row("decode, 1 session", [f"{fmt(d['aggregate_tokens_per_s'])} tok/s" for d in dec[1]])
    for b in sorted(dec):
        if b == 1:
            continue
        row(f"decode, {b} sessions (aggregate)",
            [f"{fmt(d['aggregate_tokens_per_s'])} tok/s "
             f"({fmt(d['tokens_per_s_per_session'])} per session)" for d in dec[b]])
    row("aggregate at 32 / batch 1 (target ≥ 8)",
        [f"**{b32['aggregate_tokens_per_s'] / b1['aggregate_tokens_per_s']:.1f}×**"
         for b1, b32 in zip(dec[1], dec[32])])
    row("ceiling: 32 × batch-1 step / (products + state updates alone at 32)",
        [f"{batching_ceiling(o):.1f}×" for _, o, _ in rows])
    for i in range(2):
        row(f"decode per token at context {rows[0][1]['flatness'][i]['context_tokens']:,} "
            f"/ {rows[1][1]['flatness'][i]['context_tokens']:,}",
            [f"{o['flatness'][i]['decode_step_seconds'] * 1e3:.3f} ms" for _, o, _ in rows])
    row("long / short context decode time",
        [f"{o['flatness'][1]['decode_step_seconds'] / o['flatness'][0]['decode_step_seconds']:.3f}"
         for _, o, _ in rows])
    row("PyTorch reference: decode, 1 session, recurrent state",
        [f"{fmt(r['recurrent_decode_tokens_per_s'])} tok/s" for _, _, r in rows])
    row("PyTorch reference: decode, 32 sessions, recurrent state",
        [f"{fmt(r['recurrent_decode_aggregate_tokens_per_s_b32'])} tok/s" for _, _, r in rows])
    row("PyTorch reference: decode by recomputing a 1k context (fla's model)",
        [f"{fmt(r['recompute_decode_tokens_per_s'])} tok/s" for _, _, r in rows])
    row("linattn / PyTorch best, 1 session (target ≥ 5)",
        [f"**{d['aggregate_tokens_per_s'] / r['recurrent_decode_tokens_per_s']:.1f}×**"
         for d, (_, _, r) in zip(dec[1], rows)])
    row("linattn / PyTorch recompute, 1 session",
        [f"{d['aggregate_tokens_per_s'] / r['recompute_decode_tokens_per_s']:,.0f}×"
         for d, (_, _, r) in zip(dec[1], rows)])
    row("linattn / PyTorch, 32 sessions",
        [f"{d['aggregate_tokens_per_s'] / r['recurrent_decode_aggregate_tokens_per_s_b32']:.1f}×"
         for d, (_, _, r) in zip(dec[32], rows)])
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--quick", action="store_true", help="shorter prompts and fewer steps")
    args = p.parse_args()
    rows = measure(args.build, args.quick)
    print(markdown(rows))
    with open(os.path.join(args.build, "model_bench.json"), "w") as f:
        json.dump([{"model": n, "linattn": o, "pytorch": r} for n, o, r in rows], f, indent=2)


if __name__ == "__main__":
    main()
