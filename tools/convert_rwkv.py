#!/usr/bin/python3
"""Converts an RWKV-7 or RWKV-6 checkpoint in BlinkDL's own format (the .pth
state dict RWKV-LM trains and publishes: blocks.N.att.*, blocks.N.ffn.*, emb,
ln0, ln_out, head) into the model directory linattn loads: fla's rwkv7 or
rwkv6 layout (config.json + model.safetensors).

    /usr/bin/python3 tools/convert_rwkv.py MODEL.pth OUT_DIR [--vocab rwkv_vocab_v20230424.txt]
                                           [--dtype auto|F32|F16|BF16]
    /usr/bin/python3 tools/convert_rwkv.py --state STATE.pth OUT.safetensors

The second form converts an RWKV-7 or RWKV-6 state file (state tuning's output: one
blocks.N.att.time_state of (heads, head size, head size) per layer, each
head's S as RWKV keeps it, value x key) into the safetensors file
linattn-server --initial-state reads; names and orientation are kept.

The names follow BlinkDL's RWKV-v7 code (RWKV-LM at its RWKV-v7 folder:
rwkv_v7_demo.py's RWKV_Tmix_x070 / RWKV_CMix_x070 and the weight table of
train_temp/README.md), mapped as fla's utils/convert_from_rwkv7.py maps them:

    emb.weight            -> model.embeddings.weight
    blocks.0.ln0.*        -> model.layers.0.pre_norm.*      (norm_first)
    blocks.N.ln1.*, ln2.* -> model.layers.N.attn_norm.*, ffn_norm.*
    blocks.N.att.x_[rwkvag], k_k, k_a, r_k                  (as they are)
    blocks.N.att.receptance/key/value/output.weight -> attn.r_proj/k_proj/v_proj/o_proj
    blocks.N.att.ln_x.*   -> attn.g_norm.*
    blocks.N.att.{w,a,v,g}1 (C x r)  -> attn.{w,a,v,g}_lora.lora.0.weight (transposed)
    blocks.N.att.{w,a,v,g}2 (r x C)  -> attn.{w,a,v,g}_lora.lora.2.weight (transposed)
    blocks.N.att.{w,a,v}0 (1,1,C)    -> attn.{w,a,v}_lora.lora.2.bias
    blocks.N.ffn.x_k, key.weight, value.weight -> ffn.x_k (a vector), ffn.key/value.weight
    ln_out.*              -> model.norm.*
    head.weight           -> lm_head.weight

and layer 0's v0/v1/v2, which BlinkDL's checkpoints carry but never use, are
dropped. The config is inferred from the shapes (vocabulary, hidden size,
layers, head size from r_k, the four LoRA ranks, the channel mix's width)
with BlinkDL's numerics: LayerNorms with bias at eps 1e-5, the group norm's
eps 64e-5 (fla's head_dim x norm_eps, so the head size must be 64, as in
every RWKV-7 BlinkDL publishes), kappa-hat through F.normalize (fuse_norm
false), and token 0 as end of text (RWKV's pipelines stop there).

RWKV-6 checkpoints (blocks.N.att.time_maa_x present) follow BlinkDL's RWKV-6
code (RWKV-LM's RWKV-v5/rwkv_v6_demo.py, RWKV_Tmix_x060 / RWKV_CMix_x060 and
its RNN-mode time_mixing / channel_mixing), mapped as fla's
utils/convert_from_rwkv6.py maps the same tensors:

    blocks.N.att.time_maa_x (1,1,C)  -> attn.x_proj.0.mu
    blocks.N.att.time_maa_w1 (C,5D)  -> attn.x_proj.0.linear.weight (5D x C), its five
                                        groups reordered from BlinkDL's w,k,v,r,g to r,w,k,v,g
    blocks.N.att.time_maa_w2 (5,D,C) -> attn.x_proj.2.weight (C x 5D), likewise
    blocks.N.att.time_maa_{r,w,k,v,g} -> attn.x_bias (5 x C), rows r, w, k, v, g
    blocks.N.att.time_decay (1,1,A)  -> attn.w_proj.linear.lora.2.bias
    blocks.N.att.time_decay_w1, _w2  -> attn.w_proj.linear.lora.0, .2 .weight (transposed)
    blocks.N.att.time_faaaa (H,S)    -> attn.bonus
    blocks.N.att.receptance/key/value/gate.weight -> attn.r/k/v/g_proj.linear.weight
    blocks.N.att.output.weight, ln_x.* -> attn.o_proj.weight, attn.g_norm.*
    blocks.N.ffn.time_maa_k, time_maa_r -> ffn.key.mu, ffn.receptance.mu
    blocks.N.ffn.key/receptance.weight -> ffn.key/receptance.linear.weight; ffn.value.weight
    (emb, ln0, ln1, ln2, ln_out, head as for RWKV-7)

with BlinkDL's numerics: LayerNorms with bias at eps 1e-5 and the group norm
at 64e-5, written as linattn_group_norm_eps (fla's own RWKV6Attention would
take norm_eps there; fla ignores the field).

The file is read with torch.load(weights_only=True): tensors only, never code.
With --vocab the World tokenizer's vocabulary is copied beside the model
(linattn reads it as the model's tokenizer).
"""

