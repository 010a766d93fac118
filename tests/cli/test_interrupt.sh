#!/usr/bin/env bash
# Ctrl-C (SIGINT), SIGTERM or another fatal signal in the middle of writing leaves no partial file
# behind, and akv ends with the signal's status.
source "$(dirname "$0")/lib.sh"
for sig in INT TERM QUIT PIPE ALRM USR1; do
  d="$TMP/$sig"
  mkdir -p "$d"
  "$AKV" synth -o "$d/big.h5" --layers 64 --heads 8 --kv-heads 8 --head-dim 128 \
    --tokens 32768 -q -t 1 >/dev/null 2>&1 &
  pid=$!
  # Wait until the temporary file exists, so the signal lands mid-write.
  for _ in $(seq 100); do
    [[ -n $(ls -A "$d") ]] && break
    sleep 0.05
  done
  sleep 0.3
  kill -s $sig $pid
  wait $pid 2>/dev/null
  status=$?
  [[ $status -gt 128 ]] && pass "SIG$sig ends akv with a signal status ($status)" \
    || fail "SIG$sig: status $status"
  expect_empty_dir "SIG$sig leaves no file" "$d"
done
finish
