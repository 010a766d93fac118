#!/usr/bin/env bash
# One case per validation rule: exit code, one-line message naming file/field/value, no output.
source "$(dirname "$0")/lib.sh"
need_python_h5py
"$PY" "$(dirname "$0")/make_dumps.py" "$TMP/d" || { echo "make_dumps.py failed"; exit 1; }

expect "h5py-written valid dump reads" 0 "h5py-made" "$AKV" info --stats "$TMP/d/valid.h5"
while IFS='|' read -r file pattern; do
  # --stats reads every value, so NaN/Inf are found too.
  expect_error "info $file" 2 "$pattern" "$AKV" info --stats "$TMP/d/$file"
done <"$TMP/d/bad_cases.txt"
expect_error "missing file is an I/O error" 3 "file not found .*nope.h5" "$AKV" info "$TMP/d/nope.h5"
expect_error "evaluate --dump --methods: a missing dump" 3 "file not found .*nope.h5" "$AKV" evaluate -q --dump "$TMP/d/nope.h5" --methods kivi-2
expect_error "directory is an I/O error" 3 "is a directory" "$AKV" info "$TMP/d"
# A file name that is not UTF-8 (a Latin-1 system's "é"): JSON output replaces the byte with
# U+FFFD instead of ending in the JSON library's error ("internal error", exit 3).
latin1="$TMP/d/caf"$'\xe9'".h5"
cp "$TMP/d/valid.h5" "$latin1"
expect "info --json of a file named in Latin-1" 0 $'caf\xef\xbf\xbd' "$AKV" info --json "$latin1"

# Bad flags: usage errors (exit 1), and values outside a flag's range or names (exit 2), that write
# nothing.
o="$TMP/outdir"
mkdir -p "$o"
expect_error "heads not a multiple of kv heads" 1 "--heads must be a positive multiple of --kv-heads \(4\) \(--heads = 6\)" \
  "$AKV" synth -o "$o/x.h5" --heads 6 --kv-heads 4
expect_error "unknown dtype" 2 "--dtype" "$AKV" synth -o "$o/x.h5" --dtype f8
expect_error "window larger than tokens" 1 "--window = 200" "$AKV" synth -o "$o/x.h5" --tokens 100 --window 200
expect_error "zero tokens" 2 "--tokens" "$AKV" synth -o "$o/x.h5" --tokens 0
expect_error "odd head_dim" 2 "--head-dim = 33" "$AKV" synth -o "$o/x.h5" --head-dim 33
expect_error "gzip level" 2 "--gzip" "$AKV" synth -o "$o/x.h5" --gzip 12
expect_error "unknown profile" 2 "--profile" "$AKV" synth -o "$o/x.h5" --profile spiky
expect_error "bad rope theta" 2 "--rope-theta = 0" "$AKV" synth -o "$o/x.h5" --rope-theta 0
expect_error "missing -o" 1 "output" "$AKV" synth
expect_error "negative threads" 2 "threads" "$AKV" synth -o "$o/x.h5" --threads -1
expect_empty_dir "no output after usage errors" "$o"
expect_error "output directory missing" 3 "output directory does not exist" \
  "$AKV" synth -o "$o/no/such/dir/x.h5"
expect_empty_dir "no output after I/O error" "$o"
finish
