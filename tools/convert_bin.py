#!/usr/bin/python3
"""Converts a checkpoint that ships as PyTorch .bin into the model directory
linattn loads (config.json + model.safetensors).

    /usr/bin/python3 tools/convert_bin.py SRC_DIR OUT_DIR [--dtype auto|F32|F16|BF16]

SRC_DIR holds pytorch_model.bin, or pytorch_model.bin.index.json and the
shards its weight_map names, beside config.json. The files are read with
torch.load(weights_only=True): tensors only, so a pickle that would run code
is refused rather than executed. Every tensor must be floating point (F32,
F16 or BF16); names are kept as they are (fla's layout), tensors that share
storage (tied weights) are written once per name. --dtype auto keeps the
checkpoint's dtype when all tensors share one, F32 otherwise; F16 and BF16
values go through float32 exactly. config.json and the tokenizer files
beside it are copied.
"""

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import linattn_ref  # noqa: E402  (sets up OpenBLAS before torch loads)

torch = linattn_ref.torch

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer.model",
          "tokenizer_config.json", "special_tokens_map.json")


def shard_files(src):
    index = os.path.join(src, "pytorch_model.bin.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        names = sorted(set(weight_map.values()))
        for name in names:
            if os.path.basename(name) != name:
                raise ValueError(f"{index}: shard {name!r} is not a file beside it")
        return [os.path.join(src, n) for n in names], weight_map
    single = os.path.join(src, "pytorch_model.bin")
    if not os.path.exists(single):
        raise FileNotFoundError(f"{src}: no pytorch_model.bin nor pytorch_model.bin.index.json")
    return [single], None


def read_tensor_file(path):
    """One torch.save file as name -> tensor: weights-only unpickling, a
    dict of floating-point (F32, F16, BF16) tensors, or ValueError naming
    what is not."""
    try:
        part = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the unpickler refuses anything but tensors
        raise ValueError(f"{path}: not a plain tensor checkpoint ({e})") from None
    if not isinstance(part, dict):
        raise ValueError(f"{path}: holds a {type(part).__name__}, not a name -> tensor map")
    for name, t in part.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{path}: {name} is a {type(t).__name__}, not a tensor")
        if t.dtype not in DTYPES:
            raise ValueError(f"{path}: {name} is {t.dtype}; only F32, F16 and BF16 convert")
    return part


def read_tensors(src):
    """name -> tensor, from every shard; each name once."""
    files, weight_map = shard_files(src)
    tensors = {}
    for path in files:
        part = read_tensor_file(path)
        for name, t in part.items():
            if name in tensors:
                raise ValueError(f"{path}: {name} appears in two shards")
            tensors[name] = t
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise ValueError(f"the index names tensors no shard holds: {missing[:5]}")
    return tensors


def convert(src, out, dtype="auto"):
    tensors = read_tensors(src)
    if not tensors:
        raise ValueError(f"{src}: the checkpoint holds no tensors")
    if dtype == "auto":
        kinds = {DTYPES[t.dtype] for t in tensors.values()}
        dtype = kinds.pop() if len(kinds) == 1 else "F32"
    os.makedirs(out, exist_ok=True)
    arrays = {name: t.detach().to(torch.float32).contiguous().numpy()
              for name, t in tensors.items()}
    linattn_ref.write_safetensors(os.path.join(out, "model.safetensors"), arrays, dtype)
    for name in COPIED:
        path = os.path.join(src, name)
        if os.path.exists(path):
            shutil.copyfile(path, os.path.join(out, name))
    return dtype, len(arrays)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--dtype", default="auto", choices=["auto", "F32", "F16", "BF16"])
    args = p.parse_args()
    try:
        dtype, n = convert(args.src, args.out, args.dtype)
    except (OSError, ValueError) as e:
        sys.exit(f"convert_bin: {e}")
    print(f"{args.out}/model.safetensors: {n} tensors, {dtype}")


if __name__ == "__main__":
    main()
