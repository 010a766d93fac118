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
# llama.cpp's cache types as variants: ggml blocks (q4_0: 18 bytes per 32 values, K and V), their
# error against the f32 rows between q8_0's and q4's.
expect "bench attention times ggml-q4_0 and ggml-q8_0 caches" 0 "vs f32 ok" bash -c "'$AKV' bench attention \
  --contexts 256 --head-dims 64 --gqa 2 --kv-heads 2 --variants f32,ggml-q8_0,ggml-q4_0 --repeat 2 --warmup 0 \
  --min-sample 0 --stream-mb 16 --json -o '$TMP/g.json' && '$PY' - '$TMP/g.json'" <<'PY'
import json, sys
rows = {r["variant"]: r for r in json.load(open(sys.argv[1]))["rows"]}
assert abs(rows["ggml-q4_0"]["cache_mb"] - 2 * 2 * 256 * 64 / 32 * 18 / 1e6) < 1e-9, rows["ggml-q4_0"]
assert 0 < rows["ggml-q8_0"]["err_vs_f32"] < rows["ggml-q4_0"]["err_vs_f32"] < 0.5, rows
print("vs f32 ok")
PY
# KVQuant's codes (nuq<b>: codebooks fitted on the bench's rows): their error against the f32 rows
# falls with the bits, and 4-bit codes do better than KIVI's 3-bit ones.
expect "bench attention times nuq caches" 0 "nuq ok" bash -c "'$AKV' bench attention \
  --contexts 256 --head-dims 64 --gqa 2 --kv-heads 2 --variants f32,nuq2,nuq4,q3 --repeat 2 --warmup 0 \
  --min-sample 0 --stream-mb 16 --json -o '$TMP/n.json' && '$PY' - '$TMP/n.json'" <<'PY'
import json, sys
rows = {r["variant"]: r for r in json.load(open(sys.argv[1]))["rows"]}
assert 0 < rows["nuq4"]["err_vs_f32"] < rows["q3"]["err_vs_f32"] < rows["nuq2"]["err_vs_f32"] < 0.5, rows
print("nuq ok")
PY
# Method specs as variants: each stored as its method stores it, so the spec and the bench name of
# one layout give the same bytes and the same error; a uniform spec keeps its own layout (per-token
# keys, no residual); eviction methods are not one layout.
expect "bench attention takes method specs" 0 "specs ok" bash -c "'$AKV' bench attention \
  --contexts 300 --head-dims 64 --gqa 2 --kv-heads 2 --repeat 1 --warmup 0 --min-sample 0 --stream-mb 16 --json \
  --variants f32,full,f16,none,k4v2,kivi:bits-key=4:bits-value=2,ggml-q4_0,ggml:k=q4_0:v=q4_0,ggml:k=q8_0:v=q4_0,q4,uniform \
  -o '$TMP/s.json' && '$PY' - '$TMP/s.json'" <<'PY'
import json, sys
rows = {r["variant"]: r for r in json.load(open(sys.argv[1]))["rows"]}
for a, b in (("f32", "full"), ("f16", "none"), ("k4v2", "kivi:bits-key=4:bits-value=2"), ("ggml-q4_0", "ggml:k=q4_0:v=q4_0")):
    assert rows[a]["cache_bytes"] == rows[b]["cache_bytes"] and rows[a]["err_vs_f32"] == rows[b]["err_vs_f32"], (a, b)
assert rows["ggml-q4_0"]["cache_bytes"] < rows["ggml:k=q8_0:v=q4_0"]["cache_bytes"] < rows["f16"]["cache_bytes"]
# uniform: 4-bit per-token groups of 32 with f16 scale and zero, no residual: 300 x 64 x (4 + 2 x 16 / 32) bits x K, V x 2 heads
assert rows["uniform"]["cache_bytes"] == 2 * 2 * 300 * 64 * (4 + 1) // 8, rows["uniform"]["cache_bytes"]
print("specs ok")
PY
expect_error "bench attention: an eviction spec is refused" 2 "eviction.*akv bench policy.*--variants = snapkv:budget=0.5" \
  "$AKV" bench attention --contexts 64 --head-dims 64 --variants snapkv:budget=0.5
expect_error "bench attention: nuq on a context too short to fit its codebooks" 1 \
  "nuq4 fits its codebooks on the bench's rows of each context: no value left .*\\(--contexts = 2\\)" \
  "$AKV" bench attention --contexts 2 --head-dims 64 --variants nuq4 --repeat 1 --stream-mb 1
