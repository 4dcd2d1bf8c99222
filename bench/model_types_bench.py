#!/usr/bin/python3
"""fla's model types served by linattn, against the PyTorch reference.

    /usr/bin/python3 bench/model_types_bench.py [--build build] [--quick]
                                                [--types retnet,gla,...]
                                                [--weights f32|bf16|int8]

For each of retnet, gla, delta_net, gated_deltanet, mamba2, rwkv7, rwkv6,
granitemoehybrid (a Granite 4.0-H-shaped hybrid with experts) and qwen3_next
(a Qwen3-Next-shaped hybrid with experts), at the
built-in model's size (hidden 256, 4 layers) and at hidden 1024 × 12 layers
(random BF16 models written once into BUILD/bench_models/<type>-<size> by
tools/linattn_ref.py, each with fla's default head shapes for its type), it
runs

  BUILD/bin/model_benchmark   time to first token of a 4k prompt, decode
                              tokens/s at batch 1 and 32 (one batched
                              forward per token), decode time per token at
                              contexts 1k and 100k
  tools/linattn_ref.py bench  the same model in PyTorch (Debian's
                              python3-torch): prefill of the same 4k prompt
                              and recurrent decode at batch 1

and prints one Markdown table with the ratios the targets are stated in:
batch-1 decode / PyTorch's (≥ 5), aggregate at 32 / batch 1 (≥ 8), PyTorch's
4k prefill / linattn's time to first token (≥ 5), and decode time at 100k /
at 1k (flat: within 10%). linattn's packed weights are f32 unless --weights
says otherwise (bf16 needs native bf16 products; the PyTorch side stays
fp32). JSON goes to BUILD/model_types_bench.json (model_types_bench-<weights>
.json for bf16 and int8).
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_bench  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REF = os.path.join(ROOT, "tools", "linattn_ref.py")
TYPES = ("retnet", "gla", "delta_net", "gated_deltanet", "mamba2", "rwkv7", "rwkv6",
         "granitemoehybrid", "qwen3_next")

# tools/linattn_ref.py random options per type and size: fla's default head
# shapes for the type (RetNet expand_v 2, GLA expand_k 0.5, Gated DeltaNet
# expand_v 2, Mamba-2 expand 2 with 64-wide heads, RWKV-7's and RWKV-6's 64-wide
# heads with LoRA ranks of their published sizes: RWKV-6's keys and values as
# wide as the hidden size, its mix LoRA 32 and decay LoRA 64), scaled to the
# hidden size.
SHAPES = {
    ("retnet", "small"): ["--num-heads", "4", "--expand-v", "2"],
    ("retnet", "large"): ["--num-heads", "8", "--expand-v", "2"],
    ("gla", "small"): ["--num-heads", "4", "--expand-k", "0.5"],
    ("gla", "large"): ["--num-heads", "4", "--expand-k", "0.5"],
    ("delta_net", "small"): ["--num-heads", "4"],
    ("delta_net", "large"): ["--num-heads", "8"],
    ("gated_deltanet", "small"): ["--num-heads", "4", "--head-dim", "64", "--expand-v", "2"],
    ("gated_deltanet", "large"): ["--num-heads", "4", "--head-dim", "128", "--expand-v", "2"],
    ("mamba2", "small"): ["--head-dim", "64", "--state-size", "64"],
    ("mamba2", "large"): ["--head-dim", "64", "--state-size", "128"],
    ("rwkv7", "small"): ["--head-dim", "64", "--low-rank-dim", "32"],
    ("rwkv7", "large"): ["--head-dim", "64", "--low-rank-dim", "64"],
    ("rwkv6", "small"): ["--num-heads", "4", "--expand-k", "1", "--low-rank-dim", "32"],
    ("rwkv6", "large"): ["--num-heads", "16", "--expand-k", "1", "--low-rank-dim", "32"],
    # Granite 4.0-H's shapes scaled down: 64-wide Mamba heads of state 128,
    # one attention layer in four (full attention, no rotary, 64-wide heads,
    # a third of them key/value heads), experts a third of the hidden size
    # with 6 of 32 chosen (H-Tiny: 6 of 64 at 512 of 1536) beside a shared
    # MLP as wide as the hidden size.
    ("granitemoehybrid", "small"): [
        "--layer-types", "mamba,mamba,mamba,attention", "--num-heads", "4",
        "--num-kv-heads", "2", "--nope", "--head-dim", "64", "--state-size", "128",
        "--num-experts", "16", "--experts-per-token", "4", "--intermediate-size", "96",
        "--shared-intermediate-size", "256"],
    ("granitemoehybrid", "large"): [
        "--layer-types", ",".join(["mamba", "mamba", "attention"] * 4), "--num-heads", "16",
        "--num-kv-heads", "4", "--nope", "--head-dim", "64", "--state-size", "128",
        "--num-experts", "32", "--experts-per-token", "6", "--intermediate-size", "352",
        "--shared-intermediate-size", "1024"],
    # Qwen3-Next-80B-A3B's shapes scaled down: Gated DeltaNet layers with
    # twice as many value heads as key heads (GVA) whose values are twice
    # the hidden size, gated attention in one layer in four with heads
    # twice the hidden size in all, a quarter of them rotated, 1/8 as many
    # key/value heads; 10 of 512 experts a quarter of the hidden size wide
    # scaled to 8 of 64 (small) and 8 of 128 (large), a shared expert as
    # wide as one.
    ("qwen3_next", "small"): [
        "--layer-types", "linear_attention,linear_attention,linear_attention,full_attention",
        "--num-heads", "4", "--num-kv-heads", "1", "--head-dim", "128",
        "--linear-key-heads", "2", "--num-v-heads", "4", "--linear-head-dim", "128",
        "--num-experts", "64", "--experts-per-token", "8", "--moe-intermediate-size", "64",
        "--shared-intermediate-size", "64", "--partial-rotary-factor", "0.25"],
    ("qwen3_next", "large"): [
        "--layer-types", ",".join((["linear_attention"] * 3 + ["full_attention"]) * 3),
        "--num-heads", "8", "--num-kv-heads", "1", "--head-dim", "256",
        "--linear-key-heads", "8", "--num-v-heads", "16", "--linear-head-dim", "128",
        "--num-experts", "128", "--experts-per-token", "8", "--moe-intermediate-size", "256",
        "--shared-intermediate-size", "256", "--partial-rotary-factor", "0.25"],
}
# Decode time at a long context against 1k: flat for the recurrent types;
# the hybrids' attention layers read every key and value so far (full
# attention), so their step grows with the context, measured at 10k (a 100k
# context's prefill is quadratic in its attention layers).
LONG_CONTEXT = {"granitemoehybrid": "10000", "qwen3_next": "10000"}
SIZES = {"small": ("built-in size (hidden 256 × 4)", ["--hidden-size", "256", "--layers", "4"]),
         "large": ("hidden 1024 × 12", ["--hidden-size", "1024", "--layers", "12"])}


def log(msg):
    print(f"[model_types_bench] {msg}", file=sys.stderr, flush=True)


def run_json(cmd):
    log("+ " + " ".join(cmd))
    return json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout)


def ensure_model(build, model_type, size):
    path = os.path.join(build, "bench_models", f"{model_type}-{size}")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        subprocess.run([sys.executable, REF, "random", "--out", path, "--model-type", model_type,
                        "--vocab-size", "256", "--dtype", "BF16", "--seed", "1"] +
                       SIZES[size][1] + SHAPES[(model_type, size)], check=True)
    return path


def machine_limits(build):
    """This machine's fp32 GEMM peak (GFLOP/s), measured now."""
    data = run_json([os.path.join(build, "bin", "attention_benchmark"),
                     "--benchmark_filter=BM_GemmPeak", "--benchmark_format=json",
                     "--benchmark_repetitions=3"])
    return max(b["GFLOPs"] for b in data["benchmarks"]
               if b.get("run_type", "iteration") == "iteration")


