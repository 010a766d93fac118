#!/usr/bin/env bash
# Help, version, usage errors and the synth -> info round trip.
source "$(dirname "$0")/lib.sh"

expect "help lists subcommands" 0 "synth" "$AKV" --help
grep -q "info" "$TMP/out" && pass "help lists info" || fail "help lists info"
# One line per subcommand (its summary); the details stay in `akv CMD --help`.
n=$(sed -n '/^Subcommands:/,$p' "$TMP/out" | grep -c '^  [a-z]')
w=$(sed -n '/^Subcommands:/,$p' "$TMP/out" | awk 'NR > 1 && NF && (length($0) > 120 || !/^  [a-z]/)' | wc -l)
[[ $n == 11 && $w == 0 ]] && pass "help: 11 subcommands, one short line each" || fail "help: $n subcommands, $w other or long lines"
expect "compress --help keeps the details" 0 "Eviction methods" "$AKV" compress --help
expect "version names the commit" 0 "^akv [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{12}(-dirty)?|unknown)\)" "$AKV" --version
# In a git checkout the build reports the commit the binary was built from (read at build time).
if head=$(git -C "$(dirname "$0")" rev-parse --short=12 HEAD 2>/dev/null); then
  expect "version is the checkout's commit" 0 "commit $head" "$AKV" --version
fi
expect_error "no subcommand is a usage error" 1 "subcommand" "$AKV"
expect_error "unknown subcommand" 1 "" "$AKV" frobnicate
expect_error "--max-isa outside its names" 2 "max-isa: avx3 not in" "$AKV" --max-isa avx3 info
expect_error "--token-block out of range" 2 "--token-block = -3" "$AKV" evaluate --model x --tokens y --token-block -3
expect_error "--token-block not a count" 2 "--token-block = 1.5" "$AKV" evaluate --model x --tokens y --token-block 1.5
expect "synth --help documents flags" 0 "--profile" "$AKV" synth --help
for flag in --layers --heads --kv-heads --head-dim --tokens --window --dtype --seed --pre-rope --gzip; do
  grep -q -- "$flag" "$TMP/out" && pass "synth --help has $flag" || fail "synth --help has $flag"
done
expect "info --help documents --stats" 0 "--stats" "$AKV" info --help

d="$TMP/rt"
mkdir -p "$d"
expect "synth writes a dump" 0 "wrote" "$AKV" synth -o "$d/a.h5" --layers 3 --heads 8 \
  --kv-heads 4 --head-dim 32 --tokens 700 --window 16 --seed 3 --pre-rope -q
expect "synth lists head kinds" 0 "layer +2: .*(local|retrieval|diffuse)" \
  "$AKV" synth -o "$d/b.h5" --layers 3 --heads 8 --kv-heads 4 --head-dim 32 --tokens 700 -q
expect "info reads it back" 0 "akv-dump v1" "$AKV" info "$d/a.h5"
for want in "layers +3" "8 query / 4 kv \(group 2\)" "head_dim +32" "700 \(16 window queries\)" \
            "key_pre_rope=yes" "f16 \[4x700x32\]" "f16 \[8x16x32\]"; do
  grep -Eq -- "$want" "$TMP/out" && pass "info shows /$want/" || fail "info shows /$want/"
done
expect "info --json" 0 "\"kind\": \"dump\"" "$AKV" info --json "$d/a.h5"
if "$PY" - "$TMP/out" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["n_layers"] == 3 and j["n_kv_heads"] == 4 and j["n_query"] == 16, j
assert j["layers"][2]["key"]["shape"] == [4, 700, 32]
assert j["layers"][0]["key"]["bytes"] == 4 * 700 * 32 * 2
assert j["optional"]["needles"] and len(j["needles"]) > 0
assert len(j["layers"][1]["head_kinds"]) == 4
PY
then pass "info --json has the schema"; else fail "info --json has the schema"; fi
expect "info --stats" 0 "outlier ratio" "$AKV" info --stats "$d/a.h5"
expect "synth --json" 0 "\"bytes_on_disk\"" "$AKV" synth --json -o "$d/c.h5" --tokens 200 -q
expect_output "synth --json names its format" '"format": "akv-synth"'
expect "threads flag after subcommand" 0 "wrote" "$AKV" synth -o "$d/e.h5" --tokens 100 -t 2 -q
expect "gzip dump is readable" 0 "akv-dump" bash -c "'$AKV' synth -o '$d/g.h5' --tokens 300 --gzip 4 -q >/dev/null && '$AKV' info --stats '$d/g.h5'"
expect "f32 and bf16 dumps" 0 "bf16 \[" bash -c "'$AKV' synth -o '$d/f.h5' --tokens 300 --dtype f32 -q >/dev/null && '$AKV' synth -o '$d/h.h5' --tokens 300 --dtype bf16 -q >/dev/null && '$AKV' info '$d/f.h5' && '$AKV' info '$d/h.h5'"
finish
