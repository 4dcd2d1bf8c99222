#!/usr/bin/env python3
"""Writes tokenizer.json files in the shapes published checkpoints ship,
with small vocabularies trained here on the King James Bible (Debian's
`bible` program), for the tokenizer tests and the encoding benchmark.

    tools/make_tokenizer_json.py OUT_DIR            the test shapes
    tools/make_tokenizer_json.py --large OUT_DIR    also a synthetic byte-level
                                                    BPE of 200k entries and 200k
                                                    merges (the speed row)

Each shape is a directory OUT_DIR/<shape>/ with tokenizer.json;
OUT_DIR/verses.json holds verses none was trained on (test texts). The vocabularies are small
(a few thousand entries) but real: merges learned from the text, so that
encoding exercises merges, byte fallback, unknowns and added tokens as a
published file does. Standard library only; the same text gives the same
files.

Shapes (after the files of the families named):
  gpt2         byte-level BPE, ByteLevel pre-tokenizer and decoder, legacy
               "a b" merges, <|endoftext|> (GPT-2, GPT-NeoX, Mamba)
  qwen         NFC, Split(Qwen's regex) + ByteLevel(use_regex false), merges
               as pairs, ChatML specials and non-special tool-call tokens
  llama3       Split(Llama-3's regex with (?i:…) and \\p{N}{1,3}),
               ignore_merges, TemplateProcessing adding <|begin_of_text|>
  llama2       SentencePiece-BPE in JSON: Prepend + Replace normalizer,
               byte_fallback, fuse_unk, Replace/ByteFallback/Fuse/Strip decoder,
               <s> added by the template
  mistral      SentencePiece-BPE with the Metaspace pre-tokenizer
               (prepend_scheme first, split false) and byte_fallback
  unigram      Unigram with NFKC, Metaspace (always, split), unk_id, and
               </s> appended by the template
  pieces       BPE with an unknown token and end_of_word_suffix behind
               WhitespaceSplit + Punctuation + Digits(individual), no decoder
"""
import collections
import json
import math
import os
import re
import subprocess
import sys

SAMPLE_EVERY = 8  # verses used for training: one in eight
MAX_TRAIN_WORDS = 3000  # distinct words merges are learned from


def kjv_verses():
    out = subprocess.run(["bible", "-f", "Genesis1:1-Revelation22:21"],
                         capture_output=True, check=True).stdout.decode("latin-1")
    verses = []
    for line in out.splitlines():
        m = re.match(r"^\S+\d+:\d+ (.*)$", line)
        if m:
            verses.append(m.group(1).strip())
    if len(verses) < 30000:
        raise SystemExit(f"expected the whole KJV (31102 verses), got {len(verses)}")
    return verses


def bytes_to_unicode():
    """GPT-2's byte alphabet: printable Latin-1 stands for itself, the other
    68 bytes for U+0100 onwards in byte order."""
    printable = (list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) +
                 list(range(0xAE, 0x100)))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + n)
            n += 1
    return table


def learn_merges(word_counts, symbols_of, count, allowed=None):
    """Classic BPE training: `count` times, merge the most frequent adjacent
    pair (ties: the pair first seen). word_counts: {word: n}; symbols_of(word)
    gives its initial symbols. allowed(a, b) may veto a pair. Returns the
    merges in order."""
    # the most frequent words carry the merges; the rest only cost time
    common = sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    words = [(symbols_of(w), n) for w, n in common[:MAX_TRAIN_WORDS]]
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for syms, n in words:
            for a, b in zip(syms, syms[1:]):
                if allowed is None or allowed(a, b):
                    pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: kv[1])[0]
        merges.append(best)
        a, b = best
        merged = []
        for syms, n in words:
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            merged.append((out, n))
        words = merged
    return merges


def byte_level_words(verses, pattern):
    counts = collections.Counter()
    b2u = bytes_to_unicode()
    for v in verses:
        for w in re.findall(pattern, v):
            counts["".join(b2u[b] for b in w.encode("utf-8"))] += 1
    return counts


# The GPT-2 split, approximated with Python's re (letters and digits as
# \w classes) for training only: what a merge is learned from does not have
# to match the split the tokenizer states.
TRAIN_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+"


def byte_level_vocab(verses, merges_count, specials):
    b2u = bytes_to_unicode()
    counts = byte_level_words(verses, TRAIN_SPLIT)
    merges = learn_merges(counts, list, merges_count)
    vocab = {}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    added = []
    for content, special in specials:
        added.append(added_token(len(vocab) + len(added), content, special))
    return vocab, merges, added


