#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/.

Each seed is a small valid input (or a near miss) for one target, built from
the formats as docs/design.md and core/session/snapshot.h describe them, so
that the fuzzers start from inputs that reach deep into each parser. Run it
after changing a format; the corpus it writes is committed.

    /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus")
MAPS = {"elu1": 0, "relu": 1, "identity": 2, "favor": 3, "cosine": 4}


def write(target, name, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


def attention_snapshot(heads, dk, dv, fmap="elu1", unnorm=0, eps=1e-6, decay=(),
                       fdim=0, seed=0, horizon=0, position=0, fill=0.0):
    dphi = {"favor": fdim or 2 * dk, "cosine": 2 * dk}.get(fmap, dk)
    floats = heads * (dphi * dv + dphi) + (heads if fmap == "favor" else 0)
    spec = struct.pack("<IIIBBfI", heads, dk, dv, MAPS[fmap], unnorm, eps, len(decay))
    spec += b"".join(struct.pack("<f", g) for g in decay)
    spec += struct.pack("<IQI", fdim, seed, horizon)
    state = [fill] * floats
    if fmap == "favor":
        for h in range(heads):
            state[floats - heads + h] = 0.0 if position else float("-inf")
    stat = struct.pack("<IQQ", 1, position, floats) + struct.pack(f"<{floats}f", *state)
    return container(1, [(b"SPEC", spec), (b"STAT", stat)])


def container(kind, sections):
    """The snapshot container of core/session/snapshot.h, version 2."""
    body = b"LNATSNAP" + struct.pack("<IIII", 2, kind, len(sections), 0)
    offset = 24 + 24 * len(sections)
    for tag, data in sections:
        body += tag + struct.pack("<IQQ", 1, offset, len(data))
        offset += len(data)
    body += b"".join(data for _, data in sections)
    return body + struct.pack("<I", zlib.crc32(body))


def safetensors(tensors):
    header, data = {}, b""
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def npy(arr, version=1):
    import io
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(arr, dtype="<f4"), version=(version, 0))
    return buf.getvalue()