def measure(build, quick=False, types=TYPES, weights="f32"):
    prompt = 1024 if quick else 4096
    contexts = "1000,8000" if quick else "1000,100000"
    rows = []
    gemm_gflops = machine_limits(build)
    for size in ("small", "large"):
        for model_type in types:
            path = ensure_model(build, model_type, size)
            long_context = LONG_CONTEXT.get(model_type)
            ours = run_json([os.path.join(build, "bin", "model_benchmark"), "--model", path,
                             "--prompts", str(prompt), "--batches", "1,32",
                             "--contexts",
                             contexts if long_context is None or quick
                             else "1000," + long_context,
                             "--decode-tokens", "16" if quick else "32",
                             "--weights", weights])
            ref = run_json([sys.executable, REF, "bench", "--model", path,
                            "--prompt-tokens", str(prompt),
                            "--decode-tokens", "4" if quick else "8",
                            "--recompute-tokens", "0"])
            rows.append({"type": model_type, "size": size, "label": SIZES[size][0],
                         "linattn": ours, "pytorch": ref})
    return {"prompt_tokens": prompt, "gemm_gflops": gemm_gflops, "weights": weights,
            "rows": rows}


def ratios(row, gemm_gflops):
    o, r = row["linattn"], row["pytorch"]
    b1 = next(d for d in o["decode"] if d["batch"] == 1)["aggregate_tokens_per_s"]
    b32 = next(d for d in o["decode"] if d["batch"] == 32)["aggregate_tokens_per_s"]
    ttft = o["ttft"][0]["seconds"]
    flat = o["flatness"][1]["decode_step_seconds"] / o["flatness"][0]["decode_step_seconds"]
    # What the batch-32 step does with the machine: 32 rows of every product
    # but the embedding lookup (2 flops per weight), as GFLOP/s and as a
    # fraction of the GEMM peak measured at the same time.
    b32_gflops = 32 * 2 * (o["parameters"] - 256 * o["hidden_size"]) / (32 / b32) / 1e9
    return {"b32_gflops": b32_gflops, "b32_of_peak": b32_gflops / gemm_gflops,
            "decode_b1": b1, "decode_b32": b32, "ttft_s": ttft,
            "torch_decode_b1": r["recurrent_decode_tokens_per_s"],
            "torch_prefill_s": r["prefill_s"],
            "decode_over_torch": b1 / r["recurrent_decode_tokens_per_s"],
            "b32_over_b1": b32 / b1,
            "ceiling": model_bench.batching_ceiling(o),
            "ttft_over_torch": r["prefill_s"] / ttft,
            "long_over_short": flat,
            "contexts": [f["context_tokens"] for f in o["flatness"]],
            "state_bytes": o["state_bytes_per_session"], "parameters": o["parameters"]}


