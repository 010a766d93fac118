#!/usr/bin/env bash
# h5py reads what akv writes; akv reads what h5py writes (values checked both ways).
source "$(dirname "$0")/lib.sh"
need_python_h5py
if "$PY" "$(dirname "$0")/interop.py" "$AKV" "$TMP"; then
  pass "h5py <-> akv interop"
else
  fail "h5py <-> akv interop"
fi
finish