import argparse
import json
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import linattn_ref  # noqa: E402  (sets up OpenBLAS before torch loads)
from convert_bin import DTYPES, read_tensor_file  # noqa: E402

torch = linattn_ref.torch
VOCAB_FILE = "rwkv_vocab_v20230424.txt"


def shape(sd, name):
    if name not in sd:
        raise ValueError(f"{name} is missing (not an RWKV-7 or RWKV-6 checkpoint in "
                         "BlinkDL's names?)")
    return tuple(sd[name].shape)


def is_rwkv6(sd):
    return "blocks.0.att.time_maa_x" in sd


def count_layers(sd):
    layers = 0
    while f"blocks.{layers}.ffn.key.weight" in sd:
        layers += 1
    if layers == 0:
        raise ValueError("blocks.0.ffn.key.weight is missing (not an RWKV checkpoint "
                         "in BlinkDL's names?)")
    return layers


# BlinkDL's RWKV-6 group norm: eps 1e-5 x head_size_divisor^2 = 64e-5 (its RNN
# code writes 64e-5 whatever the head size).
RWKV6_GROUP_NORM_EPS = 64e-5


def infer_config_v6(sd):
    vocab, hidden = shape(sd, "emb.weight")
    layers = count_layers(sd)
    heads, head_size = shape(sd, "blocks.0.att.time_faaaa")
    dim_att = shape(sd, "blocks.0.att.receptance.weight")[0]
    if heads * head_size != dim_att:
        raise ValueError(f"blocks.0.att.time_faaaa is {heads} x {head_size}, not heads x "
                         f"head size of the attention's {dim_att} channels")
    mix_cols = shape(sd, "blocks.0.att.time_maa_w1")[1]
    if mix_cols % 5:
        raise ValueError(f"blocks.0.att.time_maa_w1 has {mix_cols} columns, not 5 x a rank")
    intermediate, _ = shape(sd, "blocks.0.ffn.key.weight")
    tied = "head.weight" not in sd
    return {
        "model_type": "rwkv6", "vocab_size": vocab, "hidden_size": hidden,
        "num_hidden_layers": layers, "num_heads": heads,
        "expand_k": dim_att / hidden, "expand_v": dim_att / hidden,
        "proj_low_rank_dim": mix_cols // 5,
        "gate_low_rank_dim": shape(sd, "blocks.0.att.time_decay_w1")[1],
        "intermediate_size": intermediate, "hidden_ratio": intermediate / hidden,
        "hidden_act": "sqrelu", "norm_eps": 1e-5, "linattn_group_norm_eps": RWKV6_GROUP_NORM_EPS,
        "norm_bias": True, "norm_first": "blocks.0.ln0.weight" in sd, "fuse_norm": True,
        "attn": None, "attn_mode": "chunk",
        "tie_word_embeddings": tied, "bos_token_id": None, "eos_token_id": 0,
    }