def markdown(res):
    def f(x):
        return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
    lines = [f"| type, size | params | state | decode b1 tok/s (PyTorch) | ×PyTorch (≥ 5) "
             f"| b32 tok/s (GFLOP/s, of peak) | b32/b1 (≥ 8) | TTFT {res['prompt_tokens']} (PyTorch) "
             f"| ×PyTorch (≥ 5) | decode ms at 1k / long | long/1k |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    weights = "" if res.get("weights", "f32") == "f32" else f", {res['weights']} weights"
    for row in res["rows"]:
        q = ratios(row, res["gemm_gflops"])
        o = row["linattn"]
        lines.append(
            f"| {row['type']}, {row['label']}{weights} | {q['parameters'] / 1e6:.1f} M "
            f"| {q['state_bytes'] / 1024:,.0f} KiB "
            f"| {f(q['decode_b1'])} ({f(q['torch_decode_b1'])}) | {q['decode_over_torch']:.1f}× "
            f"| {f(q['decode_b32'])} ({q['b32_gflops']:.0f}, {q['b32_of_peak']:.2f}) "
            f"| {q['b32_over_b1']:.1f}× (ceiling {q['ceiling']:.1f}×) "
            f"| {q['ttft_s'] * 1e3:,.0f} ms ({q['torch_prefill_s']:.1f} s) "
            f"| {q['ttft_over_torch']:.1f}× "
            f"| {o['flatness'][0]['decode_step_seconds'] * 1e3:.2f} / "
            f"{o['flatness'][1]['decode_step_seconds'] * 1e3:.2f} ({q['contexts'][1]:,}) "
            f"| {q['long_over_short']:.3f} |")
    lines.append("")
    lines.append(f"fp32 GEMM peak (n = 2048) measured at the same time: "
                 f"{res['gemm_gflops']:.0f} GFLOP/s; a batch-32 step's GFLOP/s count the "
                 "products of all 32 rows.")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--quick", action="store_true", help="shorter prompts and contexts")
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--weights", default="f32", choices=["f32", "bf16", "int8"],
                   help="linattn's packed projection weights")
    args = p.parse_args()
    res = measure(args.build, args.quick, args.types.split(","), args.weights)
    name = "model_types_bench" + ("" if args.weights == "f32" else f"-{args.weights}")
    with open(os.path.join(args.build, name + ".json"), "w") as out:
        json.dump(res, out, indent=1)
    print(markdown(res))


if __name__ == "__main__":
    main()
