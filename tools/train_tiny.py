#!/usr/bin/python3
"""Trains linattn's built-in model and exports it in the fla layout.

The model: byte-level (vocab 256, no tokenizer file), 4 layers, hidden 256,
4 heads of 64, elu feature map (ELU+1), normalised (norm_feature_map), SwiGLU
MLP of 768, untied embeddings. Architecture and export come from
linattn_ref.py beside this file.

The text: the King James Version of the Bible (1611, public domain), read
with the `bible` program of Debian's bible-kjv / bible-kjv-text packages.
Verses are printed without their references, one per line. The last 2% of
verses are held out for the validation loss.

Deterministic: fixed seeds, fixed step count, a fixed thread count.

    /usr/bin/python3 tools/train_tiny.py --out models/tiny
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import linattn_ref  # noqa: E402  (first: it sets up OpenBLAS before torch loads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CONFIG = {
    "model_type": "linear_attn",
    "attn_mode": "chunk",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_heads": 4,
    "num_kv_heads": None,
    "expand_k": 1,
    "expand_v": 1,
    "feature_map": "elu",
    "tie_feature_map_qk": False,
    "norm_q": False,
    "norm_k": False,
    "norm_feature_map": True,
    "hidden_act": "swish",
    "hidden_ratio": 4,
    "intermediate_size": None,
    "norm_eps": 1e-6,
    "elementwise_affine": True,
    "vocab_size": 256,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": None,
    "max_position_embeddings": 2048,
}


def kjv_text():
    """The whole KJV, one verse per line, from Debian's `bible` program."""
    out = subprocess.run(["bible", "-f", "Genesis1:1-Revelation22:21"],
                         capture_output=True, check=True).stdout.decode("latin-1")
    lines = []
    for line in out.splitlines():
        m = re.match(r"^\S+\d+:\d+ (.*)$", line)
        if m:
            lines.append(m.group(1).strip())
    if len(lines) < 30000:
        raise SystemExit(f"expected the whole KJV (31102 verses), got {len(lines)} lines")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="models/tiny")
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1611)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="BF16", choices=["F32", "F16", "BF16"],
                   help="tensor dtype of the export (training is fp32)")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    verses = kjv_text()
    split = int(len(verses) * 0.98)
    train = np.frombuffer("\n".join(verses[:split]).encode("latin-1"), dtype=np.uint8)
    valid = np.frombuffer("\n".join(verses[split:]).encode("latin-1"), dtype=np.uint8)
    print(f"text: {len(verses)} verses, {len(train)} training bytes, {len(valid)} validation bytes")

    model = linattn_ref.LinearAttentionLM(linattn_ref.Config(CONFIG))
    with torch.no_grad():
        for name, w in model.named_parameters():
            if w.dim() == 2:
                w.normal_(0, 0.02)
            # down/o projections scaled by depth, as GPT-2 does
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                w.mul_(1 / math.sqrt(2 * CONFIG["num_hidden_layers"]))
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params} parameters")

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 50
    rng = np.random.default_rng(args.seed)

    def batch_of(data, n):
        starts = rng.integers(0, len(data) - args.seq - 1, n)
        x = np.stack([data[s:s + args.seq + 1] for s in starts]).astype(np.int64)
        x = torch.from_numpy(x)
        return x[:, :-1], x[:, 1:]

    def valid_loss():
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for s in range(0, len(valid) - args.seq - 1, args.seq * 4):
                x = torch.from_numpy(valid[s:s + args.seq + 1].astype(np.int64))[None]
                logits = model(x[:, :-1])
                total += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
                count += args.seq
        model.train()
        return total / count

    t0 = time.time()
    log = []
    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / warmup, 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batch_of(train, args.batch)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps:
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr:.2e}  {time.time() - t0:.0f} s",
                  flush=True)
    vl = valid_loss()
    elapsed = time.time() - t0
    print(f"validation loss {vl:.4f} nats/byte ({vl / math.log(2):.3f} bits/byte), {elapsed:.0f} s")

    linattn_ref.save_model(model, args.out, args.dtype)
    info = {
        "text": "King James Version of the Bible (public domain), Debian packages bible-kjv and "
                "bible-kjv-text, last 2% of verses held out",
        "steps": args.steps, "batch": args.batch, "seq": args.seq, "lr": args.lr,
        "seed": args.seed, "threads": args.threads, "parameters": params,
        "train_seconds": round(elapsed), "validation_loss_nats_per_byte": round(vl, 4),
        "validation_bits_per_byte": round(vl / math.log(2), 4), "export_dtype": args.dtype,
        "torch": torch.__version__,
    }
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
