#!/usr/bin/env bash
# akv bench suites on tiny synthetic sizes: the kernel checks pass, the table/CSV/JSON outputs
# carry every row's parameters and environment, scripts/compare_bench matches two runs, and bad
# flags fail with one error line.
source "$(dirname "$0")/lib.sh"

expect "bench attention table" 0 "x f16" \
  "$AKV" bench attention --contexts 300,700 --head-dims 64 --gqa 1,2 --kv-heads 2 --variants f16,q4,k4v2 \
  --repeat 2 --warmup 0 --min-sample 0 --stream-mb 16
cp "$TMP/out" "$TMP/table.txt"
expect "bench attention table lists q4 at 700 tokens" 0 " 700 +2 +q4 " cat "$TMP/table.txt"
expect "bench attention --json -o" 0 '"stream_read_gbs"' \
  bash -c "'$AKV' bench attention --contexts 300 --head-dims 64 --gqa 2 --kv-heads 2 --variants f16,q2 --repeat 3 \
  --min-sample 0 --stream-mb 16 --json -o '$TMP/a.json' && cat '$TMP/a.json'"
expect_output "bench --json names its format" '"format": "akv-bench"'
"$PY" - "$TMP/a.json" <<'PY' && pass "bench attention JSON rows" || fail "bench attention JSON rows"
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
assert len(rows) == 2, rows
for r in rows:
    for k in ("commit", "cpu", "threads", "head_dim", "context", "gqa", "variant", "mean_s", "stdev_s", "min_s"):
        assert k in r, k
    assert len(r["samples_s"]) == 3 and min(r["samples_s"]) == r["min_s"]
assert rows[1]["cache_bytes"] < rows[0]["cache_bytes"]
# FMA bound: query heads x tokens x head_dim x 2 multiply-adds at the run's peak
peak = d["fma_peak_gmacs"]
assert peak > 0 and len(d["fma_peak_samples_gmacs"]) >= 3
for r in rows:
    macs = 2 * r["kv_heads"] * r["gqa"] * r["context"] * r["head_dim"]
    assert abs(r["fma_bound_ms"] - macs / (peak * 1e9) * 1e3) <= 1e-9 * r["fma_bound_ms"], r
    assert abs(r["of_fma"] - r["fma_bound_ms"] / r["ms_min"]) <= 1e-9 * r["of_fma"], r
PY
expect "bench attention --csv" 0 "^suite,commit,cpu,threads," \
  "$AKV" bench attention --contexts 300 --head-dims 64 --gqa 1 --kv-heads 1 --variants f16 --repeat 1 --min-sample 0 --stream-mb 16 --csv
"$AKV" bench attention --contexts 300 --head-dims 64 --gqa 2 --kv-heads 2 --variants f16,q2,q3 --repeat 2 \
  --min-sample 0 --stream-mb 16 --json -o "$TMP/b.json" 2>/dev/null
expect "compare_bench matches rows" 0 "geometric mean ratio over 2 rows" \
  "$PY" "$SRC/scripts/compare_bench" "$TMP/a.json" "$TMP/b.json"
expect "bench quant" 0 "dequantize +token +4" \
  "$AKV" bench quant --heads 2 --tokens 256 --head-dim 64 --bits 4 --repeat 2
"$AKV" bench quant --heads 1 --tokens 64 --head-dim 64 --bits 4 --repeat 1 --json -o "$TMP/q.json" 2>/dev/null
run "$PY" "$SRC/scripts/compare_bench" "$TMP/a.json" "$TMP/q.json"
if [[ $rc -eq 2 ]] && grep -q "different suites" "$TMP/err"; then pass "compare_bench different suites"; else fail "compare_bench different suites: rc $rc"; fi
expect "bench policy" 0 "kivi-2" \
  "$AKV" bench policy --contexts 200 --layers 1 --heads 4 --kv-heads 2 --head-dim 32 \
  --methods none,kivi-2,h2o:budget=0.5 --warmup 1 --repeat 3

expect_error "unknown attention variant" 2 "unknown variant.*q5" \
  "$AKV" bench attention --contexts 300 --variants q5
expect "bench attention --isa generic,avx2 (checked against the reference, one row each)" 0 " q4 +avx2 " \
  "$AKV" bench attention --contexts 300 --head-dims 64 --gqa 2 --kv-heads 2 --variants f16,q4 --isa generic,avx2 \
  --repeat 1 --min-sample 0 --stream-mb 16
expect_error "partition not a multiple of the tile" 1 "multiple of --tile.*--tile/--partition.*300/1000" \
  "$AKV" bench attention --contexts 300 --variants q4 --tile 300 --partition 1000
expect_error "unknown instruction set" 2 "unknown instruction set.*--isa.*sse9" \
  "$AKV" bench attention --contexts 300 --variants q4 --isa sse9
expect_error "policy heads not a multiple" 1 "multiple of kv-heads" \
  "$AKV" bench policy --contexts 100 --heads 3 --kv-heads 2
finish
