#!/usr/bin/env bash
# allocate / compress with eviction / evaluate: budgets file, composition with quantization,
# byte accounting with kept indices, bad input.
source "$(dirname "$0")/lib.sh"
need_python_h5py
TOOL="$(dirname "$0")/cache_tool.py"
d="$TMP/d.h5"
"$AKV" synth -q -o "$d" --layers 2 --heads 8 --kv-heads 4 --head-dim 64 --tokens 800 --window 16 \
  >/dev/null || { echo "synth failed"; exit 1; }

expect "allocate adakv table" 0 "adakv allocation .* 160 tokens per KV head" \
  "$AKV" allocate -q "$d" --method adakv --budget 0.2 --window 16 -o "$TMP/b.json"
expect "budgets file format" 0 '"format": "akv-budgets"' cat "$TMP/b.json"
for m in uniform waterfill pyramid adakv-pyramid adakv-global; do
  expect "allocate $m" 0 "$m allocation" "$AKV" allocate -q "$d" --method "$m" --budget-tokens 100 --window 16
done
expect "allocate --score h2o --json" 0 '"score": "h2o"' "$AKV" allocate -q "$d" --score h2o --budget 0.3 --window 16 --json

for m in snapkv h2o streamingllm waterfill pyramid; do
  expect "compress --method $m" 0 "kept 0\.2000 " "$AKV" compress -q "$d" -o "$TMP/e_$m.h5" -m "$m" --budget 0.2 --window 16
done
# Ada-KV's official capacity rule rounds each head on its own: a few tokens off the budget.
for m in adakv adakv-pyramid adakv-global; do
  expect "compress --method $m" 0 "kept 0\.(19|20)" "$AKV" compress -q "$d" -o "$TMP/e_$m.h5" -m "$m" --budget 0.2 --window 16
done
for m in knorm keydiff tova lagkv expected-attention; do
  expect "compress --method $m (kvpress's scorer)" 0 "kept 0\.2000 .*uniform/$m 0.2" \
    "$AKV" compress -q "$d" -o "$TMP/e_$m.h5" -m "$m" --budget 0.2
done
# 8 heads, 20 forced and 780 selectable tokens: round(8 x 220 / 780) = 2 heads keep all 800.
expect "duo on a dump: head split by snapkv's best score" 0 "kept 0\.2687 .*duo/snapkv 0.3" \
  "$AKV" compress -q "$d" -o "$TMP/e_duo.h5" -m duo --score snapkv --window 16 --sinks 4 --budget 0.3
expect "allocate --method duo: every head keeps all or its forced tokens" 0 '"alloc": "duo"' \
  "$AKV" allocate -q "$d" --method duo --budget 0.3 --window 16 --sinks 4 --json -o "$TMP/duo.json"
