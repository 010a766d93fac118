#!/usr/bin/env bash
# compress / info / evaluate / decompress pipeline, byte accounting against h5py, bad input.
source "$(dirname "$0")/lib.sh"
need_python_h5py
TOOL="$(dirname "$0")/cache_tool.py"
d="$TMP/d.h5"
"$AKV" synth -q -o "$d" --layers 2 --heads 8 --kv-heads 2 --head-dim 64 --tokens 700 --window 16 \
  --pre-rope >/dev/null || { echo "synth failed"; exit 1; }

for m in none uniform kivi kivi-2 kivi-4 k4v2 k4v3; do
  expect "compress --method $m" 0 "wrote .*bits/element" "$AKV" compress -q "$d" -o "$TMP/c_$m.h5" -m "$m"
done
expect "compress --pre-rope --outlier-fraction" 0 "outliers [1-9]" \
  "$AKV" compress -q "$d" -o "$TMP/c_x.h5" -m k4v2 --pre-rope --outlier-fraction 0.05
expect "compress --key-axis token --group 64 --residual 64" 0 "wrote" \
  "$AKV" compress -q "$d" -o "$TMP/c_y.h5" -m kivi --bits-key 3 --bits-value 8 --key-axis token --group 64 --residual 64
# --method also takes a method spec: the same cache as the spec's flags given as flags.
"$AKV" compress -q "$d" -o "$TMP/c_spec.h5" -m kivi:bits=3:rotate=random:rotate-seed=5 >/dev/null
"$AKV" compress -q "$d" -o "$TMP/c_flags.h5" -m kivi --bits 3 --rotate random --rotate-seed 5 >/dev/null
if cmp -s "$TMP/c_spec.h5" "$TMP/c_flags.h5"; then pass "compress --method SPEC equals its flags"; else
  fail "compress --method SPEC equals its flags"; fi
expect_error "compress: a flag both in the method spec and on the command line" 1 \
  "given twice.*--bits = kivi:bits=3" "$AKV" compress -q "$d" -o "$TMP/never.h5" -m kivi:bits=3 --bits 4
expect_error "compress: nuq without its codebooks" 1 "nuq needs calibration=calib.json" \
  "$AKV" compress -q "$d" -o "$TMP/never.h5" -m nuq
expect_error "compress: an unknown flag in the method spec" 1 "unknown method flag" \
  "$AKV" compress -q "$d" -o "$TMP/never.h5" -m kivi:bogus=1

# Byte accounting: info's per-component bytes equal the stored dataset sizes read by h5py.
for m in none uniform kivi-2 k4v3 x y; do expect_cache_bytes "$TMP/c_$m.h5"; done
expect "compress --json reports f16 bytes" 0 '"f16_bytes": 716800' \
  "$AKV" compress -q "$d" -o "$TMP/c_j.h5" -m kivi-4 --json
expect_output "compress --json names its format" '"format": "akv-compress"'
expect "info on a cache" 0 "bits/element" "$AKV" info "$TMP/c_kivi-2.h5"
# 700 tokens, R 128, G 32: the kivi rule quantizes 700 - 700 mod 128 = 640 keys, bounded 544.
expect "residual rows are the dump's f16 keys" 0 "residual ok 640" "$PY" "$TOOL" decoded "$TMP/c_kivi-2.h5" "$d" 1 1
# Sharded fidelity: 3 shards of the layers (needle counts included) merge into the same report.
"$AKV" compress -q "$d" -o "$TMP/c_ev.h5" -m adakv --budget 0.3 --quant kivi-4 --window 16
"$AKV" evaluate -q --dump "$d" --cache "$TMP/c_ev.h5" --json -o "$TMP/f_full.json"
for k in 1 2 3; do "$AKV" evaluate -q --dump "$d" --cache "$TMP/c_ev.h5" --shard "$k/3" -o "$TMP/f_p$k.json"; done
"$AKV" merge "$TMP/f_p3.json" "$TMP/f_p1.json" "$TMP/f_p2.json" --json -o "$TMP/f_merged.json"
if cmp -s "$TMP/f_full.json" "$TMP/f_merged.json" && grep -q needle_survival "$TMP/f_merged.json"; then
  pass "evaluate --dump --shard: merged fidelity report equals the unsharded one"