def infer_config(sd):
    if is_rwkv6(sd):
        return infer_config_v6(sd)
    vocab, hidden = shape(sd, "emb.weight")
    layers = count_layers(sd)
    heads, head_size = shape(sd, "blocks.0.att.r_k")
    if heads * head_size != hidden:
        raise ValueError(f"blocks.0.att.r_k is {heads} x {head_size}, not heads x head size "
                         f"of hidden {hidden}")
    if head_size != 64:
        raise ValueError(f"head size {head_size}: BlinkDL's group norm eps is 64e-5 whatever "
                         "the head size, fla's layout ties it to head_dim x norm_eps; only "
                         "head size 64 converts exactly")
    intermediate, _ = shape(sd, "blocks.0.ffn.key.weight")
    ranks = {}
    for field, name in (("decay_low_rank_dim", "w1"), ("a_low_rank_dim", "a1"),
                        ("gate_low_rank_dim", "g1")):
        ranks[field] = shape(sd, f"blocks.0.att.{name}")[1]
    # Layer 0's v LoRA is unused; the first real one is layer 1's.
    ranks["v_low_rank_dim"] = (shape(sd, "blocks.1.att.v1")[1] if layers > 1
                               else 32)
    tied = "head.weight" not in sd
    return {
        "model_type": "rwkv7", "vocab_size": vocab, "hidden_size": hidden,
        "num_hidden_layers": layers, "head_dim": head_size, "num_heads": heads,
        "intermediate_size": intermediate, "hidden_ratio": intermediate / hidden,
        "value_dim": [hidden] * layers, **ranks, "hidden_act": "sqrelu",
        "norm_eps": 1e-5, "norm_bias": True, "norm_first": "blocks.0.ln0.weight" in sd,
        "fuse_norm": False, "attn": None, "attn_mode": "chunk",
        "tie_word_embeddings": tied, "bos_token_id": None, "eos_token_id": 0,
    }


def fla_name(name, layers):
    """BlinkDL's name -> (fla's name or None to drop it, transposed)."""
    top = {"emb.weight": "model.embeddings.weight", "ln_out.weight": "model.norm.weight",
           "ln_out.bias": "model.norm.bias", "head.weight": "lm_head.weight"}
    if name in top:
        return top[name], False
    m = re.fullmatch(r"blocks\.(\d+)\.(att|ffn|ln0|ln1|ln2)\.(.+)", name)
    if m is None or int(m.group(1)) >= layers:
        raise ValueError(f"{name}: not a tensor of an RWKV-7 model")
    i, part, rest = int(m.group(1)), m.group(2), m.group(3)
    base = f"model.layers.{i}."
    if part in ("ln0", "ln1", "ln2"):
        if part == "ln0" and i != 0:
            raise ValueError(f"{name}: ln0 belongs to layer 0 only")
        return base + {"ln0": "pre_norm", "ln1": "attn_norm", "ln2": "ffn_norm"}[part] + \
            "." + rest, False
    if part == "ffn":
        if rest not in ("x_k", "key.weight", "value.weight"):
            raise ValueError(f"{name}: not a tensor of RWKV-7's channel mix")
        return base + "ffn." + rest, False
    lora = re.fullmatch(r"([wavg])([012])", rest)
    if lora:
        kind, slot = lora.groups()
        if kind == "v" and i == 0:
            return None, False  # unused in layer 0 (BlinkDL keeps it anyway)
        if kind == "g" and slot == "0":
            raise ValueError(f"{name}: RWKV-7's gate LoRA has no bias")
        return (base + f"attn.{kind}_lora.lora." + {"0": "2.bias", "1": "0.weight",
                                                    "2": "2.weight"}[slot], slot != "0")
    proj = {"receptance.weight": "r_proj.weight", "key.weight": "k_proj.weight",
            "value.weight": "v_proj.weight", "output.weight": "o_proj.weight",
            "ln_x.weight": "g_norm.weight", "ln_x.bias": "g_norm.bias"}
    if rest in proj:
        return base + "attn." + proj[rest], False
    if rest in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "k_k", "k_a", "r_k"):
        return base + "attn." + rest, False
    raise ValueError(f"{name}: not a tensor of RWKV-7's time mix")


