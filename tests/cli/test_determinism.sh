#!/usr/bin/env bash
# The same seed and flags give byte-identical files, whatever the thread count.
source "$(dirname "$0")/lib.sh"
common=(--layers 3 --heads 8 --kv-heads 4 --head-dim 64 --tokens 1500 --pre-rope -q)
for dtype in f16 f32; do
  "$AKV" synth -o "$TMP/a.h5" --seed 7 --dtype $dtype -t 1 "${common[@]}" >/dev/null
  "$AKV" synth -o "$TMP/b.h5" --seed 7 --dtype $dtype -t 2 "${common[@]}" >/dev/null
  "$AKV" synth -o "$TMP/c.h5" --seed 8 --dtype $dtype -t 2 "${common[@]}" >/dev/null
  cmp -s "$TMP/a.h5" "$TMP/b.h5" && pass "$dtype: 1 vs 2 threads byte-identical" \
    || fail "$dtype: 1 vs 2 threads differ"
  cmp -s "$TMP/a.h5" "$TMP/c.h5" && fail "$dtype: seed 7 and 8 are identical" \
    || pass "$dtype: another seed gives another dump"
done
"$AKV" synth -o "$TMP/z1.h5" --seed 7 --gzip 6 -t 1 "${common[@]}" >/dev/null
"$AKV" synth -o "$TMP/z2.h5" --seed 7 --gzip 6 -t 2 "${common[@]}" >/dev/null
cmp -s "$TMP/z1.h5" "$TMP/z2.h5" && pass "gzip: byte-identical" || fail "gzip: differ"
for m in "kivi-2" "adakv --budget 0.3 --quant k4v2" "balanced --warm 256 --anchors 32"; do
  # shellcheck disable=SC2086
  "$AKV" compress -q "$TMP/a.h5" -o "$TMP/c1.h5" -m $m -t 1 >/dev/null
  # shellcheck disable=SC2086
  "$AKV" compress -q "$TMP/a.h5" -o "$TMP/c3.h5" -m $m -t 3 >/dev/null
  cmp -s "$TMP/c1.h5" "$TMP/c3.h5" && pass "compress $m: 1 vs 3 threads byte-identical" \
    || fail "compress $m: 1 vs 3 threads differ"
done
# evaluate --model: the report does not depend on --batch, --token-block or the thread count.
M="${AKV_SHARED_DIR:-$SRC/../shared}/models/stories260K.bin"
T="${AKV_SHARED_DIR:-$SRC/../shared}/data/stories260K-samples.txt"
if [[ -f $M ]]; then
  ev=(evaluate -q --model "$M" --tokens "$T" --sequences 5 --methods kivi-2,snapkv:budget=0.5 --json)
  "$AKV" "${ev[@]}" --batch 1 --token-block 1 -t 1 -o "$TMP/e1.json"
  "$AKV" "${ev[@]}" --batch 2 --token-block 7 -t 2 -o "$TMP/e2.json"
  "$AKV" "${ev[@]}" --batch 0 --token-block 64 -t 3 -o "$TMP/e3.json"
  "$AKV" "${ev[@]}" --token-block auto -t 2 -o "$TMP/e6.json"
  "$AKV" "${ev[@]}" -t 2 -o "$TMP/e4.json"
  "$AKV" --max-isa avx2 "${ev[@]}" -t 2 -o "$TMP/e5.json"
  cmp -s "$TMP/e1.json" "$TMP/e5.json" && pass "evaluate --model: --max-isa avx2 byte-identical to the best kernels" \
    || fail "evaluate --model: --max-isa avx2 changes the report"
  cmp -s "$TMP/e1.json" "$TMP/e2.json" && cmp -s "$TMP/e1.json" "$TMP/e3.json" && cmp -s "$TMP/e1.json" "$TMP/e4.json" \
    && cmp -s "$TMP/e1.json" "$TMP/e6.json" \
    && pass "evaluate --model: --batch 1/2/all/auto, --token-block 1/7/64/auto and 1/2/3 threads byte-identical" \
    || fail "evaluate --model: --batch, --token-block or threads change the report"
  # kivi-2 with a 32-token residual: prompts of 64 and 96 tokens quantize (the 128-token preset
  # window would leave them f16).
  pk=(evaluate -q --model "$M" --tokens "$T" --task passkey --methods kivi-2:residual=32,adakv:budget=0.5:window=16
      --lengths 64,96 --depths 0,1 --trials 2 --json)
  "$AKV" "${pk[@]}" --batch 1 -t 1 -o "$TMP/k1.json"
  "$AKV" "${pk[@]}" --batch 3 -t 2 -o "$TMP/k2.json"
  "$AKV" "${pk[@]}" -t 2 -o "$TMP/k3.json"
  cmp -s "$TMP/k1.json" "$TMP/k2.json" && cmp -s "$TMP/k1.json" "$TMP/k3.json" \
    && pass "passkey: --batch 1/3/auto and 1/2 threads byte-identical" \
    || fail "passkey: --batch or threads change the report"
else
  echo "skip evaluate --batch: $M not found"
fi
finish
