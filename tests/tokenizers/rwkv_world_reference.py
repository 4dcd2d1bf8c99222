#!/usr/bin/env python3
"""RWKV World tokenizer fixtures: a vocabulary in RWKV's file format and the
ids RWKV's own tokenizer gives for a set of texts.

  rwkv_world_reference.py OUT_DIR

The vocabulary (OUT_DIR/rwkv_vocab_v20230424.txt) is written as RWKV's is:
`ID repr(token) LENGTH` per line, a str repr where the token is UTF-8 and a
bytes repr where it is not; ids 1..256 are the single bytes, then words and
pieces of the KJV (Debian's bible-kjv), multi-byte characters and pieces of
them, and tokens whose reprs need every escape repr writes.

The reference is TRIE_TOKENIZER of BlinkDL/RWKV-LM
(RWKV-v5/tokenizer/rwkv_tokenizer.py) restated: each line read with eval of
its middle part, a trie over the token bytes, and encodeBytes's greedy walk
that keeps the last node holding a token. OUT_DIR/rwkv_world_expected.json
holds, per text (given as hex bytes), the ids and the decoded bytes.
"""

import json
import os
import random
import subprocess
import sys


def kjv_verses():
    out = subprocess.run(["bible", "-f", "Genesis1:1-Revelation22:21"],
                         capture_output=True, check=True).stdout.decode("latin-1")
    verses = []
    for line in out.splitlines():
        head, _, rest = line.partition(" ")
        if ":" in head and rest:
            verses.append(rest.strip())
    if len(verses) < 30000:
        raise SystemExit(f"expected the whole KJV, got {len(verses)} verses")
    return verses


def make_vocabulary(verses):
    tokens = [bytes([b]) for b in range(256)]
    seen = set(tokens)

    def add(t):
        if t and t not in seen and len(t) <= 128:
            seen.add(t)
            tokens.append(t)

    counts = {}
    for v in verses[::7]:
        for w in v.split(" "):
            for piece in (w, " " + w, w[:3], " " + w[:2]):
                counts[piece] = counts.get(piece, 0) + 1
    for piece, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3000]:
        add(piece.encode("utf-8"))
    # Characters beyond ASCII, whole and in pieces (a bytes repr), and the
    # escapes repr writes: quotes, backslash, controls, U+2028, U+0085.
    for s in ["é", "ü", "中文", "中", "文字", "字", "日本語", "語", "😀", "Ω",
              "\u2028", "\u0085", "\x7f", "'", '"', "\\", "it's", 'say "', "a\\b",
              "\n", "\n\n", "\t", "\r\n", " \n", "\x1b[", "User:", "Assistant:",
              "\n\nUser:", " the\n"]:
        b = s.encode("utf-8")
        add(b)
        if len(b) > 1:
            add(b[:-1])
            add(b[1:])
    add(b"\xe4\xb8")
    add(b"\xff\xfe")
    add(b"\x80abc")
    add(b" " * 16)
    add(b"-" * 32)
    lines = []
    for i, t in enumerate(tokens, start=1):
        try:
            r = repr(t.decode("utf-8"))
        except UnicodeDecodeError:
            r = repr(t)
        lines.append(f"{i} {r} {len(t)}\n")
    return "".join(lines)


class Trie:
    __slots__ = ("to", "values")

    def __init__(self):
        self.to = [None] * 256
        self.values = set()

    def add(self, key, val):
        node = self
        for ch in key:
            if node.to[ch] is None:
                node.to[ch] = Trie()
            node = node.to[ch]
        node.values.add(val)

    def find_longest(self, key, idx):
        u = self
        ch = key[idx]
        ret = None
        while u.to[ch] is not None:
            u = u.to[ch]
            idx += 1
            if u.values:
                ret = idx, u, u.values
            if idx == len(key):
                break
            ch = key[idx]
        return ret


def load_reference(path):
    idx2token = {}
    with open(path, "r", encoding="utf-8") as f:
        lines = f.readlines()
    for l in lines:
        idx = int(l[:l.index(" ")])
        x = eval(l[l.index(" "):l.rindex(" ")])
        x = x.encode("utf-8") if isinstance(x, str) else x
        assert isinstance(x, bytes)
        assert len(x) == int(l[l.rindex(" "):])
        idx2token[idx] = x
    token2idx = {v: int(k) for k, v in idx2token.items()}
    root = Trie()
    for t, i in token2idx.items():
        root.add(t, (t, i))
    return idx2token, root


def encode_bytes(root, src):
    idx = 0
    tokens = []
    while idx < len(src):
        start = idx
        idx, _, values = root.find_longest(src, idx)
        assert idx != start
        _, token = next(iter(values))
        tokens.append(token)
    return tokens


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    verses = kjv_verses()
    path = os.path.join(out, "rwkv_vocab_v20230424.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(make_vocabulary(verses))
    idx2token, root = load_reference(path)
    rng = random.Random(20230424)
    texts = [b"", b"a", b"In the beginning God created the heaven and the earth.",
             "User: 中文字 😀 it's \"quoted\" a\\b\n\nAssistant:".encode("utf-8"),
             "\u2028\u0085\x7f\x1b[0m\r\n\t".encode("utf-8"),
             b"\xff\xfe\x80abc\xe4\xb8\xad", b" " * 40 + b"-" * 70]
    texts += [v.encode("utf-8") for v in rng.sample(verses, 200)]
    texts += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
              for _ in range(100)]
    cases = []
    for t in texts:
        ids = encode_bytes(root, t)
        assert b"".join(idx2token[i] for i in ids) == t
        cases.append({"text": t.hex(), "ids": ids})
    with open(os.path.join(out, "rwkv_world_expected.json"), "w") as f:
        json.dump({"vocab_size": max(idx2token) + 1, "cases": cases}, f)


if __name__ == "__main__":
    main()
