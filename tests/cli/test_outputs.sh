#!/usr/bin/env bash
# Output targets and failures while writing: non-regular targets, symbolic links, an output that
# is an input, a full disk and a file-size limit (fatal signals: test_interrupt.sh). Each ends with its documented
# exit code, one error line, and no file or temporary file left behind.
source "$(dirname "$0")/lib.sh"
small=(--layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 256 --window 16 -q)
"$AKV" synth -o "$TMP/d.h5" "${small[@]}" >/dev/null || { echo "synth failed"; exit 1; }
"$AKV" compress -q "$TMP/d.h5" -o "$TMP/c.h5" -m kivi-2 >/dev/null || { echo "compress failed"; exit 1; }
cp "$TMP/d.h5" "$TMP/d.orig"
cp "$TMP/c.h5" "$TMP/c.orig"

# Non-regular targets. HDF5 outputs refuse them (exit 3) and leave them as they were; text
# outputs write through them. Device nodes are made inside the test directory (never /dev).
mkfifo "$TMP/fifo"
expect_error "HDF5 output onto a FIFO is refused" 3 "not a regular file" "$AKV" synth -o "$TMP/fifo" "${small[@]}"
[[ -p $TMP/fifo ]] && pass "the FIFO is still a FIFO" || fail "the FIFO was replaced"
if [[ $(id -u) == 0 ]] && mknod "$TMP/null" c 1 3 2>/dev/null; then
  expect_error "HDF5 output onto a device node is refused" 3 "not a regular file" \
    "$AKV" compress -q "$TMP/d.h5" -o "$TMP/null" -m kivi-2
  [[ -c $TMP/null ]] && pass "the device node is still a device node" || fail "the device node was replaced"
  expect "text output onto a device node writes through" 0 "" \
    "$AKV" plan --layers 2 --kv-heads 2 --head-dim 64 -o "$TMP/null"
  [[ -c $TMP/null ]] && pass "the device node survives a text output" || fail "text output replaced the device node"
else
  echo "skip device-node cases: mknod needs root"
fi
cat "$TMP/fifo" >"$TMP/from_fifo" &
reader=$!
expect "text output into a FIFO writes through" 0 "" "$AKV" plan --layers 2 --kv-heads 2 --head-dim 64 --json -o "$TMP/fifo"
wait $reader
grep -q '"methods"' "$TMP/from_fifo" && pass "the FIFO's reader got the JSON" || fail "nothing came through the FIFO"
# /dev/stdout's own link, made here (a wrong akv must not replace the system's /dev/stdout).
ln -s /proc/self/fd/1 "$TMP/stdout"
run "$AKV" plan --layers 2 --kv-heads 2 --head-dim 64 --json -o "$TMP/stdout"
[[ $rc -eq 0 ]] && grep -q '"methods"' "$TMP/out" && pass "-o through /proc/self/fd/1 prints the JSON" || fail "-o /proc/self/fd/1: rc $rc"
[[ -L $TMP/stdout ]] && pass "the fd link stays a link" || fail "the fd link was replaced"
run bash -c "\"$AKV\" plan --layers 2 --kv-heads 2 --head-dim 64 --json -o \"$TMP/stdout\" | cat"
[[ $rc -eq 0 ]] && grep -q '"methods"' "$TMP/out" && pass "-o /proc/self/fd/1 into a pipe writes through" || fail "-o fd link into a pipe: rc $rc"

# A symbolic link: the file it names is replaced, the link stays.
mkdir -p "$TMP/links"
echo old >"$TMP/links/real.json"
ln -s real.json "$TMP/links/link.json"
expect "text output through a symbolic link" 0 "" "$AKV" plan --layers 2 --kv-heads 2 --head-dim 64 --json -o "$TMP/links/link.json"
[[ -L $TMP/links/link.json ]] && grep -q '"methods"' "$TMP/links/real.json" && pass "the link stays and its file is written" \
  || fail "the link was replaced or its file not written"
expect "HDF5 output through a symbolic link" 0 "wrote" "$AKV" compress -q "$TMP/d.h5" -o "$TMP/links/link.json" -m kivi-2
[[ -L $TMP/links/link.json ]] && "$AKV" info "$TMP/links/real.json" >/dev/null && pass "the link stays and names the cache" \
  || fail "HDF5 output replaced the link"

