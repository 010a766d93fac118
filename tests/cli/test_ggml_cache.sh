#!/usr/bin/env bash
# llama.cpp's KV cache types as a method (ggml:k=T:v=T) in the decode loop of a small random
# Hugging Face llama (head_dim 32): honest ggml byte counts (bits per element of each block
# type), f16 close to the full cache, the plan's bytes, bench policy, and the refusals; akv
# compress / evaluate --dump with the same types, and vLLM's fp8 types (method fp8) and TurboQuant rows.
source "$(dirname "$0")/lib.sh"
need_python_h5py
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/hf" --dim 64 --hidden 96 --vocab 64 --heads 2 --kv-heads 1 --layers 2 --seed 5 \
  --tokens "$TMP/tokens.txt" 3 96
T="$TMP/tokens.txt"
methods=ggml,ggml:k=q8_0:v=q8_0,ggml:k=q4_0:v=q4_0,ggml:k=q4_1:v=q4_1,ggml:k=q5_0:v=q5_0,ggml:k=q5_1:v=q8_0,ggml:k=iq4_nl:v=iq4_nl
"$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --methods "$methods" --json -o "$TMP/e.json"
expect "bits per element: f16 16, q8_0 8.5, q4_0 4.5, q4_1 5, q5_0 5.5, q5_1/q8_0 7.25, iq4_nl 4.5" 0 "bits ok" "$PY" - "$TMP/e.json" <<'PY'
import json, sys
m = {x["method"]: x for x in json.load(open(sys.argv[1]))["methods"]}
want = {"ggml": 16, "ggml:k=q8_0:v=q8_0": 8.5, "ggml:k=q4_0:v=q4_0": 4.5, "ggml:k=q4_1:v=q4_1": 5.0,
        "ggml:k=q5_0:v=q5_0": 5.5, "ggml:k=q5_1:v=q8_0": (6.0 + 8.5) / 2, "ggml:k=iq4_nl:v=iq4_nl": 4.5}
for k, bits in want.items():
    assert abs(m[k]["bits_per_element"] - bits) < 1e-9, (k, m[k]["bits_per_element"])
    # 3 sequences of 96 tokens: the cache holds 95 rows at the end, 2 layers x 1 KV head x 32 dims x (K + V).
    assert m[k]["cache_bytes"] == round(3 * 95 * 2 * 32 * 2 * bits / 8), (k, m[k]["cache_bytes"])
assert m["ggml"]["kl"] < 1e-6 and m["ggml:k=q4_0:v=q4_0"]["kl"] > m["ggml:k=q8_0:v=q8_0"]["kl"] > 0
assert m["ggml:k=iq4_nl:v=iq4_nl"]["kl"] > m["ggml:k=q8_0:v=q8_0"]["kl"]
print("bits ok")
PY
"$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --methods none,ggml --json -o "$TMP/f16.json"
expect "ggml k=f16 v=f16 equals akv's none (f16 rows): the same NLL, KL and bytes" 0 "same" "$PY" - "$TMP/f16.json" <<'PY'
import json, sys
m = {x["method"]: x for x in json.load(open(sys.argv[1]))["methods"]}
assert all(m["none"][k] == m["ggml"][k] for k in ("mean_nll", "kl", "top1_agreement", "cache_bytes")), (m["none"], m["ggml"])
print("same")
PY
"$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode batch --json -o "$TMP/b.json" \
  --methods ggml:k=q4_0:v=q4_0,ggml:k=q4_0:v=q4_0:rotate=hadamard
expect "--prefill-mode batch (llama.cpp's protocol): reported, rotation changes the result, bytes unchanged" 0 "batch ok" \
  "$PY" - "$TMP/b.json" "$TMP/e.json" <<'PY'