else
  fail "evaluate --dump --shard: merged fidelity report equals the unsharded one"
fi
# evaluate --dump --methods: each method through a scratch cache in $TMPDIR, the same figures as
# compress then evaluate --dump --cache, and no file left behind; nine methods: two batches of
# caches evaluated together (the last one alone).
mkdir -p "$TMP/scratch"
methods=kivi-2,kivi-4,k4v2,k4v3,uniform,uniform:bits=2,kivi-2:residual=0,kivi-4:residual=0,adakv:budget=0.3:quant=kivi-4:window=16
TMPDIR="$TMP/scratch" "$AKV" evaluate -q --dump "$d" --json -o "$TMP/f_methods.json" --methods "$methods"
"$AKV" evaluate -q --dump "$d" --cache "$TMP/c_kivi-2.h5" --json -o "$TMP/f_kivi2.json"
"$AKV" evaluate -q --dump "$d" --cache "$TMP/c_kivi-2.h5" --per-head -o "$TMP/f_kivi2_heads.txt"
for m in kivi-4 k4v2 k4v3 uniform; do "$AKV" evaluate -q --dump "$d" --cache "$TMP/c_$m.h5" --json -o "$TMP/f_$m.json"; done
same=$("$PY" -c 'import json, sys
j = json.load(open(sys.argv[1]))
rows = [l.split() for l in open(sys.argv[2]).read().splitlines()[2:]]
want = []
for layer in j["layers"]:
    want += [[str(layer["layer"]), str(h), "%.3e" % x["kl"]] for h, x in enumerate(layer["heads"])]
    want.append([str(layer["layer"]), "all", "%.3e" % layer["kl"]])
want.append(["all", "all", "%.3e" % j["overall"]["kl"]])
print([r[:2] + [r[5]] for r in rows] == want)' "$TMP/f_kivi2.json" "$TMP/f_kivi2_heads.txt")
expect_equal "evaluate --per-head: a row per head and per layer, the JSON's figures" "$same" "True"
same=$("$PY" -c 'import json, sys
m = json.load(open(sys.argv[1]))["methods"]
refs = [json.load(open(f)) for f in sys.argv[2:]]
keys = ("overall", "layers", "memory")
at = [0, 1, 2, 3, 4, 8]
print(len(m) == 9 and [m[i]["method"] for i in at] == ["kivi-2", "kivi-4", "k4v2", "k4v3", "uniform", "adakv:budget=0.3:quant=kivi-4:window=16"]
      and all(m[i][k] == r[k] for i, r in zip(at, refs) for k in keys))' "$TMP/f_methods.json" "$TMP/f_kivi2.json" \
  "$TMP/f_kivi-4.json" "$TMP/f_k4v2.json" "$TMP/f_k4v3.json" "$TMP/f_uniform.json" "$TMP/f_full.json")
expect_equal "evaluate --dump --methods: each report as compress + evaluate --cache" "$same" "True"
# Its CSV and table carry the JSON's figures (CSV to 9 digits; the table "-" where nothing is evicted).
TMPDIR="$TMP/scratch" "$AKV" evaluate -q --dump "$d" --methods "$methods" --csv -o "$TMP/f_methods.csv"
TMPDIR="$TMP/scratch" "$AKV" evaluate -q --dump "$d" --methods "$methods" -o "$TMP/f_methods.txt"
same=$("$PY" -c 'import csv, json, sys
m = json.load(open(sys.argv[1]))["methods"]
rows = list(csv.DictReader(open(sys.argv[2])))
keys = ("key_rel_mse", "value_rel_mse", "attn_rel_err", "kl", "recall_at_1", "recall_at_8", "recall_at_32", "retained_mass")
close = lambda a, b: abs(float(a) - b) <= 1e-8 * max(abs(b), 1e-30)
ok = len(rows) == len(m) and all(r["method"] == x["method"] and int(r["bytes"]) == x["memory"]["bytes"]["total"]
     and close(r["bits_per_element"], x["memory"]["bits_per_element"]) and all(close(r[k], x["overall"][k]) for k in keys)
     for r, x in zip(rows, m))
table = open(sys.argv[3]).read().splitlines()
ok = ok and len(table) == 10 and table[1].split()[0] == "kivi-2" and table[1].split()[-2:] == ["-", "-"] \
     and table[9].split()[-2] == "%.4f" % m[8]["overall"]["retained_mass"]
print(ok)' "$TMP/f_methods.json" "$TMP/f_methods.csv" "$TMP/f_methods.txt")
expect_equal "evaluate --dump --methods: CSV and table carry the JSON's figures" "$same" "True"
expect_empty_dir "evaluate --dump --methods leaves no scratch cache" "$TMP/scratch"
expect_error "evaluate --dump --methods: the reference full has no cache" 1 "reference full.*--methods = full" \
  "$AKV" evaluate -q --dump "$d" --methods kivi-2,full
expect_error "evaluate --dump: --methods and --cache together" 1 "takes no --cache, --shard, --per-head" \
  "$AKV" evaluate -q --dump "$d" --methods kivi-2 --cache "$TMP/c_kivi-2.h5"
expect_error "evaluate --dump --methods: TMPDIR missing" 3 "no temporary directory.*TMPDIR = $TMP/none" \
  env TMPDIR="$TMP/none" "$AKV" evaluate -q --dump "$d" --methods kivi-2
"$AKV" allocate -q "$d" --method adakv --budget 0.3 --window 16 -o "$TMP/b_m.json" >/dev/null
expect_error "evaluate --dump --methods: the output is a method's budgets file" 1 "output is an input" \
  "$AKV" evaluate -q --dump "$d" --methods "adakv:budgets=$TMP/b_m.json" -o "$TMP/b_m.json"
expect_error "merge: a fidelity shard missing" 2 "shard missing .*shard = 2/3" \
  "$AKV" merge "$TMP/f_p1.json" "$TMP/f_p3.json" -o "$TMP/never.json"
"$AKV" --max-isa generic evaluate -q --dump "$d" --cache "$TMP/c_ev.h5" --shard 2/3 -o "$TMP/f_generic2.json"
expect_error "merge: a fidelity part computed with the plain loops (--max-isa generic)" 2 "part of another run: kernels" \
  "$AKV" merge "$TMP/f_p1.json" "$TMP/f_generic2.json" "$TMP/f_p3.json" -o "$TMP/never.json"
# A one-part run that claims more layers (or heads) than the hash-verified cache holds, and one
# naming a FIFO as its cache (hashing it would never end).
"$PY" - "$TMP" <<'PY'
import json, os, sys
d = sys.argv[1]
j = json.load(open(f"{d}/f_p1.json"))
parts = [json.load(open(f"{d}/f_p{k}.json")) for k in (1, 2, 3)]
layers = sum((p["layers"] for p in parts), [])
j.update(shards=1, first_layer=0, n_layers=len(layers) + 1, layers=layers + [layers[0]],
         needle_kept=[sum(x) for x in zip(*(p["needle_kept"] for p in parts))])
json.dump(j, open(f"{d}/f_extra.json", "w"))
os.mkfifo(f"{d}/fifo.h5")
j["cache"]["path"] = f"{d}/fifo.h5"
json.dump(j, open(f"{d}/f_fifo.json", "w"))
PY
expect_error "merge: fidelity parts with a layer the cache lacks" 2 "disagree with the cache's shape" \
  "$AKV" merge "$TMP/f_extra.json" -o "$TMP/never.json"
expect_error "merge: a fidelity part naming a FIFO as its cache" 2 "not a regular file .*cache.path" \
  timeout 20 "$AKV" merge "$TMP/f_fifo.json" -o "$TMP/never.json"
# Sharded compress: partial caches merged into the unsharded cache, byte for byte.
for m in "-m k4v2 --pre-rope --outlier-fraction 0.05" "-m adakv-global --budget 0.3 --quant kivi-4 --window 16"; do
  # shellcheck disable=SC2086
  "$AKV" compress -q "$d" -o "$TMP/cs_full.h5" $m >/dev/null
  for k in 1 2; do
    # shellcheck disable=SC2086
    "$AKV" compress -q "$d" -o "$TMP/cs_p$k.h5" $m --shard "$k/2" >/dev/null
  done
  "$AKV" merge "$TMP/cs_p2.h5" "$TMP/cs_p1.h5" -o "$TMP/cs_merged.h5" >/dev/null
  if cmp -s "$TMP/cs_full.h5" "$TMP/cs_merged.h5"; then pass "compress --shard 1/2, 2/2 + merge = compress ($m)"
  else fail "compress --shard 1/2, 2/2 + merge = compress ($m)"; fi
done
if command -v parallel >/dev/null; then
  bash "$SRC/scripts/run_sharded" --akv "$AKV" -j 2 2 "$TMP/cs_par.h5" -- compress "$d" -m adakv-global --budget 0.3 \
    --quant kivi-4 --window 16 >/dev/null
  if cmp -s "$TMP/cs_full.h5" "$TMP/cs_par.h5"; then pass "run_sharded compress (GNU parallel) = compress"
  else fail "run_sharded compress (GNU parallel) = compress"; fi
fi
expect_error "a partial cache is not a cache" 2 "partial cache .*akv merge" \
  "$AKV" evaluate -q --dump "$d" --cache "$TMP/cs_p1.h5"
expect_error "merge: a cache shard missing" 2 "shard missing .*shard = 1/2" \
  "$AKV" merge "$TMP/cs_p2.h5" -o "$TMP/never.h5"
"$AKV" compress -q "$d" -o "$TMP/ts_full.h5" -m balanced --hot 128 --warm 256 >/dev/null
for k in 1 2 3; do "$AKV" compress -q "$d" -o "$TMP/ts_p$k.h5" -m balanced --hot 128 --warm 256 --shard "$k/3" >/dev/null; done
"$AKV" merge "$TMP/ts_p1.h5" "$TMP/ts_p3.h5" "$TMP/ts_p2.h5" -o "$TMP/ts_merged.h5" >/dev/null
if cmp -s "$TMP/ts_full.h5" "$TMP/ts_merged.h5"; then pass "tiered compress --shard (3 parts) + merge = compress (akv-cache v2)"
else fail "tiered compress --shard (3 parts) + merge = compress (akv-cache v2)"; fi
expect "compress --quant-rule bounded" 0 "wrote" "$AKV" compress -q "$d" -o "$TMP/c_bounded.h5" -m kivi-2 --quant-rule bounded
expect "bounded rule: R + 28 keys in f16" 0 "residual ok 544" "$PY" "$TOOL" decoded "$TMP/c_bounded.h5" "$d" 1 1
expect "the cache records its rule" 0 '"quant_rule":"bounded"' "$AKV" info "$TMP/c_bounded.h5"
expect "a method spec takes the rule" 0 "kivi-2 K2/V2 R128 bounded" \
  "$AKV" plan --layers 32 --kv-heads 8 --head-dim 128 --memory 80GB --methods kivi-2:quant-rule=bounded,kivi-2

# Rotation before quantization (docs/compress.md#rotation---rotate): format v4, rebuilt rows rotated back.
expect "compress --rotate hadamard" 0 "uniform K4/V4 hadamard" \
  "$AKV" compress -q "$d" -o "$TMP/c_rot.h5" -m uniform --rotate hadamard
expect "a rotated cache is akv-cache v4" 0 "akv-cache v4" "$AKV" info "$TMP/c_rot.h5"
expect "evaluate a rotated cache" 0 '"attn_rel_err"' "$AKV" evaluate -q --json --dump "$d" --cache "$TMP/c_rot.h5"
expect "decompress a rotated cache" 0 "wrote" "$AKV" decompress -q "$TMP/c_rot.h5" --dump "$d" -o "$TMP/r_rot.h5"
expect_error "rotate with method none" 1 "no effect .*--rotate" \
  "$AKV" compress -q "$d" -o "$TMP/x.h5" -m none --rotate hadamard
expect_error "an unknown rotation" 2 "--rotate = spin" "$AKV" compress -q "$d" -o "$TMP/x.h5" -m kivi-2 --rotate spin
expect_error "rotate-seed without rotate=random" 1 "rotate-seed needs rotate=random" \
  "$AKV" compress -q "$d" -o "$TMP/x.h5" -m kivi-2 --rotate hadamard --rotate-seed 3
expect_error "rotation with pre-RoPE keys" 2 "after RoPE" \
  "$AKV" compress -q "$d" -o "$TMP/x.h5" -m kivi-2 --pre-rope --rotate hadamard
[[ ! -e $TMP/x.h5 ]] && pass "no output file after the refused rotations" || fail "a refused rotation left $TMP/x.h5"

# evaluate: table, JSON, CSV; none is exact.
expect "evaluate table" 0 "top32" "$AKV" evaluate -q --dump "$d" --cache "$TMP/c_kivi-2.h5"
expect "evaluate none is exact" 0 '"attn_rel_err": 0\.0,' "$AKV" evaluate -q --json --dump "$d" --cache "$TMP/c_none.h5"
expect_output "evaluate --json names its format" '"format": "akv-fidelity"'
run "$AKV" evaluate -q --csv --dump "$d" --cache "$TMP/c_k4v3.h5"
rows=$(wc -l <"$TMP/out")
if [[ $rc -eq 0 && $rows -eq 5 ]] && head -1 "$TMP/out" | grep -q '^layer,kv_head,key_rel_mse'; then
  pass "evaluate --csv: header + one row per layer/head"
else
  fail "evaluate --csv: rc $rc, $rows lines"
fi
"$AKV" evaluate -q --json --dump "$d" --cache "$TMP/c_x.h5" -o "$TMP/eval.json"
expect "evaluate -o writes the report" 0 "overall" cat "$TMP/eval.json"

# decompress: a dump again, whose K/V evaluate like the cache.
expect "decompress" 0 "wrote" "$AKV" decompress -q "$TMP/c_k4v2.h5" -o "$TMP/r.h5" --dtype f32
expect "decompressed file is a dump" 0 "akv-dump" "$AKV" info "$TMP/r.h5"

# Determinism: same bytes on 1 and 2 threads.
"$AKV" compress -q -t 1 "$d" -o "$TMP/t1.h5" -m k4v3 --outlier-fraction 0.03 >/dev/null
"$AKV" compress -q -t 2 "$d" -o "$TMP/t2.h5" -m k4v3 --outlier-fraction 0.03 >/dev/null
if cmp -s "$TMP/t1.h5" "$TMP/t2.h5"; then pass "compress: identical bytes on 1 and 2 threads"; else fail "compress differs across threads"; fi

# Bad input: exit 2, one line naming the field, no output file.
o="$TMP/out_dir"
mkdir -p "$o"
expect_error "bits 5" 2 "--bits-key = 5" "$AKV" compress -q "$d" -o "$o/c.h5" -m kivi --bits-key 5
expect_error "group 0" 2 "--group = 0" "$AKV" compress -q "$d" -o "$o/c.h5" --group 0
expect_error "residual not a multiple of G" 2 "--residual = 100" "$AKV" compress -q "$d" -o "$o/c.h5" --residual 100
expect_error "tiered flags need a tiered method" 1 "tiered flags" "$AKV" compress -q "$d" -o "$o/c.h5" -m kivi-2 --hot 64
expect_error "tiered hot budget too small" 2 "hot = 40" "$AKV" compress -q "$d" -o "$o/c.h5" -m balanced --hot 40
expect_error "tiered warm budget not whole blocks" 2 "warm = 100" "$AKV" compress -q "$d" -o "$o/c.h5" -m compact --warm 100
expect_error "outlier fraction 1" 2 "--outlier-fraction = 1" "$AKV" compress -q "$d" -o "$o/c.h5" --outlier-fraction 1
expect_error "unknown method" 2 "--method = gptq" "$AKV" compress -q "$d" -o "$o/c.h5" -m gptq
expect_error "unknown quant rule" 2 "--quant-rule = exact" "$AKV" compress -q "$d" -o "$o/c.h5" --quant-rule exact
expect_error "quant rule with none" 1 "--quant-rule" "$AKV" compress -q "$d" -o "$o/c.h5" -m none --quant-rule kivi
expect_error "residual with uniform" 1 "--residual" "$AKV" compress -q "$d" -o "$o/c.h5" -m uniform --residual 32
"$AKV" synth -q -o "$TMP/plain.h5" --layers 2 --heads 8 --kv-heads 2 --head-dim 64 --tokens 700 --window 16 >/dev/null
expect_error "pre-rope without key_pre_rope" 2 "key_pre_rope" "$AKV" compress -q "$TMP/plain.h5" -o "$o/c.h5" --pre-rope
expect_error "cache of another dump" 2 "another dump" \
  "$AKV" evaluate -q --dump "$TMP/plain.h5" --cache "$TMP/c_kivi-2.h5" -o "$o/e.json"
expect_error "decompress with another dump" 2 "another dump" \
  "$AKV" decompress -q "$TMP/c_kivi-2.h5" --dump "$TMP/plain.h5" -o "$o/r.h5"
cp "$TMP/c_kivi-2.h5" "$TMP/bad.h5"
"$PY" "$TOOL" shorten "$TMP/bad.h5" layers/1/heads/0/value/codes
expect_error "corrupt packed codes" 2 "/layers/1/heads/0/value/codes" \
  "$AKV" evaluate -q --dump "$d" --cache "$TMP/bad.h5" -o "$o/e.json"
# Declared counts are checked before anything is allocated for them.
cp "$TMP/c_kivi-2.h5" "$TMP/bad.h5"
"$PY" "$TOOL" set_int "$TMP/bad.h5" layers/0/heads/1 n_kept 9223372036854775807
expect_error "n_kept past n_tokens" 2 "n_kept exceeds n_tokens .*/layers/0/heads/1.n_kept = 9223372036854775807" \
  "$AKV" evaluate -q --dump "$d" --cache "$TMP/bad.h5" -o "$o/e.json"
cp "$TMP/c_kivi-2.h5" "$TMP/bad.h5"
"$PY" "$TOOL" set_int "$TMP/bad.h5" layers/0/heads/1/value n_quant 9223372036854775807
expect_error "n_quant past n_kept" 2 "n_quant \+ n_residual must equal n_kept" \
  "$AKV" evaluate -q --dump "$d" --cache "$TMP/bad.h5" -o "$o/e.json"
expect_error "evaluate a dump as cache" 2 "not an akv cache" "$AKV" evaluate -q --dump "$d" --cache "$d"
expect_empty_dir "no output after errors" "$o"
expect "compress tiered (simulated over the dump)" 0 "tiered balanced hot 128 warm K3/V3 64 cold int2" \
  "$AKV" compress -q "$d" -o "$TMP/t.h5" -m balanced --warm 64
expect "info on a tiered cache: format v2" 0 "akv-cache v2" "$AKV" info "$TMP/t.h5"
expect_cache_bytes "$TMP/t.h5"
expect "evaluate a tiered cache" 0 "all +all" "$AKV" evaluate -q --dump "$d" --cache "$TMP/t.h5"
expect "decompress a tiered cache" 0 "wrote" "$AKV" decompress -q "$TMP/t.h5" -o "$TMP/t_dense.h5"
finish
