#!/usr/bin/env bash
# tokenizer.json speed (docs/benchmarks.md, "Tokenizers"): writes the test
# shapes and the 200k-entry synthetic vocabulary (tools/make_tokenizer_json.py
# --large, kept in BUILD_DIR/tokenizer_bench/ between runs) and the King
# James Bible as text (4.3 MB, from the bible-kjv package), then times each
# file's load and a one-core encode of the whole text in 4 KiB prompts.
#
#   bench/tokenizer_bench.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$build/tokenizer_bench"
mkdir -p "$out"
if [[ ! -f $out/large/tokenizer.json ]]; then
  /usr/bin/python3 "$root/tools/make_tokenizer_json.py" --large "$out"
fi
if [[ ! -s $out/kjv.txt ]]; then
  bible -f Genesis1:1-Revelation22:21 > "$out/kjv.txt"
fi
for shape in large qwen llama2 unigram; do
  OMP_NUM_THREADS=1 "$build/bin/tokenizer_benchmark" \
    --tokenizer "$out/$shape/tokenizer.json" --text "$out/kjv.txt"
done