import json, sys
b, e = (json.load(open(f)) for f in sys.argv[1:3])
assert b["prefill_mode"] == "batch" and "prefill_mode" not in e
m = {x["method"]: x for x in b["methods"]}
exact = {x["method"]: x for x in e["methods"]}
q, r = m["ggml:k=q4_0:v=q4_0"], m["ggml:k=q4_0:v=q4_0:rotate=hadamard"]
assert q["cache_bytes"] == r["cache_bytes"] == exact["ggml:k=q4_0:v=q4_0"]["cache_bytes"]
assert q["mean_nll"] != r["mean_nll"] and q["mean_nll"] != exact["ggml:k=q4_0:v=q4_0"]["mean_nll"]
assert abs(m["full"]["mean_nll"] / exact["full"]["mean_nll"] - 1) < 1e-5
print("batch ok")
PY
expect_error "--prefill-mode batch refuses eviction" 1 "prefill-mode batch" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode batch --methods snapkv:budget=0.5
"$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode chunked:16 --json -o "$TMP/c.json" \
  --methods ggml:k=q4_0:v=q4_0,snapkv:budget=0.5:window=4
expect "--prefill-mode chunked:16: reported; the full cache as exact; ggml keeps every row; snapkv evicts" 0 \
  "chunked ok" "$PY" - "$TMP/c.json" "$TMP/e.json" <<'PY'
import json, sys
c, e = (json.load(open(f)) for f in sys.argv[1:3])
assert c["prefill_mode"] == "chunked:16"
m = {x["method"]: x for x in c["methods"]}
exact = {x["method"]: x for x in e["methods"]}
assert abs(m["full"]["mean_nll"] / exact["full"]["mean_nll"] - 1) < 1e-5
q = m["ggml:k=q4_0:v=q4_0"]
assert q["cache_bytes"] == exact["ggml:k=q4_0:v=q4_0"]["cache_bytes"] and q["mean_nll"] != exact["ggml:k=q4_0:v=q4_0"]["mean_nll"]
assert m["snapkv:budget=0.5:window=4"]["cache_bytes"] < 0.5 * m["full"]["cache_bytes"]
print("chunked ok")
PY
"$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode chunked:16:replan --json -o "$TMP/r.json" \
  --methods snapkv:budget=0.5:window=4
expect "--prefill-mode chunked:16:replan: named in the report; snapkv cut to half of the tokens so far" 0 \
  "replan ok" "$PY" - "$TMP/r.json" "$TMP/c.json" <<'PY'
import json, sys
r, c = (json.load(open(f)) for f in sys.argv[1:3])
assert r["prefill_mode"] == "chunked:16:replan"
m = {x["method"]: x for x in r["methods"]}
assert m["snapkv:budget=0.5:window=4"]["cache_bytes"] < 0.5 * m["full"]["cache_bytes"]
assert abs(m["full"]["mean_nll"] / {x["method"]: x for x in c["methods"]}["full"]["mean_nll"] - 1) < 1e-5
print("replan ok")
PY
expect_error "--prefill-mode chunked:16:replan refuses a score the cut cannot take" 1 "scores with snapkv" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode chunked:16:replan --methods tova:budget=0.5
expect_error "--prefill-mode chunked:0 is refused" 2 "prefill-mode = chunked:0" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode chunked:0 --methods kivi-4
expect_error "--prefill-mode chunked refuses streaming eviction" 1 "cannot run this method" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode chunked:16 --methods h2o:budget=0.5
expect "plan counts ggml blocks (2 layers x (18 + 18) bytes per token)" 0 "ggml:k=q4_0:v=q4_0 +72 " \
  "$AKV" plan --config "$TMP/hf/config.json" --methods none,ggml:k=q4_0:v=q4_0 --context 128 --memory 1GiB
expect "bench policy runs a ggml cache" 0 "ggml:k=q4_0:v=q4_0" \
  "$AKV" bench policy --contexts 128 --heads 4 --kv-heads 2 --head-dim 64 --methods full,ggml:k=q4_0:v=q4_0 --warmup 1 --repeat 2
mkdir -p "$TMP/none"
# akv compress stores the blocks (cache v3); checked against ggml's Q8_0 reference written in
# numpy here (d = max|x| / 127 to f16, q = round(x / d) half away from zero) and f16 rows.
"$AKV" -q synth -o "$TMP/d.h5" --layers 2 --heads 2 --kv-heads 1 --head-dim 64 --tokens 64 --dtype f32 >/dev/null
expect "compress --method ggml --k q8_0 --v f16" 0 "8.500 bits/element|12.250 bits/element" \
  "$AKV" compress -q "$TMP/d.h5" -o "$TMP/c.h5" -m ggml --k q8_0 --v f16