expect_error "bench attention: a ggml variant needs head_dim in whole blocks" 2 "--head-dims \\(ggml-q4_0\\) = 48" \
  "$AKV" bench attention --contexts 64 --head-dims 48 --variants ggml-q4_0
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

cp "$SRC/data/fixtures/calibration.json" "$TMP/bench_cal.json"
expect_error "bench policy: the output is a method's calibration" 1 "output is an input" \
  "$AKV" bench policy --contexts 200 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 \
  --methods "kivi:calibration=$TMP/bench_cal.json" -o "$TMP/bench_cal.json"
# nuq: codebooks fitted on a synthetic prompt without calibration=, the file's with it; each
# checked against the reference attention before timing.
expect "bench policy: nuq with fitted codebooks and with a calibration's" 0 "^ +200 +nuq:bits=3 +[0-9]" \
  "$AKV" bench policy --contexts 200 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --warmup 1 --repeat 2 \
  --methods "kivi:bits=3:residual=0,nuq:bits=3,nuq:calibration=$TMP/bench_cal.json:bits=4"
expect_output "bench policy: a note names the methods whose codebooks were fitted" \
  "^nuq:bits=3: KVQuant's codebooks .*fitted on a 512-token synthetic prompt"
# CSV quotes a field holding a quote (RFC 4180): a calibration file whose name has one.
cp "$TMP/bench_cal.json" "$TMP/cal\"q.json"
"$AKV" bench policy --contexts 200 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --warmup 0 --repeat 1 --csv \
  --methods "none,kivi:calibration=$TMP/cal\"q.json" -o "$TMP/quoted.csv" 2>/dev/null