def protos():
    """The public protos compiled for Python (protoc from Debian)."""
    out = tempfile.mkdtemp()
    files = sorted(glob.glob(os.path.join(ROOT, "proto", "**", "*.proto"), recursive=True))
    subprocess.run(["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"--python_out={out}",
                    *files], check=True)
    sys.path.insert(0, out)
    from linattn.v1 import attention_pb2, generation_pb2  # noqa: E402
    return attention_pb2, generation_pb2


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    # Attention snapshots: zero and filled states of every map.
    write("snapshot_fuzz", "elu1_zero", attention_snapshot(2, 3, 2))
    write("snapshot_fuzz", "relu_pos5", attention_snapshot(1, 2, 2, "relu", position=5, fill=0.5))
    write("snapshot_fuzz", "favor_decay", attention_snapshot(
        2, 2, 1, "favor", decay=(0.9, 0.5), fdim=4, seed=7, position=3, fill=0.25))
    write("snapshot_fuzz", "cosine", attention_snapshot(1, 2, 1, "cosine", horizon=100, position=2, fill=1.0))
    write("snapshot_fuzz", "identity_unnorm", attention_snapshot(1, 2, 2, "identity", unnorm=1, position=1, fill=-1.0))

    # config.json: the built-in model's, and variants.
    with open(os.path.join(ROOT, "models", "tiny", "config.json")) as f:
        tiny = json.load(f)
    write("config_fuzz", "tiny", json.dumps(tiny, indent=1))
    for fm in ("hedgehog", "t2r", "elementwise_product", "dpfp", "hadamard"):
        write("config_fuzz", f"map_{fm}", json.dumps(dict(tiny, feature_map=fm)))
    write("config_fuzz", "gqa", json.dumps(dict(tiny, num_kv_heads=1, expand_k=0.5)))
    write("config_fuzz", "not_json", "{\"hidden_size\": 64,")

    # safetensors: small files of the shapes the loader reads.
    rng = np.random.default_rng(0)
    write("safetensors_fuzz", "two", safetensors({
        "a": rng.standard_normal((3, 4)), "b": rng.standard_normal((5,))}))
    write("safetensors_fuzz", "empty", safetensors({}))
    write("safetensors_fuzz", "scalar", safetensors({"s": np.array(1.5)}))

    # .npy: versions 1–3, shapes of every rank the client reads.
    write("npy_fuzz", "v1_3d", npy(rng.standard_normal((2, 3, 4))))
    write("npy_fuzz", "v2_2d", npy(rng.standard_normal((4, 2)), version=2))
    write("npy_fuzz", "v3_1d", npy(np.arange(6), version=3))
    write("npy_fuzz", "empty", npy(np.zeros((0, 3))))

    # Tokenizer text: ASCII, multi-byte UTF-8, and bytes that are not UTF-8.
    write("tokenizer_fuzz", "ascii", "In the beginning God created the heaven and the earth.")
    write("tokenizer_fuzz", "utf8", "Zażółć gęślą jaźń — ∑ 😀")
    write("tokenizer_fuzz", "invalid", b"ab\xff\xfe\xc3(\xe2\x82")
    # tokenizer.json documents in the shapes tools/make_tokenizer_json.py
    # writes, small; the text after a NUL is what they encode.
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    chars = [chr(c) for c in range(33, 127)] + ["\u0120", "\u010a"]
    bpe = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": 100, "content": "<|im_start|>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False,
                             "special": True}],
           "normalizer": {"type": "NFC"},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"},
                "behavior": "Isolated", "invert": False}, byte_level]},
           "post_processor": byte_level, "decoder": byte_level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": {c: i for i, c in enumerate(chars)},
                     "merges": [["t", "h"], ["\u0120", "t"]]}}
    write("tokenizer_json_fuzz", "byte_level_bpe",
          json.dumps(bpe).encode() + b"\0the <|im_start|> th\xc3\xa9")
    unigram = {"version": "1.0", "added_tokens": [], "normalizer": {"type": "NFKC"},
               "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                                 "prepend_scheme": "always", "split": True},
               "post_processor": None,
               "decoder": {"type": "Metaspace", "replacement": "\u2581",
                           "prepend_scheme": "always", "split": True},
               "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": True,
                         "vocab": [["<unk>", 0.0], ["\u2581", -2.0], ["a", -1.0], ["b", -1.5],
                                   ["ab", -1.8], ["<0xC3>", -5.0], ["<0xA9>", -5.0]]}}
    write("tokenizer_json_fuzz", "unigram", json.dumps(unigram).encode() + b"\0ab ba \xc3\xa9")
    write("tokenizer_json_fuzz", "refused",
          json.dumps(dict(unigram, normalizer={"type": "Foo"})).encode())
    # RWKV World vocabularies: the 256 bytes as RWKV's file writes them,
    # tokens in every literal form repr writes; the text after a NUL.
    def rwkv_vocab(extra):
        lines = []
        for b in range(256):
            r = repr(bytes([b]).decode("ascii")) if b < 0x80 else repr(bytes([b]))
            lines.append(f"{b + 1} {r} 1")
        for i, t in enumerate(extra, start=257):
            try:
                r = repr(t.decode("utf-8"))
            except UnicodeDecodeError:
                r = repr(t)
            lines.append(f"{i} {r} {len(t)}")
        return ("\n".join(lines) + "\n").encode("utf-8")
    write("rwkv_world_fuzz", "tokens",
          rwkv_vocab([b"\n\n", b"it's", b'"q"', b"a\\b", "中文".encode(), b"\xe4\xb8",
                      "\u2028".encode(), b" the", b"User:"])
          + b"\0User: it's \xe4\xb8\xad\xe6\x96\x87\n\n\xff")
    write("rwkv_world_fuzz", "refused", rwkv_vocab([b"ab"]).replace(b"'ab' 2", b"'ab' 3"))
    # Chat templates: the test templates, and fragments of each construct.
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "chat", "templates", "*.jinja"))):
        with open(path, "rb") as f:
            write("jinja_fuzz", os.path.basename(path)[:-len(".jinja")], f.read())
    write("jinja_fuzz", "loops", "{% for m in messages if m.role != 'tool' %}{{ loop.index }}"
          "{% if loop.last %}{% break %}{% endif %}{% else %}none{% endfor %}")
    write("jinja_fuzz", "macro", "{% macro f(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ f(1) }}{{ f(b=3, a=0) }}")
    write("jinja_fuzz", "filters", "{{ messages | selectattr('role', 'eq', 'user') | map(attribute="
          "'content') | join(', ') | trim | upper }}{{ messages[-1] | tojson(indent=2) }}")

    # Requests: the first byte picks the method (the order of kMethods in
    # the fuzz targets), the rest is the message.
    a, g = protos()
    spec = a.AttentionSpec(num_heads=2, key_dim=3, value_dim=2)
    attention = [
        ("CreateSession", a.CreateSessionRequest(spec=spec, session_id="n1")),
        ("CreateSession", a.CreateSessionRequest(spec=a.AttentionSpec(
            num_heads=1, key_dim=4, value_dim=2, feature_map="favor", feature_dim=8,
            decay=[0.9]))),
        ("GetSession", a.GetSessionRequest(session_id="s1")),
        ("ListSessions", a.ListSessionsRequest()),
        ("DeleteSession", a.DeleteSessionRequest(session_id="s2")),
        ("Prefill", a.PrefillRequest(session_id="s1", tokens=2, q=[0.5] * 12,
                                     k=[0.25] * 12, v=[1.0] * 8)),
        ("Inspect", a.InspectRequest(session_id="s1")),
        ("Snapshot", a.SnapshotRequest(session_id="s1")),
        ("Restore", a.RestoreRequest(state=attention_snapshot(2, 3, 2), session_id="r1")),
        ("Fork", a.ForkRequest(session_id="s1", new_session_id="f1")),
    ]
    methods = ["CreateSession", "GetSession", "ListSessions", "DeleteSession", "Prefill",
               "Inspect", "Snapshot", "Restore", "Fork"]
    for i, (m, msg) in enumerate(attention):
        write("attention_requests_fuzz", f"{i:02d}_{m}",
              bytes([methods.index(m)]) + msg.SerializeToString())
    generation = [
        ("CreateSession", g.CreateModelSessionRequest(session_id="n1")),
        ("GetSession", g.GetModelSessionRequest(session_id="m")),
        ("ListSessions", g.ListModelSessionsRequest()),
        ("Append", g.AppendRequest(session_id="m", text="And God said")),
        ("Append", g.AppendRequest(session_id="m", token_ids=[65, 110, 100])),
        ("Fork", g.ForkModelSessionRequest(session_id="m", new_session_id="f1")),
        ("Snapshot", g.SnapshotModelSessionRequest(session_id="m")),
        ("DeleteSession", g.DeleteModelSessionRequest(session_id="n1")),
        ("ListModels", g.ListModelsRequest()),
        # A model container whose fingerprint no model has.
        ("Restore", g.RestoreModelSessionRequest(state=container(2, [
            (b"MODL", struct.pack("<QI", 0, 4) + b"tiny" + struct.pack("<i", -1)),
            (b"STAT", struct.pack("<I", 0))]), session_id="r2")),
        ("Generate", g.GenerateRequest(session_id="m", prompt=" Let there be",
                                       sampling=g.SamplingParams(
                                           max_tokens=3, temperature=0.8, top_p=0.9, seed=5,
                                           stop=["light"], logprobs=True))),
    ]
    gmethods = ["CreateSession", "GetSession", "ListSessions", "Append", "Fork", "Snapshot",
                "Restore", "DeleteSession", "ListModels", "Generate"]
    for i, (m, msg) in enumerate(generation):
        write("generation_requests_fuzz", f"{i:02d}_{m}",
              bytes([gmethods.index(m)]) + msg.SerializeToString())
    print(f"make_corpus: wrote {sum(len(f) for _, _, f in os.walk(OUT))} seeds to {OUT}")


if __name__ == "__main__":
    main()
