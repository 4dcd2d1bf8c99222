#!/usr/bin/python3
"""How many of a sample's words are words of the training text: the share of
words of four letters or more (maximal runs of ASCII letters, compared
without case) that occur in the training text. A model that writes real
words of its training text scores near 1; word-shaped noise scores low.

    /usr/bin/python3 tools/word_fraction.py --train-kjv SAMPLE...      (the built-in model's text)
    /usr/bin/python3 tools/word_fraction.py --train TEXT SAMPLE...
    ... | /usr/bin/python3 tools/word_fraction.py --train TEXT -

Prints JSON: {"words": n, "known": k, "fraction": k / n, "unknown": [a few]}.
--train-kjv reads the training part of the text tools/train_tiny.py trains
on (the KJV from Debian's bible-kjv, less its held-out last 2% of verses).
"""

import argparse
import importlib.util
import json
import os
import re
import sys

MIN_LETTERS = 4
WORD = re.compile(r"[A-Za-z]+")


def words(text, min_letters=MIN_LETTERS):
    return [w.lower() for w in WORD.findall(text) if len(w) >= min_letters]


def vocabulary(text):
    return set(words(text, 1))


def fraction(train_text, samples):
    vocab = vocabulary(train_text)
    sample_words = [w for s in samples for w in words(s)]
    known = sum(w in vocab for w in sample_words)
    unknown = sorted({w for w in sample_words if w not in vocab})
    return {"words": len(sample_words), "known": known,
            "fraction": known / len(sample_words) if sample_words else 0.0,
            "unknown": unknown[:20]}


def kjv_training_text():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("train_tiny", os.path.join(here, "train_tiny.py"))
    train_tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_tiny)
    return "\n".join(train_tiny.text_split()[0])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--train", help="the training text (a file)")
    src.add_argument("--train-kjv", action="store_true",
                     help="the built-in model's training text")
    p.add_argument("samples", nargs="+", help="sample files ('-' for stdin)")
    args = p.parse_args()
    if args.train_kjv:
        train = kjv_training_text()
    else:
        with open(args.train, encoding="utf-8", errors="replace") as f:
            train = f.read()
    samples = []
    for path in args.samples:
        if path == "-":
            samples.append(sys.stdin.read())
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                samples.append(f.read())
    json.dump(fraction(train, samples), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