def added_token(i, content, special, **flags):
    t = {"id": i, "content": content, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": not special, "special": special}
    t.update(flags)
    return t


def tokenizer(model, normalizer=None, pre_tokenizer=None, post_processor=None,
              decoder=None, added=()):
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": list(added), "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": decoder, "model": model}


def bpe_model(vocab, merges, legacy=False, **options):
    model = {"type": "BPE", "dropout": None, "unk_token": None,
             "continuing_subword_prefix": None, "end_of_word_suffix": None,
             "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab}
    model.update(options)
    model["merges"] = [f"{a} {b}" for a, b in merges] if legacy else \
        [[a, b] for a, b in merges]
    return model


def template(before, after, ids):
    single = [{"SpecialToken": {"id": t, "type_id": 0}} for t in before]
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    single += [{"SpecialToken": {"id": t, "type_id": 0}} for t in after]
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]}
                               for t in before + after}}


QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?"
              r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False,
              "trim_offsets": True, "use_regex": True}


def shape_gpt2(verses):
    vocab, merges, added = byte_level_vocab(
        verses, 700, [("<|endoftext|>", True)])
    return tokenizer(bpe_model(vocab, merges, legacy=True),
                     pre_tokenizer=BYTE_LEVEL,
                     post_processor=dict(BYTE_LEVEL),
                     decoder=dict(BYTE_LEVEL), added=added)


def shape_qwen(verses):
    vocab, merges, added = byte_level_vocab(
        verses, 600, [("<|endoftext|>", True), ("<|im_start|>", True),
                       ("<|im_end|>", True), ("<tool_call>", False),
                       ("</tool_call>", False)])
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_SPLIT},
         "behavior": "Isolated", "invert": False},
        dict(BYTE_LEVEL, use_regex=False)]}
    return tokenizer(bpe_model(vocab, merges), normalizer={"type": "NFC"},
                     pre_tokenizer=pre, post_processor=dict(BYTE_LEVEL),
                     decoder=dict(BYTE_LEVEL), added=added)


def shape_llama3(verses):
    vocab, merges, added = byte_level_vocab(
        verses, 500, [("<|begin_of_text|>", True), ("<|end_of_text|>", True),
                       ("<|eot_id|>", True)])
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT},
         "behavior": "Isolated", "invert": False},
        dict(BYTE_LEVEL, use_regex=False)]}
    ids = {t["content"]: t["id"] for t in added}
    post = {"type": "Sequence", "processors": [
        dict(BYTE_LEVEL), template(["<|begin_of_text|>"], [], ids)]}
    return tokenizer(bpe_model(vocab, merges, ignore_merges=True),
                     pre_tokenizer=pre, post_processor=post,
                     decoder=dict(BYTE_LEVEL), added=added)


def spm_bpe_vocab(verses, merges_count):
    """SentencePiece-style BPE: ▁ for spaces, characters seen in the text,
    byte tokens for the rest, merges never across ▁ inside a piece."""
    counts = collections.Counter()
    chars = collections.Counter()
    for v in verses:
        for w in v.split(" "):
            if w:
                counts["\u2581" + w] += 1
                chars.update("\u2581" + w)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0])):
        vocab.setdefault(c, len(vocab))
    merges = learn_merges(counts, list, merges_count,
                          allowed=lambda a, b: "\u2581" not in b)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = [added_token(0, "<unk>", True), added_token(1, "<s>", True),
             added_token(2, "</s>", True)]
    return vocab, merges, added


SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def shape_llama2(verses):
    vocab, merges, added = spm_bpe_vocab(verses, 500)
    normalizer = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    return tokenizer(
        bpe_model(vocab, merges, unk_token="<unk>", fuse_unk=True,
                  byte_fallback=True),
        normalizer=normalizer,
        post_processor=template(["<s>"], [], {"<s>": 1}),
        decoder=SPM_DECODER, added=added)


def shape_mistral(verses):
    vocab, merges, added = spm_bpe_vocab(verses, 400)
    pre = {"type": "Metaspace", "replacement": "\u2581",
           "prepend_scheme": "first", "split": False}
    return tokenizer(
        bpe_model(vocab, merges, unk_token="<unk>", fuse_unk=True,
                  byte_fallback=True),
        pre_tokenizer=pre,
        post_processor=template(["<s>"], [], {"<s>": 1}),
        decoder=SPM_DECODER, added=added)