expect "the blocks are ggml's Q8_0 of each key row and the f16 value rows" 0 "blocks ok" "$PY" - "$TMP/d.h5" "$TMP/c.h5" <<'PY'
import sys
import h5py, numpy as np
d, c = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
assert c.attrs["version"] == 3
for l in range(2):
    key = d[f"/layers/{l}/key"][0].astype(np.float32)      # [tokens, head_dim] of KV head 0
    value = d[f"/layers/{l}/value"][0].astype(np.float32)
    g = c[f"/layers/{l}/heads/0"]
    assert g["key"].attrs["ggml_type"] == "q8_0" and g["value"].attrs["ggml_type"] == "f16"
    kb = g["key/blocks"][()].reshape(64, 2, 34)
    x = key.reshape(64, 2, 32)
    amax = np.abs(x).max(axis=2)
    dd = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(dd > 0, np.float32(1) / np.where(dd > 0, dd, 1), 0).astype(np.float32)
    v = (x * inv[..., None]).astype(np.float32).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    want = np.concatenate([dd.astype(np.float16)[..., None].view(np.uint8), q.view(np.uint8)], axis=2)
    assert np.array_equal(kb, want), np.argwhere(kb != want)[:5]
    assert np.array_equal(g["value/blocks"][()], value.astype(np.float16).reshape(-1).view(np.uint8))
print("blocks ok")
PY
"$AKV" compress -q "$TMP/d.h5" -o "$TMP/c4.h5" -m ggml --k q4_0 --v q4_0 >/dev/null
"$AKV" evaluate -q --dump "$TMP/d.h5" --cache "$TMP/c.h5" --json -o "$TMP/f8.json"
"$AKV" evaluate -q --dump "$TMP/d.h5" --cache "$TMP/c4.h5" --json -o "$TMP/f4.json"
expect "evaluate --dump --cache reads ggml caches: q8_0 keys closer than q4_0" 0 "fidelity ok" "$PY" - "$TMP/f8.json" "$TMP/f4.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["overall"] for p in sys.argv[1:3])
assert 0 < a["key_rel_mse"] < b["key_rel_mse"] and a["value_rel_mse"] < b["value_rel_mse"], (a, b)
print("fidelity ok")
PY
# vLLM's fp8 cache (method fp8, cache v5): each key is fp8_e4m3(x / s), s = max |x| / 448 over
# the head's rows, checked against an fp8 encoder written here (the nearest of the format's
# values from the OCP formulas, ties to even, saturating).
expect "compress --method fp8 --v e5m2" 0 "8.008 bits/element" \
  "$AKV" compress -q "$TMP/d.h5" -o "$TMP/c8.h5" -m fp8 --v e5m2
expect "fp8 codes and scales equal an independent encoder's" 0 "fp8 ok" "$PY" - "$TMP/d.h5" "$TMP/c8.h5" <<'PY'
import sys
import h5py
import numpy as np
def values(e, m, bias, ieee):
    out = []
    for c in range(128):
        ex, man = c >> m, c & ((1 << m) - 1)
        if (ieee and ex == (1 << e) - 1) or (not ieee and ex == (1 << e) - 1 and man == (1 << m) - 1):
            out.append(np.nan)
        elif ex == 0:
            out.append(man * 2.0 ** (1 - bias - m))
        else:
            out.append((1 + man / 2 ** m) * 2.0 ** (ex - bias))
    return np.array(out)
def encode(x, vals):
    a = np.minimum(np.abs(x.astype(np.float64)), np.nanmax(vals))
    d = np.abs(a[:, None] - np.where(np.isnan(vals), np.inf, vals)[None, :])
    i = d.argmin(axis=1)
    tie = (i + 1 < len(vals)) & (d[np.arange(len(i)), np.minimum(i + 1, len(vals) - 1)] == d[np.arange(len(i)), i])
    i = np.where(tie & (i % 2 == 1), i + 1, i)
    return (i | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)