# fla's shapes where they differ from BlinkDL's (1, 1, C) vectors.
VECTORS = re.compile(r"\.attn\.(k_k|k_a)$|\.ffn\.x_k$|_lora\.lora\.2\.bias$")

# RWKV-6: BlinkDL's time-mix tensors that map one to one (fla's name, transposed).
RWKV6_ATT = {
    "time_maa_x": ("x_proj.0.mu", False),
    "time_decay": ("w_proj.linear.lora.2.bias", False),
    "time_decay_w1": ("w_proj.linear.lora.0.weight", True),
    "time_decay_w2": ("w_proj.linear.lora.2.weight", True),
    "time_faaaa": ("bonus", False),
    "receptance.weight": ("r_proj.linear.weight", False),
    "key.weight": ("k_proj.linear.weight", False),
    "value.weight": ("v_proj.linear.weight", False),
    "gate.weight": ("g_proj.linear.weight", False),
    "output.weight": ("o_proj.weight", False),
    "ln_x.weight": ("g_norm.weight", False),
    "ln_x.bias": ("g_norm.bias", False),
}
RWKV6_FFN = {
    "time_maa_k": "key.mu", "time_maa_r": "receptance.mu",
    "key.weight": "key.linear.weight", "receptance.weight": "receptance.linear.weight",
    "value.weight": "value.weight",
}
# BlinkDL's order of the five mixes (w, k, v, r, g) and fla's (r, w, k, v, g).
BLINKDL_MIXES = ("w", "k", "v", "r", "g")
FLA_MIXES = ("r", "w", "k", "v", "g")


def rwkv6_tensors(sd, layers):
    """fla's rwkv6 tensors (float32 numpy) from BlinkDL's names."""
    f32 = {n: t.detach().to(torch.float32) for n, t in sd.items()}
    out, used = {}, set()

    def take(name):
        used.add(name)
        return f32[name]

    for name, target in (("emb.weight", "model.embeddings.weight"),
                         ("ln_out.weight", "model.norm.weight"),
                         ("ln_out.bias", "model.norm.bias"), ("head.weight", "lm_head.weight")):
        if name in f32:
            out[target] = take(name)
    for i in range(layers):
        b, base = f"blocks.{i}.", f"model.layers.{i}."
        for norm, target in (("ln0", "pre_norm"), ("ln1", "attn_norm"), ("ln2", "ffn_norm")):
            for part in ("weight", "bias"):
                name = f"{b}{norm}.{part}"
                if name in f32:
                    if norm == "ln0" and i != 0:
                        raise ValueError(f"{name}: ln0 belongs to layer 0 only")
                    out[f"{base}{target}.{part}"] = take(name)
        a = b + "att."
        for src, (target, transposed) in RWKV6_ATT.items():
            t = take(a + src) if a + src in f32 else None
            if t is None:
                raise ValueError(f"{a + src} is missing (not an RWKV-6 checkpoint in "
                                 "BlinkDL's names?)")
            t = t.t() if transposed else t
            out[base + "attn." + target] = t.reshape(-1) if t.dim() == 3 else t
        hidden = f32["emb.weight"].shape[1]
        w1 = take(a + "time_maa_w1")  # (C, 5D), groups w, k, v, r, g
        w2 = take(a + "time_maa_w2")  # (5, D, C)
        groups1 = dict(zip(BLINKDL_MIXES, w1.reshape(hidden, 5, -1).unbind(1)))
        groups2 = dict(zip(BLINKDL_MIXES, w2.unbind(0)))
        out[base + "attn.x_proj.0.linear.weight"] = torch.cat(
            [groups1[m] for m in FLA_MIXES], 1).t()
        out[base + "attn.x_proj.2.weight"] = torch.cat([groups2[m] for m in FLA_MIXES], 0).t()
        out[base + "attn.x_bias"] = torch.stack(
            [take(a + "time_maa_" + m).reshape(-1) for m in FLA_MIXES])
        f = b + "ffn."
        for src, target in RWKV6_FFN.items():
            if f + src not in f32:
                raise ValueError(f"{f + src} is missing (not an RWKV-6 checkpoint in "
                                 "BlinkDL's names?)")
            t = take(f + src)
            out[base + "ffn." + target] = t.reshape(-1) if t.dim() == 3 else t
    stray = sorted(set(f32) - used)
    if stray:
        raise ValueError(f"{stray[0]}: not a tensor of an RWKV-6 model")
    return {n: t.contiguous().numpy() for n, t in out.items()}