same=$("$PY" -c 'import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
raw = "\"kivi:calibration=" + sys.argv[2].replace("\"", "\"\"") + "\","
print([r["method"] for r in rows] == ["none", "kivi:calibration=" + sys.argv[2]] and raw in open(sys.argv[1]).read())' \
  "$TMP/quoted.csv" "$TMP/cal\"q.json")
expect_equal "bench --csv: a field with a quote is quoted" "$same" "True"
# The scaling fit over contexts >= 4096: each variant's exponent is the least-squares slope of
# log(min time) on log(context) of its rows.
"$AKV" bench attention --contexts 4096,8192,12288 --head-dims 32 --gqa 1 --kv-heads 1 --variants q4,f16 --repeat 2 \
  --min-sample 0 --stream-mb 16 --json -o "$TMP/scaling.json" 2>/dev/null
same=$("$PY" -c 'import json, math, sys
j = json.load(open(sys.argv[1]))
ok = len(j["scaling"]) == 2
for s in j["scaling"]:
    pts = [(math.log(r["context"]), math.log(r["min_s"])) for r in j["rows"] if r["variant"] + "@" + r["isa"] == s["variant"]]
    m = len(pts); sx = sum(x for x, _ in pts); sy = sum(y for _, y in pts)
    k = (m * sum(x * y for x, y in pts) - sx * sy) / (m * sum(x * x for x, _ in pts) - sx * sx)
    ok = ok and m == 3 and s["contexts"] == 3 and abs(k - s["exponent"]) <= 1e-9 * max(1.0, abs(k))
print(ok)' "$TMP/scaling.json")
expect_equal "bench attention: the scaling exponents are the rows' log-log slopes" "$same" "True"
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
# Sharded suites: parts merged by `akv merge` hold the unsharded run's rows, in its order, each
# row with its shard; every shard times its own baselines.
sa=(--contexts 1024,300,4096 --head-dims 32,64 --gqa 1,2 --kv-heads 2 --variants f16,q4 --repeat 1 --min-sample 0 --stream-mb 16)
"$AKV" bench attention "${sa[@]}" --json -o "$TMP/sa.json" 2>/dev/null
for k in 1 2 3 4; do "$AKV" bench attention "${sa[@]}" --shard "$k/4" -o "$TMP/sa$k.json" 2>/dev/null; done
sq=(--heads 2 --tokens 256 --head-dim 64 --bits 2 4 8 --repeat 1)
"$AKV" bench quant "${sq[@]}" --json -o "$TMP/sq.json" 2>/dev/null
for k in 1 2; do "$AKV" bench quant "${sq[@]}" --shard "$k/2" -o "$TMP/sq$k.json" 2>/dev/null; done
sp=(--contexts 200,100,300 --layers 1 --heads 4 --kv-heads 2 --head-dim 32 --methods none,kivi-2 --warmup 1 --repeat 2)
"$AKV" bench policy "${sp[@]}" --json -o "$TMP/sp.json" 2>/dev/null
for k in 1 2 3; do "$AKV" bench policy "${sp[@]}" --shard "$k/3" -o "$TMP/sp$k.json" 2>/dev/null; done
expect "merge bench attention parts (any order)" 0 "" "$AKV" merge "$TMP/sa3.json" "$TMP/sa1.json" "$TMP/sa4.json" "$TMP/sa2.json" --json -o "$TMP/sam.json"
expect "merge bench quant parts" 0 "" "$AKV" merge "$TMP/sq2.json" "$TMP/sq1.json" --json -o "$TMP/sqm.json"
expect "merge bench policy parts" 0 "" "$AKV" merge "$TMP/sp1.json" "$TMP/sp2.json" "$TMP/sp3.json" --json -o "$TMP/spm.json"
expect "merged bench rows equal the unsharded run's, shards in order" 0 "rows ok" "$PY" - "$TMP" <<'PY'
import json, sys
t = sys.argv[1]
def load(n): return json.load(open(f"{t}/{n}.json"))
timing = {"shard", "calls_per_sample", "mean_s", "stdev_s", "min_s", "samples_s", "policy_samples_s"}
def same(full, merged, shards, keep=lambda r: True):
    assert merged["format"] == "akv-bench" and merged["params"] == full["params"], merged["params"]
    assert [s["shard"] for s in merged["shards"]] == list(range(1, shards + 1))
    a = [{k: r[k] for k in ("suite", "head_dim", "context", "gqa", "variant", "isa", "op", "axis", "bits", "method", "cache_bytes", "bytes_stored", "rows") if k in r} for r in full["rows"] if keep(r)]
    b = [{k: r[k] for k in ("suite", "head_dim", "context", "gqa", "variant", "isa", "op", "axis", "bits", "method", "cache_bytes", "bytes_stored", "rows") if k in r} for r in merged["rows"] if keep(r)]
    assert a == b, (a, b)
    shard = [r["shard"] for r in merged["rows"]]
    assert shard == sorted(shard) and set(shard) == set(range(1, shards + 1)), shard
same(load("sa"), load("sam"), 4)
assert [s["variant"] for s in load("sam")["scaling"]] == [s["variant"] for s in load("sa")["scaling"]]
sqm = load("sqm")
assert [r["op"] for r in sqm["rows"]].count("memcpy") == 2  # one baseline per shard
same(load("sq"), sqm, 2, keep=lambda r: r["op"] != "memcpy")
for r in sqm["rows"]:  # every ratio against its own shard's memcpy
    base = next(m for m in sqm["rows"] if m["op"] == "memcpy" and m["shard"] == r["shard"])
    assert abs(r["vs_memcpy"] - r["gbs"] / base["gbs"]) <= 1e-12 * r["vs_memcpy"], r
same(load("sp"), load("spm"), 3)
print("rows ok")
PY
expect "merged bench table" 0 "shard 2: stream read" "$AKV" merge "$TMP/sa1.json" "$TMP/sa2.json" "$TMP/sa3.json" "$TMP/sa4.json"
"$AKV" bench quant --heads 2 --tokens 128 --head-dim 64 --bits 2 4 8 --repeat 1 --shard 2/2 -o "$TMP/sqx.json" 2>/dev/null
if command -v parallel >/dev/null; then
  expect "run_sharded bench quant (one shard at a time)" 0 "" \
    bash "$SRC/scripts/run_sharded" --akv "$AKV" 2 "$TMP/rs.json" -- bench quant "${sq[@]}" --json
  expect "run_sharded bench: merged report" 0 '"suite": "quant"' cat "$TMP/rs.json"
else
  echo "skip run_sharded bench: GNU parallel not installed (scripts/setup installs it)"
fi
mkdir -p "$TMP/none"
expect_error "merge bench: a part of another run" 2 "part of another run: params" \
  "$AKV" merge "$TMP/sq1.json" "$TMP/sqx.json" -o "$TMP/none/m.json"
expect_error "merge bench: a shard missing" 2 "shard missing .*shard = 2/4" \
  "$AKV" merge "$TMP/sa1.json" "$TMP/sa3.json" "$TMP/sa4.json" -o "$TMP/none/m.json"
expect_error "merge bench: suites differ" 2 "different shard counts|part of another run: suite" \
  "$AKV" merge "$TMP/sq1.json" "$TMP/sp2.json" -o "$TMP/none/m.json"
expect_error "bench --shard 3/2" 2 "--shard = 3/2" "$AKV" bench quant "${sq[@]}" --shard 3/2 -o "$TMP/none/x.json"
expect_empty_dir "no output after bench merge errors" "$TMP/none"
# scripts/dev/bench_vs_llamacpp: no build directory is not an error; a stand-in test-backend-ops
# (printing llama.cpp's perf line format) is parsed and set beside akv at the same shape.
expect "bench_vs_llamacpp without a build" 0 "nothing to compare against" "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/no-llama"
mkdir -p "$TMP/llama/bin"
cat > "$TMP/llama/bin/test-backend-ops" <<'SH'
#!/bin/sh
echo "Backend 1/1: CPU"
echo "  FLASH_ATTN_EXT(hsk=64,hsv=64,nh=8,nr23=[1,1],kv=512,nb=1,mask=1,sinks=0,max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=[0,1,2,3],kv_view=1,v_is_view_of_k=0):      240 runs -   250.00 us/run -  33.55 MFLOP/run"
echo "  FLASH_ATTN_EXT(hsk=64,hsv=64,nh=8,nr23=[1,1],kv=512,nb=1,mask=1,sinks=0,max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=q8_0,type_V=q8_0,permute=[0,1,2,3],kv_view=1,v_is_view_of_k=0):      240 runs -   900.00 us/run -  33.55 MFLOP/run"
SH
chmod +x "$TMP/llama/bin/test-backend-ops"
expect "bench_vs_llamacpp parses test-backend-ops and times akv at its shapes" 0 "64 +512 +1 +0.250ms" \
  "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/llama" --akv "$AKV" --contexts 512 --head-dims 64 --gqa 1 --repeat 1 --json "$TMP/vs.json"
expect "bench_vs_llamacpp JSON: f16 rows only, ratio = llama / akv" 0 "vs ok" "$PY" - "$TMP/vs.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["attention"]["rows"]
assert {(r["variant"], r["attention"]) for r in rows} == {("f16", "exact"), ("q8", "exact"), ("q4", "exact"), ("q4", "int8"), ("q2", "exact"), ("q2", "int8")}, rows
for r in rows:
    assert r["llama_f16_ms"] == 0.25 and abs(r["ratio"] - 0.25 / r["akv_ms"]) < 1e-12, r
print("vs ok")
PY
# --isa-build avx2=DIR: a second stand-in (as an AVX2-only llama.cpp build, twice as slow) is the
# baseline of akv's AVX2 rows; the main build stays that of the others.
mkdir -p "$TMP/llama_avx2"
sed 's/250.00 us/500.00 us/' "$TMP/llama/bin/test-backend-ops" >"$TMP/llama_avx2/test-backend-ops"
chmod +x "$TMP/llama_avx2/test-backend-ops"
expect "bench_vs_llamacpp --isa-build: one baseline column per build" 0 "llama f16 #[12]: .*llama_avx2 \\(baseline of akv's avx2 rows\\)" \
  "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/llama" --akv "$AKV" --contexts 512 --head-dims 64 --gqa 1 --repeat 1 \
  --isa generic,avx2 --isa-build avx2="$TMP/llama_avx2" --json "$TMP/vs2.json"
expect "bench_vs_llamacpp --isa-build JSON: AVX2 rows against the AVX2 build" 0 "isa-build ok" "$PY" - "$TMP/vs2.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["attention"]["rows"]
assert {r["isa"] for r in rows} == {"avx2", "generic"}, rows
for r in rows:
    want = 0.5 if r["isa"] == "avx2" else 0.25
    assert r["llama_f16_ms"] == want and r["llama_build"].endswith("llama_avx2" if want == 0.5 else "llama"), r
    assert abs(r["ratio"] - want / r["akv_ms"]) < 1e-12, r
print("isa-build ok")
PY
mkdir -p "$TMP/llama_fails"
printf '#!/bin/sh\necho "must not run" >&2\nexit 1\n' >"$TMP/llama_fails/test-backend-ops"
chmod +x "$TMP/llama_fails/test-backend-ops"
expect "bench_vs_llamacpp --isa-build for every --isa: the main build does not run" 0 "llama f16 #1: .*llama_avx2 .*avx2 rows" \
  "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/llama_fails" --akv "$AKV" --contexts 512 --head-dims 64 --gqa 1 --repeat 1 \
  --isa avx2 --isa-build avx2="$TMP/llama_avx2"
expect "bench_vs_llamacpp --isa-build at an instruction set akv does not time" 2 "akv times no rows at avx2" \
  "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/llama" --akv "$AKV" --isa generic --isa-build avx2="$TMP/llama_avx2"
expect "bench_vs_llamacpp --isa-build without test-backend-ops" 2 "no test-backend-ops in .*no-llama" \
  "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/llama" --akv "$AKV" --isa avx2 --isa-build avx2="$TMP/no-llama"
# A stand-in that computes on two threads at once (hashing releases the GIL): the script counts
# them from /proc and warns that akv ran with another number.
mkdir -p "$TMP/llama2/bin"
{
  echo "#!$PY"
  cat <<'PY'
import hashlib, threading
data = b"x" * (64 << 20)
def work():
    for _ in range(8):
        hashlib.sha256(data).digest()
ts = [threading.Thread(target=work) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
print("  FLASH_ATTN_EXT(hsk=64,hsv=64,nh=8,nr23=[1,1],kv=512,nb=1,mask=1,sinks=0,max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=[0,1,2,3],kv_view=1,v_is_view_of_k=0):      240 runs -   250.00 us/run -  33.55 MFLOP/run")
PY
} >"$TMP/llama2/bin/test-backend-ops"
chmod +x "$TMP/llama2/bin/test-backend-ops"
expect "bench_vs_llamacpp counts test-backend-ops' threads and warns when akv's differ" 0 \
  "thread counts differ: rerun with --tbo-threads 2" \
  "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/llama2" --akv "$AKV" --contexts 512 --head-dims 64 --gqa 1 --repeat 1 --tbo-threads 1
# The perplexity part with a stand-in llama-perplexity (its final-estimate line, PPL 100 for f16
# KV and 110 with -ctk q4_0) beside akv evaluate --text on a tiny model with the byte tokenizer:
# the script reports akv's perplexities and their relative differences to llama.cpp's.
cat > "$TMP/llama/bin/llama-perplexity" <<'SH'
#!/bin/sh
case "$*" in *q4_0*) p=110.0 ;; *) p=100.0 ;; esac
echo "Final estimate: PPL = $p +/- 1.0" >&2
SH
chmod +x "$TMP/llama/bin/llama-perplexity"
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/vs_hf" --dim 64 --hidden 96 --vocab 260 --heads 2 --kv-heads 1 --layers 1 --seed 3
"$PY" - "$TMP/vs_hf/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["akv_tokenizer"] = "bytes"; json.dump(c, open(sys.argv[1], "w"))
PY
head -c 3000 "$SRC/README.md" >"$TMP/vs_text.txt"
expect "bench_vs_llamacpp perplexity part: akv beside llama-perplexity, relative differences" 0 "relative difference" \
  "$PY" "$SRC/scripts/dev/bench_vs_llamacpp" "$TMP/llama" --akv "$AKV" --contexts 512 --head-dims 64 --gqa 1 --repeat 1 \
  --model "$TMP/vs_hf" --text "$TMP/vs_text.txt" --ctx 64 --chunks 2 --json "$TMP/vsp.json"
expect "bench_vs_llamacpp JSON: relative difference = (akv - llama.cpp) / llama.cpp" 0 "ppl ok" "$PY" - "$TMP/vsp.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["perplexity"]
assert p["llama f16"]["ppl"] == 100.0 and p["llama q4_0"]["ppl"] == 110.0, p
ours = p["akv ggml"]["ppl"]
d = p["relative_difference"]
assert abs(d["full vs llama f16"] - (ours["full"] - 100) / 100) < 1e-12, d
assert abs(d["ggml:k=q4_0:v=q4_0 vs llama q4_0"] - (ours["ggml:k=q4_0:v=q4_0"] - 110) / 110) < 1e-12, d
assert p["akv kivi-4"]["ppl"]["full"] == ours["full"]
print("ppl ok")
PY
finish