def shape_unigram(verses):
    """A Unigram vocabulary: characters and the most frequent substrings of
    ▁-prefixed words, scored by their log frequency."""
    subs = collections.Counter()
    chars = collections.Counter()
    for v in verses:
        for w in v.split(" "):
            if not w:
                continue
            w = "\u2581" + w
            chars.update(w)
            for i in range(len(w)):
                for j in range(i + 2, min(len(w), i + 8) + 1):
                    subs[w[i:j]] += 1
    pieces = [("<unk>", 0.0), ("</s>", 0.0)]
    total = sum(chars.values()) + sum(subs.values())
    for c, n in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0])):
        pieces.append((c, math.log(n / total)))
    for s, n in sorted(subs.items(), key=lambda kv: (-kv[1], kv[0]))[:2500]:
        pieces.append((s, math.log(n / total) + 0.5 * len(s)))
    added = [added_token(0, "<unk>", True), added_token(1, "</s>", True)]
    meta = {"type": "Metaspace", "replacement": "\u2581",
            "prepend_scheme": "always", "split": True}
    return tokenizer(
        {"type": "Unigram", "unk_id": 0, "vocab": [list(p) for p in pieces],
         "byte_fallback": False},
        normalizer={"type": "NFKC"}, pre_tokenizer=meta,
        post_processor=template([], ["</s>"], {"</s>": 1}),
        decoder=dict(meta), added=added)


def shape_pieces(verses):
    counts = collections.Counter()
    for v in verses:
        for w in re.findall(r"[A-Za-z]+", v):
            counts[w] += 1
    suffix = "</w>"
    symbols = lambda w: list(w[:-1]) + [w[-1] + suffix]
    merges = learn_merges(counts, symbols, 300)
    vocab = {"[UNK]": 0}
    for c in sorted({c for w in counts for c in w}):
        vocab[c] = len(vocab)
        vocab[c + suffix] = len(vocab)
    for d in "0123456789.,;:!?'()-":
        vocab.setdefault(d + suffix, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"},
        {"type": "Punctuation", "behavior": "Isolated"},
        {"type": "Digits", "individual_digits": True}]}
    return tokenizer(
        bpe_model(vocab, merges, unk_token="[UNK]", end_of_word_suffix=suffix),
        pre_tokenizer=pre, added=[added_token(0, "[UNK]", True)])


def shape_large():
    """A byte-level BPE of 200,000 entries and 200,000 merges: every merge
    joins two earlier entries into a new one (deterministic, no training),
    so the vocabulary has the size and the merge depth of a large published
    one."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    tokens = [b2u[b] for b in range(256)]
    letters = [b2u[b] for b in b" etaoinshrdlucmfwypvbgkqjxz"]
    merges = []
    seed = 12345
    while len(merges) < 200000 - 256:
        seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
        # mostly extend short tokens with frequent letters
        a = tokens[(seed >> 4) % min(len(tokens), 256 + len(merges) // 2 + 1)]
        b = letters[(seed >> 16) % len(letters)] if seed & 1 else \
            tokens[(seed >> 8) % len(tokens)]
        if len(a) + len(b) > 16 or a + b in vocab:
            continue
        vocab[a + b] = len(vocab)
        tokens.append(a + b)
        merges.append((a, b))
    return tokenizer(bpe_model(vocab, merges), pre_tokenizer=BYTE_LEVEL,
                     post_processor=dict(BYTE_LEVEL),
                     decoder=dict(BYTE_LEVEL),
                     added=[added_token(len(vocab), "<|endoftext|>", True)])


SHAPES = {"gpt2": shape_gpt2, "qwen": shape_qwen, "llama3": shape_llama3,
          "llama2": shape_llama2, "mistral": shape_mistral,
          "unigram": shape_unigram, "pieces": shape_pieces}


def write(out_dir, name, tok):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


def main(argv):
    large = "--large" in argv
    args = [a for a in argv if a != "--large"]
    if len(args) != 1:
        raise SystemExit(__doc__)
    out_dir = args[0]
    all_verses = kjv_verses()
    verses = all_verses[::SAMPLE_EVERY]
    for name, make in SHAPES.items():
        write(out_dir, name, make(verses))
    # Verses no vocabulary was trained on, as test texts.
    held_out = [v for i, v in enumerate(all_verses) if i % SAMPLE_EVERY][::211]
    with open(os.path.join(out_dir, "verses.json"), "w", encoding="utf-8") as f:
        json.dump(held_out, f, ensure_ascii=False)
    if large:
        write(out_dir, "large", shape_large())


if __name__ == "__main__":
    main(sys.argv[1:])