e4m3, e5m2 = values(4, 3, 7, False), values(5, 2, 15, True)
d, c = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
assert c.attrs["version"] == 5
for l in range(2):
    for part, vals, mx in (("key", e4m3, 448.0), ("value", e5m2, 57344.0)):
        x = d[f"/layers/{l}/{part}"][0].astype(np.float32).reshape(-1)
        g = c[f"layers/{l}/heads/0/{part}"]
        s = np.float32(np.abs(x).max()) / np.float32(mx)
        assert np.float32(g.attrs["fp8_scale"]) == s, (g.attrs["fp8_scale"], s)
        want = encode((x / s).astype(np.float32), vals)
        got = np.asarray(g["blocks"])
        assert (got == want).all(), (l, part, np.nonzero(got != want)[0][:5])
print("fp8 ok")
PY
"$AKV" evaluate -q --dump "$TMP/d.h5" --cache "$TMP/c8.h5" --json -o "$TMP/ff.json"
expect "evaluate --dump reads fp8 caches: e4m3 keys closer than q4_0's" 0 "fp8 fidelity ok" "$PY" - "$TMP/ff.json" "$TMP/f4.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["overall"] for p in sys.argv[1:3])
assert 0 < a["key_rel_mse"] < b["key_rel_mse"], (a, b)
print("fp8 fidelity ok")
PY
expect "fp8 in the decode loop: head, tensor and one scales, e5m2 values" 0 "fp8_e5m2 scale tensor" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --methods fp8,fp8:v=e5m2:scale=tensor,fp8:scale=one
expect_error "--prefill-mode batch refuses fp8 scales from the prompt" 1 "use scale=one" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill-mode batch --methods fp8 -o "$TMP/none/x.txt"
expect_error "fp8 takes only fp8 types" 1 "fp8 takes k= and v= e4m3 or e5m2" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --methods fp8:k=q4_0 -o "$TMP/none/x.txt"
"$AKV" -q synth -o "$TMP/d48.h5" --layers 1 --heads 2 --kv-heads 1 --head-dim 48 --tokens 16 --window 8 >/dev/null
# vLLM's TurboQuant rows: keys head_dim x 3 bits + f16 norm (dump: 64 -> 26 bytes, model: 32 -> 14),
# values head_dim x 4 bits + f16 scale and minimum (36, 20) per row; values unrotated, read back
# from the layout.
"$AKV" compress -q "$TMP/d.h5" -o "$TMP/tq.h5" -m turboquant_k3v4_nc --boundary 0 >/dev/null
expect "turboquant rows: vLLM's slot layout, values within half a step (+ f16 rounding)" 0 "tq ok" "$PY" - "$TMP/d.h5" "$TMP/tq.h5" <<'PY'
import sys, h5py, numpy as np
d, c = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
for l in range(2):
    k, v = c[f"layers/{l}/heads/0/key"], c[f"layers/{l}/heads/0/value"]
    assert k.attrs["ggml_type"] == "tq3nc" and v.attrs["ggml_type"] == "tqv4", (k.attrs["ggml_type"], v.attrs["ggml_type"])
    x = d[f"/layers/{l}/value"][0].astype(np.float32)
    rows = np.asarray(v["blocks"]).reshape(x.shape[0], 36)
    assert np.asarray(k["blocks"]).size == x.shape[0] * 26
    q = np.stack([rows[:, :32] & 15, rows[:, :32] >> 4], axis=2).reshape(-1, 64).astype(np.float32)
    scale = rows[:, 32:34].copy().view(np.float16).astype(np.float32)
    mn = rows[:, 34:36].copy().view(np.float16).astype(np.float32)
    back = q * scale + mn
    # half a step, the f16 rounding of the step (2^-11 relative) times 15, of the minimum
    assert (np.abs(back - x) <= scale / 2 + 15 * scale / 2048 + np.abs(x.min(axis=1, keepdims=True) - mn) + 1e-6).all()
print("tq ok")
PY
"$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --json -o "$TMP/tq.json" \
  --methods turboquant_k3v4_nc:boundary=0,turboquant_4bit_nc:boundary=0,turboquant_k8v4:boundary=0,turboquant_k3v4_nc,ggml:k=tq3:v=tqv4:rotate=hadamard