# An output that is an input is refused before anything runs (exit 1), also through a link.
ln -s d.h5 "$TMP/alias.h5"
expect_error "compress onto its dump" 1 "output is an input" "$AKV" compress -q "$TMP/d.h5" -o "$TMP/d.h5" -m kivi-2
expect_error "compress onto its dump through a link" 1 "output is an input" "$AKV" compress -q "$TMP/d.h5" -o "$TMP/alias.h5" -m kivi-2
expect_error "decompress onto its cache" 1 "output is an input" "$AKV" decompress -q "$TMP/c.h5" -o "$TMP/c.h5"
expect_error "evaluate -o onto the dump" 1 "output is an input" "$AKV" evaluate -q --dump "$TMP/d.h5" --cache "$TMP/c.h5" -o "$TMP/d.h5"
expect_error "calibrate -o onto the dump" 1 "output is an input" "$AKV" calibrate -q "$TMP/d.h5" -o "$TMP/d.h5"
expect_error "allocate -o onto the dump" 1 "output is an input" "$AKV" allocate -q "$TMP/d.h5" --budget 0.5 --window 16 -o "$TMP/d.h5"
cmp -s "$TMP/d.h5" "$TMP/d.orig" && cmp -s "$TMP/c.h5" "$TMP/c.orig" && pass "the inputs are untouched" || fail "an input changed"

# A file-size limit (SIGXFSZ): an I/O error, exit 3, no file.
mkdir -p "$TMP/fsize"
run bash -c "ulimit -f 64; exec \"$AKV\" synth -o \"$TMP/fsize/big.h5\" --layers 2 --heads 4 --kv-heads 2 --head-dim 64 --tokens 4000 -q"
if [[ $rc -eq 3 && $(wc -l <"$TMP/err") -eq 1 ]] && grep -q "^akv: error:" "$TMP/err"; then
  pass "file-size limit: exit 3 with one error line"
else
  fail "file-size limit: exit $rc, stderr: $(head -c 300 "$TMP/err")"
fi
expect_empty_dir "file-size limit leaves no file" "$TMP/fsize"

# A full disk (a 256 KiB tmpfs, when this machine lets the test mount one): exit 3, no file.
mkdir -p "$TMP/full"
if [[ $(id -u) == 0 ]] && mount -t tmpfs -o size=256k tmpfs "$TMP/full" 2>/dev/null; then
  trap 'umount "$TMP/full" 2>/dev/null; rm -rf "$TMP"' EXIT
  "$AKV" synth -o "$TMP/mid.h5" --layers 2 --heads 4 --kv-heads 2 --head-dim 64 --tokens 1500 -q >/dev/null
  for cmd in "synth -o $TMP/full/x.h5 --layers 2 --heads 4 --kv-heads 2 --head-dim 64 --tokens 2000 -q" \
             "compress -q $TMP/mid.h5 -o $TMP/full/x.h5 -m none" \
             "decompress -q $TMP/c.h5 -o $TMP/full/x.h5 --dtype f32 --dump $TMP/d.h5"; do
    [[ $cmd == decompress* ]] && "$AKV" synth -o "$TMP/full/fill.h5" --layers 1 --heads 4 --kv-heads 2 --head-dim 64 --tokens 900 -q >/dev/null 2>&1
    # shellcheck disable=SC2086
    run "$AKV" $cmd
    if [[ $rc -eq 3 && $(wc -l <"$TMP/err") -eq 1 ]]; then pass "disk full (${cmd%% *}): exit 3, one error line"
    else fail "disk full (${cmd%% *}): exit $rc, stderr: $(head -c 300 "$TMP/err")"; fi
    left=$(ls -A "$TMP/full" | grep -v '^fill.h5$' || true)
    [[ -z $left ]] && pass "disk full (${cmd%% *}): no file left" || fail "disk full (${cmd%% *}): left $left"
    rm -f "$TMP/full/fill.h5"
  done
  umount "$TMP/full"
else
  echo "skip disk-full cases: cannot mount a tmpfs here"
fi
finish
