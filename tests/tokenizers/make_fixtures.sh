#!/usr/bin/env bash
# The tokenizer tests' files: tokenizer.json in each published shape,
# trained on the KJV (tools/make_tokenizer_json.py), and Hugging Face's
# reference implementation from npm (pinned by package-lock.json); an RWKV
# World vocabulary with RWKV's tokenizer's ids (rwkv_world_reference.py).
#
#   tests/tokenizers/make_fixtures.sh OUT_DIR
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")" && pwd)
/usr/bin/python3 "$here/../../tools/make_tokenizer_json.py" "$out"
# RWKV's World vocabulary format and the ids RWKV's own tokenizer gives.
/usr/bin/python3 "$here/rwkv_world_reference.py" "$out/rwkv_world"
(cd "$here" && { [[ -d node_modules/@huggingface/tokenizers ]] ||
                 npm ci --no-audit --no-fund --silent; })