expect "turboquant in the decode loop: vLLM's bytes; 4-bit keys closer than 3-bit; boundary layers f16" 0 "tq model ok" "$PY" - "$TMP/tq.json" <<'PY'
import json, sys
m = {x["method"]: x for x in json.load(open(sys.argv[1]))["methods"]}
for k, row in {"turboquant_k3v4_nc": 14 + 20, "turboquant_4bit_nc": 18 + 20, "turboquant_k8v4": 32 + 20}.items():
    scales = 4 * 2 if k == "turboquant_k8v4" else 0  # fp8 keys: one f32 scale per layer's head
    got = m[k + ":boundary=0"]["cache_bytes"]
    assert got == 3 * (95 * 2 * row + scales), (k, got)
assert 0 < m["turboquant_4bit_nc:boundary=0"]["kl"] < m["turboquant_k3v4_nc:boundary=0"]["kl"], m
# vLLM's default boundary protection (first and last 2 layers, at most half each side): both layers f16.
assert m["turboquant_k3v4_nc"]["bits_per_element"] == 16, m["turboquant_k3v4_nc"]
print("tq model ok")
PY
# Joint tokens x bits with cache types in the decode loop: heads may store q8_0 / fp8 / rotated
# q4_0 tensors beside kivi codes; on this model they lose far less than kivi 2/4 at the same budget.
jk=joint:budget=0.3:window=4:quant=kivi:residual=32:group=32:bits=2
"$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --prefill 48 --json -o "$TMP/jt.json" \
  --methods "$jk,$jk:cache-types=q8_0/fp8_e4m3/q4_0+hadamard"
expect "evaluate --model: joint with cache types runs, closer to the full cache than kivi codes alone" 0 "joint types ok" \
  "$PY" - "$TMP/jt.json" "$jk" <<'PY'
import json, sys
m = {x["method"]: x for x in json.load(open(sys.argv[1]))["methods"]}
k, t = m[sys.argv[2]], m[sys.argv[2] + ":cache-types=q8_0/fp8_e4m3/q4_0+hadamard"]
assert 0 < t["kl"] < k["kl"] / 2, (t, k)
assert "or q8_0/fp8_e4m3/q4_0+hadamard" in t["description"], t["description"]
print("joint types ok")
PY
expect_error "turboquant: head_dim 48 is no power of two" 2 "power of two" \
  "$AKV" compress -q "$TMP/d48.h5" -o "$TMP/none/c.h5" -m turboquant
"$AKV" compress -q "$TMP/d.h5" -o "$TMP/s1.h5" -m ggml --k q4_0 --v q4_0 --shard 1/2 >/dev/null
"$AKV" compress -q "$TMP/d.h5" -o "$TMP/s2.h5" -m ggml --k q4_0 --v q4_0 --shard 2/2 >/dev/null
"$AKV" -q merge "$TMP/s1.h5" "$TMP/s2.h5" -o "$TMP/m.h5" >/dev/null
expect "two shards merge into the unsharded ggml cache byte for byte" 0 "" cmp "$TMP/m.h5" "$TMP/c4.h5"
expect_error "compress: head_dim 48 holds no whole block" 2 "d48.h5: head_dim \\(ggml k=q4_0\\) = 48" \
  "$AKV" compress -q "$TMP/d48.h5" -o "$TMP/none/c.h5" -m ggml --k q4_0
expect_error "compress: --k with another method" 1 "need method ggml" \
  "$AKV" compress -q "$TMP/d.h5" -o "$TMP/none/c.h5" --k q4_0
expect_error "an unknown cache type" 2 "k = q2_k" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --methods ggml:k=q2_k -o "$TMP/none/x.txt"
expect_error "k= with another method" 1 "need method ggml" \
  "$AKV" evaluate -q --model "$TMP/hf" --tokens "$T" --methods kivi:k=q4_0 -o "$TMP/none/x.txt"
if [[ -f "${AKV_SHARED_DIR:-$SRC/../shared}/models/stories260K.bin" ]]; then
  expect_error "head_dim 8 holds no block of 32" 2 "ggml k=q4_0: head_dim = 8" \
    "$AKV" evaluate -q --model "${AKV_SHARED_DIR:-$SRC/../shared}/models/stories260K.bin" --tokens "$T" --methods ggml:k=q4_0 -o "$TMP/none/x.txt"
fi
expect_empty_dir "no output after errors" "$TMP/none"
finish
