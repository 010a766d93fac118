#!/usr/bin/env bash
# RoPE scaling (linear, dynamic, llama3) and partial rotary dims of Hugging Face configs, checked
# through the keys `akv dump` writes against numpy (tests/cli/rope_check.py).
source "$(dirname "$0")/lib.sh"
need_python_h5py
if "$PY" "$(dirname "$0")/rope_check.py" "$AKV" "$TMP"; then pass "rope scaling against numpy"; else fail "rope scaling against numpy"; fi
# rope_check.py leaves its models and dumps in $TMP: a scaled RoPE cannot be re-applied by the
# pre-RoPE quantization path, which says so instead of misplacing keys.
expect "a dump records the model's RoPE variant" 0 "yarn x4" "$PY" -c \
  "import h5py, sys; print(h5py.File(sys.argv[1], 'r').attrs['rope_variant'])" "$TMP/yarn.h5"
expect_error "compress --pre-rope on a yarn dump" 2 "rope_variant = yarn x4" \
  "$AKV" compress -q "$TMP/yarn.h5" -o "$TMP/c.h5" -m kivi-2 --pre-rope
expect_error "expected-attention on a yarn dump (it averages plain RoPE)" 2 "rope_variant = yarn x4" \
  "$AKV" compress -q "$TMP/yarn.h5" -o "$TMP/c.h5" -m expected-attention --budget 0.5
printf '1 2 3 4 5 6 7 8 9 10\n' >"$TMP/t10.txt"
expect_error "pre-rope in the decode loop of a partial-rotary model" 2 "rope_variant = partial 32 of 64 dims" \
  "$AKV" evaluate -q --model "$TMP/partial" --tokens "$TMP/t10.txt" --methods kivi-2:pre-rope:residual=0:group=2
expect "plain RoPE: no variant attribute" 0 "^absent$" "$PY" -c \
  "import h5py, sys; print(h5py.File(sys.argv[1], 'r').attrs.get('rope_variant', 'absent'))" "$TMP/default.h5"
finish
