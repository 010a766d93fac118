#!/usr/bin/env bash
# The int8 decode-attention path (--attention int8): evaluate --model through it on a small
# random Hugging Face llama (head_dim 32, GQA 4), the report naming it, metrics close to the
# exact path's; bench attention rows for the variants it reads, with their error columns; refusals.
source "$(dirname "$0")/lib.sh"
need_python_h5py
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/hf" --dim 128 --hidden 96 --vocab 64 --heads 4 --kv-heads 1 --layers 2 --seed 5 \
  --tokens "$TMP/tokens.txt" 3 200
methods=kivi-4:residual=32,kivi-2:residual=32,k4v3:residual=32
for a in exact int8; do
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$TMP/tokens.txt" --methods "$methods" --attention "$a" --json -o "$TMP/$a.json"
done
expect "evaluate --attention int8: named, full unchanged, methods within 25% of exact" 0 "int8 ok" "$PY" - "$TMP/exact.json" "$TMP/int8.json" <<'PY'
import json, sys
e, i = (json.load(open(p)) for p in sys.argv[1:3])
assert e["attention"] == "exact" and i["attention"] == "int8", (e["attention"], i["attention"])
me, mi = ({m["method"]: m for m in d["methods"]} for d in (e, i))
assert me["full"]["ppl"] == mi["full"]["ppl"]
for k in ("kivi-4:residual=32", "kivi-2:residual=32", "k4v3:residual=32"):
    assert mi[k]["kl"] != me[k]["kl"], k                      # the integer loops ran
    assert abs(mi[k]["kl"] - me[k]["kl"]) <= 0.25 * me[k]["kl"], (k, me[k]["kl"], mi[k]["kl"])
    assert mi[k]["cache_bytes"] == me[k]["cache_bytes"]
print("int8 ok")
PY
expect "evaluate table names the int8 path" 0 "decode attention: int8" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$TMP/tokens.txt" --methods kivi-4 --attention int8 --sequences 1
expect_error "unknown attention path" 2 "--attention.*int4" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$TMP/tokens.txt" --methods kivi-4 --attention int4

"$AKV" bench attention --contexts 700 --head-dims 64 --gqa 4 --kv-heads 2 --variants f32,f16,q4,q3,k4v2 --attention exact,int8 \
  --repeat 1 --min-sample 0 --stream-mb 16 --json -o "$TMP/b.json" 2>/dev/null
expect "bench attention --attention exact,int8: int8 rows for 2/4-bit variants, errors beside" 0 "rows ok" "$PY" - "$TMP/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [(r["variant"], r["attention"]) for r in d["rows"]]
assert rows == [("f32", "exact"), ("f16", "exact"), ("q4", "exact"), ("q4", "int8"), ("q3", "exact"),
                ("k4v2", "exact"), ("k4v2", "int8")], rows
by = {(r["variant"], r["attention"]): r for r in d["rows"]}
assert by[("f32", "exact")]["err_vs_f32"] == 0
assert 0 < by[("f16", "exact")]["err_vs_f32"] < 1e-3
for v in ("q4", "k4v2"):
    assert 0 < by[(v, "int8")]["err_vs_exact"] < 0.05, by[(v, "int8")]
    assert by[(v, "exact")]["err_vs_exact"] == 0
    assert by[(v, "int8")]["err_vs_f32"] <= 1.1 * by[(v, "exact")]["err_vs_f32"]
assert d["params"]["attention"] == ["exact", "int8"]
print("rows ok")
PY
expect_error "bench attention: unknown attention path" 2 "unknown attention path.*--attention.*fast" \
  "$AKV" bench attention --contexts 300 --variants q4 --attention fast
finish
