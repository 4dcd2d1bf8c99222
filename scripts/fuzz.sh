#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for a bounded time each, on its
# committed corpus (tests/fuzz/corpus/<target>) plus what earlier runs found
# (<build>/fuzz-corpus/<target>, where new inputs are written). A crash, a
# leak, a sanitizer report or an input slower than 10 s fails the run; the
# input that did it is left in <build>/fuzz-artifacts/.
#
#   scripts/fuzz.sh BUILD_DIR SECONDS_PER_TARGET
set -euo pipefail

build=${1:?usage: fuzz.sh BUILD_DIR SECONDS}
seconds=${2:?usage: fuzz.sh BUILD_DIR SECONDS}
root=$(cd "$(dirname "$0")/.." && pwd)
targets=(snapshot_fuzz config_fuzz safetensors_fuzz npy_fuzz tokenizer_fuzz
         tokenizer_json_fuzz rwkv_world_fuzz jinja_fuzz attention_requests_fuzz
         generation_requests_fuzz)

# The tokenizer target also takes a SentencePiece model: the test fixtures'
# one when `make test` has written it.
spm="$root/build/model_fixtures/spm/tokenizer.model"
if [[ -f $spm ]]; then
  export LINATTN_FUZZ_SPM_MODEL=$spm
else
  echo "fuzz: no $spm (run make test first); tokenizer_fuzz runs the byte tokenizer only"
fi
# ... and a tokenizer.json: the fixtures' Qwen-shaped one.
tokenizer_json="$root/build/tokenizer_fixtures/qwen/tokenizer.json"
if [[ -f $tokenizer_json ]]; then
  export LINATTN_FUZZ_TOKENIZER_JSON=$tokenizer_json
fi
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

mkdir -p "$build/fuzz-artifacts"
# Each target is one process on one core: FUZZ_JOBS of them run at once
# (default: this machine's cores), each writing its own log.
parallel=${FUZZ_JOBS:-$(nproc)}
run_target() {
  local t=$1
  local corpus="$build/fuzz-corpus/$t"
  mkdir -p "$corpus"
  "$build/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072 \
      -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" \
      "$corpus" "$root/tests/fuzz/corpus/$t" > "$build/fuzz-artifacts/$t.log" 2>&1
}
declare -A pid_of
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do sleep 1; done
  echo "fuzz: $t for ${seconds}s"
  run_target "$t" &
  pid_of[$t]=$!
done
failed=()
for t in "${targets[@]}"; do
  log="$build/fuzz-artifacts/$t.log"
  if wait "${pid_of[$t]}"; then
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$log" | tail -2 | sed "s/^/  $t: /"
  else
    echo "fuzz: $t FAILED (log: $log)"
    tail -30 "$log"
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: failed: ${failed[*]}"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s each without a finding"