def convert(pth, out, vocab=None, dtype="auto"):
    sd = read_tensor_file(pth)
    config = infer_config(sd)
    layers = config["num_hidden_layers"]
    tensors = {}
    if config["model_type"] == "rwkv6":
        tensors = rwkv6_tensors(sd, layers)
    for name, t in sd.items() if config["model_type"] == "rwkv7" else ():
        target, transposed = fla_name(name, layers)
        if target is None:
            continue
        a = t.detach().to(torch.float32)
        if transposed:
            a = a.t()
        if VECTORS.search(target):
            a = a.reshape(-1)
        tensors[target] = a.contiguous().numpy()
    if dtype == "auto":
        kinds = {DTYPES[t.dtype] for t in sd.values()}
        dtype = kinds.pop() if len(kinds) == 1 else "F32"
    os.makedirs(out, exist_ok=True)
    linattn_ref.write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    if vocab is not None:
        shutil.copyfile(vocab, os.path.join(out, VOCAB_FILE))
    return config, dtype, len(tensors)


def convert_state(pth, out):
    """A state file's blocks.N.att.time_state tensors, as they are, into
    safetensors (F32)."""
    sd = read_tensor_file(pth)
    layers = 0
    while f"blocks.{layers}.att.time_state" in sd:
        layers += 1
    if layers == 0:
        raise ValueError(f"{pth}: holds no blocks.0.att.time_state (not an RWKV state file)")
    shapes = set()
    for name, t in sd.items():
        m = re.fullmatch(r"blocks\.(\d+)\.att\.time_state", name)
        if m is None or int(m.group(1)) >= layers:
            raise ValueError(f"{pth}: {name}: an RWKV state file holds "
                             "blocks.<i>.att.time_state for layers 0, 1, ... alone")
        if t.dim() != 3:
            raise ValueError(f"{pth}: {name} has shape {tuple(t.shape)}, not (heads, head "
                             "size, head size)")
        shapes.add(tuple(t.shape))
    if len(shapes) != 1:
        raise ValueError(f"{pth}: the layers' states differ in shape: {sorted(shapes)}")
    linattn_ref.write_safetensors(out, {n: t.detach().to(torch.float32).contiguous().numpy()
                                        for n, t in sd.items()}, "F32")
    return layers, shapes.pop()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state", action="store_true",
                   help="convert a state file (STATE.pth OUT.safetensors)")
    p.add_argument("pth")
    p.add_argument("out")
    p.add_argument("--vocab", help=f"the World tokenizer's {VOCAB_FILE}, copied beside the model")
    p.add_argument("--dtype", default="auto", choices=["auto", "F32", "F16", "BF16"])
    args = p.parse_args()
    if args.state:
        try:
            layers, shape = convert_state(args.pth, args.out)
        except (OSError, ValueError) as e:
            sys.exit(f"convert_rwkv: {e}")
        print(f"{args.out}: the initial state of {layers} layers, {shape} each")
        return
    try:
        config, dtype, n = convert(args.pth, args.out, args.vocab, args.dtype)
    except (OSError, ValueError) as e:
        sys.exit(f"convert_rwkv: {e}")
    print(f"{args.out}: {config['model_type']}, {config['num_hidden_layers']} layers, hidden "
          f"{config['hidden_size']}, vocabulary {config['vocab_size']}; {n} tensors, {dtype}")


if __name__ == "__main__":
    main()