kinds=$("$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); print(sorted({h["tokens"] for l in j["layers"] for h in l["heads"]}))' "$TMP/duo.json")
expect_equal "duo: per-head budgets are 20 (sinks + window) or 800" "$kinds" "[20, 800]"
expect "adakv over expected-attention scores (score=)" 0 "adakv/expected-attention 0.2" \
  "$AKV" compress -q "$d" -o "$TMP/e_ea.h5" -m adakv --score expected-attention --budget 0.2 --future 64 --covariance off
expect "allocate --score knorm" 0 '"score": "knorm"' "$AKV" allocate -q "$d" --score knorm --budget 0.3 --json
expect "adakv --capacity-rule exact-total keeps the budget exactly" 0 "kept 0\.2000 " \
  "$AKV" compress -q "$d" -o "$TMP/e_exact.h5" -m adakv --budget 0.2 --window 16 --capacity-rule exact-total
expect_error "unknown capacity rule" 2 "--capacity-rule = fair" \
  "$AKV" compress -q "$d" -o "$TMP/e_bad.h5" -m adakv --budget 0.2 --window 16 --capacity-rule fair
expect "eviction + kivi" 0 "adakv/snapkv 0.2 \+ kivi K4/V2 R128" \
  "$AKV" compress -q "$d" -o "$TMP/ek.h5" -m adakv --budget 0.2 --window 16 --quant kivi --bits-key 4 --bits-value 2
expect "compress --budgets from allocate" 0 "kept 0\.(19|20)" \
  "$AKV" compress -q "$d" -o "$TMP/eb.h5" -m adakv --budgets "$TMP/b.json" --quant k4v3
for c in e_adakv ek eb; do expect_cache_bytes "$TMP/$c.h5"; done
expect "evaluate evicted: retained mass, needles" 0 "needles kept" \
  "$AKV" evaluate -q --dump "$d" --cache "$TMP/ek.h5"
expect "evaluate --json has needle survival" 0 '"needle_survival"' \
  "$AKV" evaluate -q --json --dump "$d" --cache "$TMP/e_snapkv.h5"
expect "decompress an evicted cache" 0 "wrote" "$AKV" decompress -q "$TMP/ek.h5" -o "$TMP/r.h5"

"$AKV" compress -q -t 1 "$d" -o "$TMP/t1.h5" -m adakv-global --budget 0.15 --window 16 --quant kivi-2 >/dev/null
"$AKV" compress -q -t 2 "$d" -o "$TMP/t2.h5" -m adakv-global --budget 0.15 --window 16 --quant kivi-2 >/dev/null
if cmp -s "$TMP/t1.h5" "$TMP/t2.h5"; then pass "eviction: identical bytes on 1 and 2 threads"; else fail "eviction differs across threads"; fi

o="$TMP/out_dir"
mkdir -p "$o"
expect_error "budget <= window" 2 "--budget-tokens = 16" "$AKV" compress -q "$d" -o "$o/c.h5" -m snapkv --budget-tokens 16 --window 16
expect_error "budget past 2^64 (was clamped to 2^63 - 1)" 2 "beyond 64 bits .*--budget-tokens = 99999999999999999999" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m snapkv --budget-tokens 99999999999999999999
expect_error "budget fraction > 1" 2 "--budget = 1.5" "$AKV" compress -q "$d" -o "$o/c.h5" -m adakv --budget 1.5
expect_error "window > n_query" 2 "--window = 32" "$AKV" compress -q "$d" -o "$o/c.h5" -m adakv --budget 0.2
expect_error "unknown allocation method" 2 "--method = magic" "$AKV" allocate -q "$d" --method magic --budget 0.2 --window 16 -o "$o/b.json"
expect_error "unknown score" 2 "--score = lru" "$AKV" allocate -q "$d" --score lru --budget 0.2 --window 16 -o "$o/b.json"
expect_error "no budget" 1 "exactly one of --budget, .*\\(--method = adakv\\)" "$AKV" compress -q "$d" -o "$o/c.h5" -m adakv --window 16
expect_error "two budgets" 1 "exactly one of --budget, .*\\(given = --budget and --budget-tokens\\)" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m adakv --window 16 --budget 0.2 --budget-tokens 40
expect_error "budget without eviction method" 1 "eviction method" "$AKV" compress -q "$d" -o "$o/c.h5" -m kivi --budget 0.2
"$AKV" synth -q -o "$TMP/other.h5" --layers 3 --heads 8 --kv-heads 4 --head-dim 64 --tokens 800 --window 16 >/dev/null
expect_error "budgets for another dump shape" 2 "dump.n_layers = 2" \
  "$AKV" compress -q "$TMP/other.h5" -o "$o/c.h5" -m adakv --budgets "$TMP/b.json"
echo '{"format": "akv-budgets", "version": 1' >"$TMP/broken.json"
expect_error "corrupt budgets file" 2 "not JSON" "$AKV" compress -q "$d" -o "$o/c.h5" -m adakv --budgets "$TMP/broken.json"
expect_error "expected-attention's flag on another score" 1 "--future = 64" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m knorm --budget 0.2 --future 64
expect_error "lagkv's flag on another score" 1 "--lag = 16" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m tova --budget 0.2 --lag 16
expect_error "kvzip needs the model (no dump mode)" 1 "evaluate --model only" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m kvzip --budget 0.3
expect_error "duo's default kvzip head scores need the model" 1 "evaluate --model only" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m duo --budget 0.5
expect_error "kvzip's KVzip+ flag on another score" 1 "--plus = on" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m knorm --budget 0.2 --plus on
expect_error "qfilter without its filters" 1 "--qfilters = missing" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m qfilter --budget 0.2
expect_error "qfilter's filters on another score" 1 "--qfilters = f.json" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m knorm --budget 0.2 --qfilters f.json
expect_error "CriticalKV's first stage without critical=on" 1 "--first-stage = 0.3" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m snapkv --budget 0.2 --window 16 --first-stage 0.3
expect_error "CriticalKV with a streaming score" 1 "--critical = on \(h2o\)" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m h2o --budget 0.2 --window 16 --critical on
expect_error "CriticalKV on a synthetic dump (no o_proj)" 2 "/layers/0/o_proj = missing" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m critical-snapkv --budget 0.2 --window 16
expect_error "joint scores with snapkv only" 1 "--score = tova" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m joint --score tova --budget 0.3 --quant kivi --window 16
expect_error "unknown score in a spec" 2 "score = lru" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m adakv --score lru --budget 0.2 --window 16
expect_empty_dir "no output after errors" "$o"
finish
