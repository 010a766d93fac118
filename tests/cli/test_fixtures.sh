#!/usr/bin/env bash
# Format compatibility: the fixtures in data/fixtures (written by scripts/dev/make_fixtures) are
# read by today's akv, and re-created byte for byte from the same inputs and flags.
source "$(dirname "$0")/lib.sh"
FIX="$SRC/data/fixtures"
[[ -f $FIX/dump.h5 ]] || { echo "no fixtures in $FIX"; exit 1; }
files=(dump.h5 cache-v1-kivi.h5 cache-v1-evict.h5 cache-v2-tiered.h5 cache-v3-ggml.h5 cache-v4-rotate.h5 cache-v4-turboquant.h5
       cache-v4-turboquant-qjl.h5 cache-v5-fp8.h5 budgets.json
       budgets-joint.json calibration.json cache-v6-nuq.h5 cache-v3-types.h5 cache-v3-joint-types.h5)

# Reading: every fixture is recognised and usable as input.
expect "dump fixture reads, no NaN/Inf" 0 "akv-dump" "$AKV" info --stats "$FIX/dump.h5"
expect "v1 quantized cache reads" 0 "akv-cache v1" "$AKV" info "$FIX/cache-v1-kivi.h5"
expect "v1 evicted cache reads" 0 "akv-cache v1" "$AKV" info "$FIX/cache-v1-evict.h5"
expect "v2 tiered cache reads" 0 "akv-cache v2" "$AKV" info "$FIX/cache-v2-tiered.h5"
expect "v3 ggml cache reads" 0 "akv-cache v3" "$AKV" info "$FIX/cache-v3-ggml.h5"
expect "v4 rotated cache reads" 0 "akv-cache v4" "$AKV" info "$FIX/cache-v4-rotate.h5"
expect "v5 fp8 cache reads" 0 "akv-cache v5" "$AKV" info "$FIX/cache-v5-fp8.h5"
expect "v6 nuq cache reads" 0 "akv-cache v6" "$AKV" info "$FIX/cache-v6-nuq.h5"
expect "v4 TurboQuant cache reads" 0 "\"k\":\"tq3nc\",\"v\":\"tqv4\"" "$AKV" info "$FIX/cache-v4-turboquant.h5"
expect "v3 cache with per-head types reads" 0 '"head_types":\[\["tq3nc","q4_0"\]' "$AKV" info "$FIX/cache-v3-types.h5"
expect "v3 joint cache with per-head cache types reads" 0 '"head_tensor_types":\[\["q8_0",""\]' \
  "$AKV" info "$FIX/cache-v3-joint-types.h5"
expect "v4 TurboQuant cache with QJL keys reads" 0 "\"k\":\"tq3j\",\"v\":\"tqv4\"" "$AKV" info "$FIX/cache-v4-turboquant-qjl.h5"
for c in cache-v1-kivi cache-v1-evict cache-v2-tiered cache-v3-ggml cache-v3-types cache-v3-joint-types cache-v4-rotate \
         cache-v4-turboquant cache-v4-turboquant-qjl cache-v5-fp8 cache-v6-nuq; do
  expect "evaluate $c against its dump" 0 '"attn_rel_err"' \
    "$AKV" evaluate -q --json --dump "$FIX/dump.h5" --cache "$FIX/$c.h5"
  expect "decompress $c" 0 "wrote" "$AKV" decompress -q "$FIX/$c.h5" --dump "$FIX/dump.h5" -o "$TMP/r_$c.h5"
done
# A cache written before params recorded quant_rule (2026-11-30, 1e5f9e0) was quantized with the
# bounded rule and reads as such.
expect "cache without quant_rule reads as the bounded rule" 0 '"quant_rule":"bounded"' \
  "$AKV" info "$FIX/cache-v1-kivi-before-rule.h5"
expect "evaluate the cache without quant_rule" 0 '"attn_rel_err"' \
  "$AKV" evaluate -q --json --dump "$FIX/dump.h5" --cache "$FIX/cache-v1-kivi-before-rule.h5"
expect "budgets file drives compress" 0 "wrote" \
  "$AKV" compress -q "$FIX/dump.h5" -o "$TMP/b.h5" -m adakv --budgets "$FIX/budgets.json" --quant k4v2
expect "joint budgets file drives compress" 0 "wrote" \
  "$AKV" compress -q "$FIX/dump.h5" -o "$TMP/j.h5" -m joint --budgets "$FIX/budgets-joint.json" --quant kivi
expect "calibration file drives compress" 0 "wrote" \
  "$AKV" compress -q "$FIX/dump.h5" -o "$TMP/c.h5" -m kivi --calibration "$FIX/calibration.json"
expect "calibration file's nuq codebooks drive nuq" 0 "nuq K2/V4 pre-RoPE" \
  "$AKV" compress "$FIX/dump.h5" -o "$TMP/nuq.h5" -m nuq --calibration "$FIX/calibration.json" --bits-key 2 --bits-value 4
expect "calibration file drives duo's head split" 0 "wrote" \
  "$AKV" compress -q "$FIX/dump.h5" -o "$TMP/duo.h5" -m duo --heads "$FIX/calibration.json" --sinks 8 --window 64 --budget 0.6

# Writing: the same inputs and flags give the same bytes. Floating-point code generation differs
# between optimisation levels (contraction, vectorisation), so bytes are compared in the build
# that ships (CMake sets AKV_FIXTURE_BYTES=1 for Release builds without sanitizers); the
# sanitizer pass checks the reading above only. The derived files are made from the committed
# dump, so a difference in the synthetic dump (another libm, say) shows up on its own line.
if [[ ${AKV_FIXTURE_BYTES:-0} != 1 ]]; then
  echo "skip byte-for-byte re-creation: not a Release build without sanitizers"
  finish
  exit
fi
mkdir -p "$TMP/new" "$TMP/synth"
cp "$FIX/dump.h5" "$TMP/new/dump.h5"
if bash "$SRC/scripts/dev/make_fixtures" -a "$AKV" --reuse-dump "$TMP/new" >"$TMP/make.log" 2>&1 &&
   bash "$SRC/scripts/dev/make_fixtures" -a "$AKV" "$TMP/synth" >>"$TMP/make.log" 2>&1; then
  cp "$TMP/synth/dump.h5" "$TMP/new/dump.h5"
  for f in "${files[@]}"; do
    if cmp -s "$FIX/$f" "$TMP/new/$f"; then pass "re-created $f byte for byte"
    else fail "re-created $f differs from data/fixtures/$f (a format change? see scripts/dev/make_fixtures)"; fi
  done
else
  fail "scripts/dev/make_fixtures failed: $(head -c 300 "$TMP/make.log")"
fi
finish
