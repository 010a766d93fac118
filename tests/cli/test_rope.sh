#!/usr/bin/env bash
# RoPE scaling (linear, dynamic, llama3) and partial rotary dims of Hugging Face configs, checked
# through the keys `akv dump` writes against numpy (tests/cli/rope_check.py).
source "$(dirname "$0")/lib.sh"
need_python_h5py
if "$PY" "$(dirname "$0")/rope_check.py" "$AKV" "$TMP"; then pass "rope scaling against numpy"; else fail "rope scaling against numpy"; fi
finish
