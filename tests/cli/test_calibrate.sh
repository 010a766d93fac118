#!/usr/bin/env bash
# calibrate -> compress --calibration -> evaluate; proxies; bad input.
source "$(dirname "$0")/lib.sh"
need_python_h5py
d="$TMP/d.h5"
"$AKV" synth -q -o "$d" --layers 2 --heads 8 --kv-heads 4 --head-dim 64 --tokens 600 --window 16 --pre-rope >/dev/null \
  || { echo "synth failed"; exit 1; }
"$AKV" synth -q -o "$TMP/d2.h5" --layers 2 --heads 8 --kv-heads 4 --head-dim 64 --tokens 600 --window 16 --seed 3 \
  --pre-rope >/dev/null

expect "calibrate measured" 0 "measured allocation, target 3 bits -> achieved 3.000" \
  "$AKV" calibrate -q "$d" "$TMP/d2.h5" --target-bits 3 -o "$TMP/calib.json"
expect "calib.json format" 0 '"format": "akv-calibration"' cat "$TMP/calib.json"
expect "calibrate --aggregate max" 0 "achieved" "$AKV" calibrate -q "$d" "$TMP/d2.h5" --aggregate max --bits 2,4,8 --target-bits 4
expect "calibrate adakv-proxy" 0 "adakv-proxy allocation" "$AKV" calibrate -q "$d" --allocator adakv-proxy --target-bits 3 --update-interval 200
expect "calibrate entropy --json" 0 '"allocator": "entropy"' "$AKV" calibrate -q "$d" --allocator entropy --target-bits 2.5 --json
expect "calibrate --rotate records it" 0 '"rotate": "hadamard"' "$AKV" calibrate -q "$d" --rotate hadamard --json
expect "compress --calibration" 0 "calibrated per-head bits" "$AKV" compress -q "$d" -o "$TMP/c.h5" --calibration "$TMP/calib.json"
cp "$TMP/calib.json" "$TMP/calib-"$'\xe9'".json"  # a Latin-1 name: stored in the cache's params with U+FFFD
expect "compress --calibration from a file named in Latin-1" 0 "calibrated per-head bits" \
  "$AKV" compress -q "$d" -o "$TMP/c-latin1.h5" --calibration "$TMP/calib-"$'\xe9'".json"
expect "evaluate a calibrated cache" 0 "calibrated" "$AKV" evaluate -q --dump "$d" --cache "$TMP/c.h5"
expect_cache_bytes "$TMP/c.h5"

expect "allocate --method joint" 0 "joint allocation: budget" \
  "$AKV" allocate -q "$d" --method joint --budget 0.15 --window 16 -o "$TMP/joint.json"
if cmp -s "$TMP/joint.json" <("$AKV" allocate -q "$d" --method joint --bytes 0.15 --window 16 -o -); then
  pass "allocate joint: --bytes F is --budget F"
else
  fail "allocate joint: --bytes F differs from --budget F"
fi
expect "compress with joint budgets: its per-head bits are joint's" 0 "kept.*\+ kivi joint per-head bits" \
  "$AKV" compress -q "$d" -o "$TMP/j.h5" -m snapkv --budgets "$TMP/joint.json" --quant kivi
expect "compress -m joint in one step" 0 "joint/snapkv 0.15 \+ kivi joint per-head bits" \
  "$AKV" compress -q "$d" -o "$TMP/j1.h5" -m joint --budget 0.15 --window 16 --quant kivi
if cmp -s <("$PY" "$(dirname "$0")/cache_tool.py" bytes "$TMP/j1.h5") <("$PY" "$(dirname "$0")/cache_tool.py" bytes "$TMP/j.h5"); then
  pass "one-step joint stores what allocate + compress --budgets stores"
else
  fail "one-step joint differs from allocate + compress --budgets"
fi
expect "allocate joint with a choice of rotation: a rotate column" 0 "K +V +rotate +bytes" \
  "$AKV" allocate -q "$d" --method joint --bytes 0.15 --window 16 --rotate hadamard --rotate-choice on -o "$TMP/jointr.json"
expect "compress with rotated joint budgets: a version-4 cache" 0 "akv-cache v4" bash -c \
  "'$AKV' compress -q '$d' -o '$TMP/jr.h5' -m snapkv --budgets '$TMP/jointr.json' --quant kivi >/dev/null && '$AKV' info '$TMP/jr.h5'"
expect_error "allocate --rotate-choice without joint" 1 "--rotate-choice is for --method joint" \
  "$AKV" allocate -q "$d" --budget 0.2 --rotate-choice on
expect "allocate joint with cache types: each tensor's bits or type" 0 "(q8_0|q4_0\+hadamard)" \
  "$AKV" allocate -q "$d" --method joint --bytes 0.25 --window 16 --bits 2,4 --cache-types q8_0/q4_0+hadamard -o "$TMP/jointt.json"
expect "compress with typed joint budgets: the predicted bytes, a version-4 cache" 0 "ok v4" bash -c \
  "'$AKV' compress -q '$d' -o '$TMP/jt.h5' -m snapkv --budgets '$TMP/jointt.json' --quant kivi --json >'$TMP/jt.json' &&
   '$PY' -c 'import json,sys; j=json.load(open(sys.argv[1])); c=json.load(open(sys.argv[2])); assert c[\"bytes\"][\"total\"]==j[\"joint\"][\"predicted_bytes\"], (c[\"bytes\"], j[\"joint\"]); print(\"ok\", end=\" \")' '$TMP/jointt.json' '$TMP/jt.json' && '$AKV' info '$TMP/jt.h5' | grep -o 'v4'"
expect "evaluate the typed joint cache" 0 "all +all" "$AKV" evaluate -q --dump "$d" --cache "$TMP/jt.h5"
expect_error "allocate --cache-types without joint" 1 "--cache-types is for --method joint" \
  "$AKV" allocate -q "$d" --budget 0.2 --cache-types q8_0
expect_error "an unknown cache type" 2 "--cache-types = q9_0" \
  "$AKV" allocate -q "$d" --method joint --bytes 0.25 --window 16 --cache-types q8_0/q9_0
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); h=j["layers"][0]["heads"][0]; h["key_bits"]=0; h.pop("key_type",None); json.dump(j,open(sys.argv[2],"w"))' \
  "$TMP/jointt.json" "$TMP/badt.json"
expect_error "budgets with bits 0 and no type" 2 "key_type" \
  "$AKV" compress -q "$d" -o "$TMP/badt.h5" -m snapkv --budgets "$TMP/badt.json" --quant kivi
expect_error "joint without quantization" 1 "--quant" "$AKV" compress -q "$d" -o "$TMP/out_j.h5" -m joint --budget 0.15 --window 16
expect "evaluate the joint cache" 0 "all +all" "$AKV" evaluate -q --dump "$d" --cache "$TMP/j.h5"
expect_cache_bytes "$TMP/j.h5"

o="$TMP/out_dir"
mkdir -p "$o"
# fp8 scales from the calibration: each head's max |x| over both dumps (keys and values as
# stored), checked in numpy; compress -m fp8 --calibration stores amax / 448 (here per layer).
expect "calib.json: each head's key and value maxima over the dumps" 0 "amax ok" "$PY" - "$TMP/calib.json" "$d" "$TMP/d2.h5" <<'PY'
import json, sys
import h5py
import numpy as np
c, ds = json.load(open(sys.argv[1])), [h5py.File(p) for p in sys.argv[2:]]
for l in range(2):
    for h in range(4):
        e = c["layers"][l]["heads"][h]
        for part in ("key", "value"):
            want = max(float(np.abs(d[f"/layers/{l}/{part}"][h].astype(np.float32)).max()) for d in ds)
            assert e[part + "_amax"] == want, (l, h, part)
print("amax ok")
PY
expect "compress -m fp8 --calibration" 0 "scale tensor" \
  "$AKV" compress -q "$d" -o "$TMP/f8.h5" -m fp8 --scale tensor --calibration "$TMP/calib.json"
expect "fp8 scales from the calibration: the layer's maximum / 448" 0 "scales ok" "$PY" - "$TMP/f8.h5" "$TMP/calib.json" <<'PY'
import json, sys
import h5py
import numpy as np
f, c = h5py.File(sys.argv[1]), json.load(open(sys.argv[2]))
for l in range(2):
    want = np.float32(max(h["key_amax"] for h in c["layers"][l]["heads"])) / np.float32(448)
    for h in range(4):
        assert np.float32(f[f"layers/{l}/heads/{h}/key"].attrs["fp8_scale"]) == want, (l, h)
print("scales ok")
PY
# DuoAttention head scores: each head's attention-output error when it keeps only its first 128
# and last 256 tokens, mean over the dumps, by brute force in numpy (f64 softmax). Tolerance: 1e-6
# relative plus 1e-7 absolute - akv's attention outputs are f32, whose rounding moves the error
# by ~1e-8 of the output norm whatever its size (a head that keeps nearly all its attention mass,
# error 0.0086, differed by 1.1e-6 relative on an AMD EPYC host, 2026-12-06).
expect "calib.json: each head's duo_error (numpy brute force)" 0 "duo ok" "$PY" - "$TMP/calib.json" "$d" "$TMP/d2.h5" <<'PY'
import json, sys
import h5py
import numpy as np
c, ds = json.load(open(sys.argv[1])), [h5py.File(p) for p in sys.argv[2:]]
assert c["summary"]["duo"] == {"sinks": 128, "window": 256}, c["summary"].get("duo")
for l in range(2):
    for h in range(4):
        errs = []
        for d in ds:
            k, v = (d[f"layers/{l}/{x}"][h].astype(np.float64) for x in ("key", "value"))
            q = d[f"layers/{l}/query"][2 * h:2 * h + 2].astype(np.float64)
            T, nq = k.shape[0], q.shape[1]
            keep = np.r_[0:128, T - 256:T]
            e = n = 0.0
            for qh in range(2):
                for i in range(nq):
                    p = T - nq + i
                    outs = []
                    for rows in (np.arange(p + 1), keep[keep <= p]):
                        s = k[rows] @ q[qh, i] / 8.0
                        a = np.exp(s - s.max())
                        outs.append((a / a.sum()) @ v[rows])
                    e += ((outs[0] - outs[1]) ** 2).sum()
                    n += (outs[0] ** 2).sum()
            errs.append(np.sqrt(e / n))
        got, want = c["layers"][l]["heads"][h]["duo_error"], np.mean(errs)
        assert abs(got - want) <= 1e-6 * want + 1e-7, (l, h, got, want)
print("duo ok")
PY
expect "compress -m duo --heads: the calibrated split" 0 "duo/knorm 0.8 \\+ none" \
  "$AKV" compress -q "$d" -o "$TMP/duo.h5" -m duo --heads "$TMP/calib.json" --budget 0.8
expect "allocate --method duo --heads" 0 "duo allocation" \
  "$AKV" allocate -q "$d" --method duo --heads "$TMP/calib.json" --budget 0.8 -o "$TMP/duo.json"
# 8 heads, 600 tokens, 384 forced: round(8 x (480 - 384) / 216) = 4 heads keep all, the 4 largest errors.
expect "duo --heads: the heads of the 4 largest errors keep every token" 0 "split ok" "$PY" - "$TMP/calib.json" "$TMP/duo.json" <<'PY'
import json, sys
c, a = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
err = {(l, h): c["layers"][l]["heads"][h]["duo_error"] for l in range(2) for h in range(4)}
full = {(l, h) for l in range(2) for h in range(4) if a["layers"][l]["heads"][h]["tokens"] == 600}
assert full == set(sorted(err, key=err.get, reverse=True)[:4]), (full, err)
assert all(a["layers"][l]["heads"][h]["tokens"] in (384, 600) for l in range(2) for h in range(4))
print("split ok")
PY
expect_error "heads= on another allocator" 1 "duo's head scores" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m adakv --heads "$TMP/calib.json" --budget 0.5 --window 16
cp "$TMP/calib.json" "$o/calib_copy.json"
expect_error "compress -o the duo calibration file: refused, the file kept" 1 "the output is an input file" \
  "$AKV" compress -q "$d" -o "$o/calib_copy.json" -m duo --heads "$o/calib_copy.json" --budget 0.8
expect_error "allocate -o the duo calibration file: refused" 1 "the output is an input file" \
  "$AKV" allocate -q "$d" --method duo --heads "$o/calib_copy.json" --budget 0.8 -o "$o/calib_copy.json"
expect_error "compress -o kvzap's surrogate file: refused" 1 "the output is an input file" \
  "$AKV" compress -q "$d" -o "$o/calib_copy.json" -m kvzap --surrogate "$o/calib_copy.json" --budget 0.8
expect_error "allocate -o kvzap's surrogate file: refused" 1 "the output is an input file" \
  "$AKV" allocate -q "$d" --method adakv --score kvzap --surrogate "$o/calib_copy.json" --budget 0.8 -o "$o/calib_copy.json"
cmp -s "$TMP/calib.json" "$o/calib_copy.json" && pass "the calibration file is unchanged" || fail "the calibration file changed"
rm "$o/calib_copy.json"
expect_error "heads= with a score" 1 "would not change the split" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m duo --heads "$TMP/calib.json" --score snapkv --budget 0.8
expect_error "heads= measured with other sinks" 2 "summary.duo.sinks = 128" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m duo --heads "$TMP/calib.json" --sinks 64 --budget 0.8
"$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); c["layers"][1]["heads"][2]["duo_error"]=-1.0; json.dump(c, open(sys.argv[2], "w"))' \
  "$TMP/calib.json" "$TMP/bad_duo.json"
expect_error "a negative duo score" 2 "layers\\[1\\].heads\\[2\\].duo_error = -1" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m duo --heads "$TMP/bad_duo.json" --budget 0.8
"$AKV" synth -q -o "$TMP/short.h5" --layers 2 --heads 8 --kv-heads 4 --head-dim 64 --tokens 300 --window 16 >/dev/null
"$AKV" calibrate -q "$TMP/short.h5" -o "$TMP/calib_short.json" >/dev/null
expect_error "heads= from dumps too short for a streaming head" 2 "summary.duo" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m duo --heads "$TMP/calib_short.json" --budget 0.8
expect_error "fp8 calibration measured without the cache's rotation" 1 "measured with rotate=none" \
  "$AKV" compress -q "$d" -o "$o/f.h5" -m fp8 --rotate hadamard --calibration "$TMP/calib.json"
"$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); [h.pop("key_amax") for l in c["layers"] for h in l["heads"]]; json.dump(c, open(sys.argv[2], "w"))' \
  "$TMP/calib.json" "$TMP/old_calib.json"
expect_error "fp8 calibration from a file without maxima" 2 "layers\[0\].heads\[0\].key_amax" \
  "$AKV" compress -q "$d" -o "$o/f.h5" -m fp8 --calibration "$TMP/old_calib.json"
expect_error "target outside the candidates" 2 "--target-bits = 5" "$AKV" calibrate -q "$d" --target-bits 5 -o "$o/c.json"
expect_error "unsupported candidate" 2 "--bits = 5" "$AKV" calibrate -q "$d" --bits 2,5 -o "$o/c.json"
expect_error "lo > hi" 2 "--lo-bit/--mid-bit/--hi-bit = 4/3/2" "$AKV" calibrate -q "$d" --allocator adakv-proxy --lo-bit 4 --hi-bit 2 --target-bits 3 -o "$o/c.json"
"$AKV" synth -q -o "$TMP/other.h5" --layers 3 --heads 8 --kv-heads 4 --head-dim 64 --tokens 600 --window 16 >/dev/null
expect_error "calibration of another shape" 2 "shape.n_layers = 2" \
  "$AKV" compress -q "$TMP/other.h5" -o "$o/c.h5" --calibration "$TMP/calib.json"
expect_error "dumps of different shapes" 2 "different model shapes" "$AKV" calibrate -q "$d" "$TMP/other.h5" -o "$o/c.json"
expect_error "calibration with --bits" 1 "--bits" "$AKV" compress -q "$d" -o "$o/c.h5" --calibration "$TMP/calib.json" --bits 4
expect_error "joint budget too small" 2 "cheapest choice of every head needs [0-9]+ bytes" \
  "$AKV" allocate -q "$d" --method joint --bytes 0.001 --window 16 -o "$o/j.json"
expect_error "joint without a byte budget" 1 "joint takes its byte budget as --budget F .* or --bytes F, one of them \(--budget\)$" \
  "$AKV" allocate -q "$d" --method joint -o "$o/j.json"
expect_error "joint with --budget and --bytes" 1 "one of them \(given = --budget and --bytes\)$" \
  "$AKV" allocate -q "$d" --method joint --budget 0.2 --bytes 0.2 -o "$o/j.json"
expect_error "joint with a token budget" 1 "joint takes a byte budget, not a token count \(--budget-tokens = 64\)" \
  "$AKV" allocate -q "$d" --method joint --budget 0.2 --budget-tokens 64 -o "$o/j.json"
expect_error "--bytes with another allocator" 1 "--bytes" "$AKV" allocate -q "$d" --method adakv --budget 0.2 --bytes 0.1 --window 16 -o "$o/j.json"
expect_error "joint budgets need --quant kivi" 1 "--quant" \
  "$AKV" compress -q "$d" -o "$o/c.h5" -m snapkv --budgets "$TMP/joint.json"
# KVQuant nuq codebooks: thresholds per channel of the pre-RoPE keys of both dumps (numpy's
# percentiles, as KVQuant takes them), 2^bits ascending levels that fit the normalized values
# better than the uniform grid, then method nuq through them.
nuq_check=$("$PY" - "$TMP/calib.json" "$d" "$TMP/d2.h5" <<'PY'
import json, sys
import h5py, numpy as np
c = json.load(open(sys.argv[1]))
q = c["nuq"]
ok = q["bits"] == [2, 3, 4] and q["sink"] == 1 and q["sparsity"] == 0.99
for l, e in enumerate(q["layers"]):
    rows = []
    for path in sys.argv[2:]:
        x = np.asarray(h5py.File(path)["layers/%d/key_pre_rope" % l], dtype=np.float64)  # [H, n, d]
        rows.append(x.transpose(1, 0, 2).reshape(x.shape[1], -1))
    rows = np.concatenate(rows)
    t = 1 - (1 - 0.99) / 2
    ok &= np.array_equal(np.percentile(rows, t * 100, axis=0), np.array(e["key_upper"]))
    ok &= np.array_equal(np.percentile(rows, (1 - t) * 100, axis=0), np.array(e["key_lower"]))
    up, lo = np.array(e["key_upper"]), np.array(e["key_lower"])
    y = ((rows - (up + lo) / 2) / ((up - lo) / 2))[2:]  # the two dumps' first tokens are sinks
    y = y[np.abs(y) <= 1].astype(np.float32).astype(np.float64)
    for b in ("2", "3", "4"):
        lv = np.array(e["key_levels"][b])
        grid = np.linspace(-1, 1, 2 ** int(b))
        cost = lambda g: np.min((y[:, None] - g[None, :]) ** 2, axis=1).sum()
        ok &= len(lv) == 2 ** int(b) and bool(np.all(np.diff(lv) >= 0)) and cost(lv) < cost(grid)
        ok &= len(e["value_levels"][b]) == 2 ** int(b)
print(bool(ok))
PY
)
expect_equal "calibrate: nuq thresholds are numpy's percentiles of every dump's pre-RoPE keys; levels beat a uniform grid" \
  "$nuq_check" "True"
expect "calibrate's table names the nuq codebooks" 0 "nuq codebooks \(method nuq\): bits 2,3,4, sparsity 0.99, sink 1, weights none" \
  "$AKV" calibrate -q "$d" --bits 2,4
expect "compress -m nuq with the calibration's codebooks" 0 "nuq K3/V4 pre-RoPE" \
  "$AKV" compress "$d" -o "$TMP/nuq.h5" -m nuq --calibration "$TMP/calib.json" --bits-key 3 --bits-value 4
expect "a nuq cache is format version 6" 0 "akv-cache v6" "$AKV" info "$TMP/nuq.h5"
expect "evaluate a nuq cache" 0 "nuq K3/V4" "$AKV" evaluate -q --dump "$d" --cache "$TMP/nuq.h5"
expect "decompress a nuq cache" 0 "wrote" "$AKV" decompress -q "$TMP/nuq.h5" --dump "$d" -o "$TMP/nuq_r.h5"
expect_cache_bytes "$TMP/nuq.h5"
expect "calibrate --no-nuq fits no codebooks" 0 "^no nuq$" \
  bash -c "'$AKV' calibrate -q '$d' --no-nuq --json | '$PY' -c 'import json,sys; print(\"nuq\" in json.load(sys.stdin) or \"no nuq\")'"
"$AKV" synth -q -o "$TMP/nopre.h5" --layers 2 --heads 8 --kv-heads 4 --head-dim 64 --tokens 600 --window 16 >/dev/null
"$AKV" calibrate -q "$TMP/nopre.h5" -o "$TMP/calib_nopre.json" >/dev/null
expect_error "nuq from a calibration of dumps without key_pre_rope" 2 "calib_nopre.json: nuq" \
  "$AKV" compress -q "$d" -o "$o/n.h5" -m nuq --calibration "$TMP/calib_nopre.json"
expect_error "nuq at a bit width not fitted" 2 "nuq.bits = \[2,3\]" \
  bash -c "'$AKV' calibrate -q '$d' --nuq-bits 3,2 -o '$TMP/calib23.json' >/dev/null && '$AKV' compress -q '$d' -o '$o/n.h5' -m nuq --calibration '$TMP/calib23.json' --bits 4"
expect_error "nuq on a dump without key_pre_rope" 2 "key_pre_rope = missing" \
  "$AKV" compress -q "$TMP/nopre.h5" -o "$o/n.h5" -m nuq --calibration "$TMP/calib.json"
expect_error "nuq without a calibration" 1 "calibration" "$AKV" compress -q "$d" -o "$o/n.h5" -m nuq
expect_error "nuq with a residual window" 1 "--residual" \
  "$AKV" compress -q "$d" -o "$o/n.h5" -m nuq --calibration "$TMP/calib.json" --residual 32
expect "snapkv with quant=nuq: the kept rows coded" 0 "snapkv 0.5 \+ nuq K4/V4 pre-RoPE" \
  "$AKV" compress "$d" -o "$TMP/snuq.h5" -m snapkv --budget 0.5 --window 16 --quant nuq --calibration "$TMP/calib.json" --bits 4
"$AKV" compress -q "$d" -o "$TMP/stnuq.h5" -m streamingllm --sinks 0 --window 16 --budget 0.5 --quant nuq --calibration "$TMP/calib.json" >/dev/null
sink_check=$("$PY" -c 'import h5py, sys
ok, seen = True, set()
for path in sys.argv[1:]:
    f = h5py.File(path)
    for l in range(2):
        for h in range(4):
            g = f["layers/%d/heads/%d" % (l, h)]
            want = int((g["kept"][...] < 1).sum())
            seen.add(want)
            ok &= all(int(g[p].attrs["n_sink"]) == want for p in ("key", "value"))
print(ok, sorted(seen))' "$TMP/snuq.h5" "$TMP/stnuq.h5")
expect_equal "nuq after eviction: the sink row is position 0 where it is kept (snapkv), none without it (streamingllm, no sinks)" \
  "$sink_check" "True [0, 1]"
expect "evaluate the evicted nuq cache" 0 "snapkv 0.5 \+ nuq" "$AKV" evaluate -q --dump "$d" --cache "$TMP/snuq.h5"
expect_error "joint with quant=nuq" 1 "joint allocates kivi bits" \
  "$AKV" compress -q "$d" -o "$o/n.h5" -m joint --budget 0.3 --quant nuq --calibration "$TMP/calib.json"
"$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); c["nuq"]["layers"][1]["key_levels"]["3"][2]=-9.0; json.dump(c, open(sys.argv[2], "w"))' \
  "$TMP/calib.json" "$TMP/bad_nuq.json"
expect_error "nuq levels out of order" 2 "nuq.layers\[1\].key_levels.3\[2\]" \
  "$AKV" compress -q "$d" -o "$o/n.h5" -m nuq --calibration "$TMP/bad_nuq.json"
# Sensitivity weights (KVQuant's Fisher information) from the dump: the fit uses them.
cp "$d" "$TMP/fisher.h5"
"$PY" -c 'import h5py, numpy as np, sys
f = h5py.File(sys.argv[1], "r+")
for l in range(2):
    for name, src in (("key_fisher", "key_pre_rope"), ("value_fisher", "value")):
        x = f["layers/%d/%s" % (l, src)][...].astype(np.float32)
        f["layers/%d/%s" % (l, name)] = 1 + x * x' "$TMP/fisher.h5"
"$AKV" calibrate -q "$TMP/fisher.h5" -o "$TMP/calib_fisher.json" >/dev/null
"$AKV" calibrate -q "$d" -o "$TMP/calib_d.json" >/dev/null
fisher_check=$("$PY" -c 'import json, sys
a, b = json.load(open(sys.argv[1]))["nuq"], json.load(open(sys.argv[2]))["nuq"]
print(a["weights"].startswith("fisher"), b["weights"] == "none", a["layers"][0]["key_levels"] != b["layers"][0]["key_levels"],
      a["layers"][0]["key_upper"] == b["layers"][0]["key_upper"])' "$TMP/calib_fisher.json" "$TMP/calib_d.json")
expect_equal "calibrate: the dump's Fisher weights move the levels, not the thresholds" "$fisher_check" "True True True True"
"$PY" -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r+"); f["layers/1/value_fisher"][0, 3, 5] = -1' "$TMP/fisher.h5"
expect_error "calibrate: a negative Fisher weight" 2 "/layers/1/value_fisher\[197\] = -1" \
  "$AKV" calibrate -q "$TMP/fisher.h5" -o "$o/c.json"
cp "$d" "$TMP/flat.h5"
"$PY" -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r+"); f["layers/1/key_pre_rope"][...] = 0' "$TMP/flat.h5"
expect "calibrate's table says why no nuq codebooks" 0 "nuq codebooks not fitted: layer 1 keys" \
  "$AKV" calibrate -q "$TMP/flat.h5" -o "$TMP/calib_flat.json"
expect_error "nuq from a calibration whose layer left nothing to fit (constant keys)" 2 \
  "no nuq codebooks: layer 1 keys: .*summary.nuq_not_fitted" \
  "$AKV" compress -q "$d" -o "$o/n.h5" -m nuq --calibration "$TMP/calib_flat.json"
for k in 1 2; do "$AKV" calibrate -q "$TMP/flat.h5" --shard "$k/2" -o "$TMP/flat_p$k.json"; done
"$AKV" merge "$TMP/flat_p1.json" "$TMP/flat_p2.json" -o "$TMP/flat_merged.json"
if cmp -s "$TMP/calib_flat.json" "$TMP/flat_merged.json"; then pass "shards + merge = calibrate when a layer's nuq fit fails"
else fail "shards + merge differ from calibrate when a layer's nuq fit fails"; fi
expect_error "nuq sparsity out of range" 2 "--nuq-sparsity = 0" "$AKV" calibrate -q "$d" --nuq-sparsity 0 -o "$o/c.json"
[[ -e $o/n.h5 ]] && fail "no output after a refused nuq" || pass "no output after a refused nuq"
# Per-head cache types: calibrate --types measures every head under each type and assigns them
# for a stored-bits target; method ggml with types= stores each head as assigned.
tl=q4_0,q8_0,fp8_e4m3,tq3nc,tqv4
expect "calibrate --types" 0 "per-head cache types \\(method ggml --types\\), target 5.5 -> achieved" \
  "$AKV" calibrate -q "$d" "$TMP/d2.h5" --types $tl --types-target-bits 5.5 --rotate hadamard -o "$TMP/types.json"
"$PY" - "$TMP/types.json" >"$TMP/types.txt" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
t = j["summary"]["types"]
kb, vb = t["key_bits"], t["value_bits"]
heads = [h for l in j["layers"] for h in l["heads"]]
bits = sum(kb[h["ggml_types"][0]] + vb[h["ggml_types"][1]] for h in heads) / (2 * len(heads))
err = sum(h["type_key_error"][h["ggml_types"][0]] + h["type_value_error"][h["ggml_types"][1]] for h in heads)
print("keys", sorted(kb), "values", sorted(vb))
print("bits: mean = achieved %s, within target %s" % (abs(bits - t["achieved_bits"]) < 1e-12, bits <= t["target_bits"] + 1e-12))
print("error ok" if abs(err - t["predicted_error"]) < 1e-12 else "error differs")
print("distinct", len({tuple(h["ggml_types"]) for h in heads}) > 1)
PY
expect "types: keys take all but tqv*, values all but tq keys" 0 \
  "keys \['fp8_e4m3', 'q4_0', 'q8_0', 'tq3nc'\] values \['fp8_e4m3', 'q4_0', 'q8_0', 'tqv4'\]" cat "$TMP/types.txt"
expect "types: assignment within the target" 0 "bits: mean = achieved True, within target True" cat "$TMP/types.txt"
expect "types: the predicted error is the chosen types' errors" 0 "error ok" cat "$TMP/types.txt"
expect "types: heads take different types" 0 "distinct True" cat "$TMP/types.txt"
expect "compress -m ggml --types" 0 "per-head types from" \
  "$AKV" compress "$d" -o "$TMP/types.h5" -m ggml --types "$TMP/types.json" --rotate hadamard
expect "the cache records each head's types" 0 '"head_types":\[\[' "$AKV" info "$TMP/types.h5"
"$AKV" info --json "$TMP/types.h5" >"$TMP/types-info.json"
# The cache's bits per element: the assignment's, plus fp8 heads' one f32 scale per tensor.
expect "the typed cache stores the assigned bits" 0 "same bits" "$PY" -c "
import json
c = json.load(open('$TMP/types-info.json')); t = json.load(open('$TMP/types.json'))['summary']['types']
scales = c['bytes']['scales'] * 8 / c['elements']
print('same bits' if abs(c['bits_per_element'] - scales - t['achieved_bits']) < 1e-9 else (c['bits_per_element'], t))"
expect "evaluate the per-head typed cache" 0 '"attn_rel_err"' "$AKV" evaluate -q --json --dump "$d" --cache "$TMP/types.h5"
expect_error "types measured with another rotation" 1 "rotate=hadamard.*this cache rotates none" \
  "$AKV" compress -q "$d" -o "$o/t.h5" -m ggml --types "$TMP/types.json"
[[ -e $o/t.h5 ]] && fail "no output after refused types" || pass "no output after refused types"
expect_error "types with k=" 1 "types gives every head its k and v types" \
  "$AKV" compress -q "$d" -o "$o/t.h5" -m ggml --types "$TMP/types.json" --k q4_0
expect_error "types from a calibration without --types" 2 "calibrate with --types.*ggml_types" \
  "$AKV" compress -q "$d" -o "$o/t.h5" -m ggml --types "$TMP/calib.json"
expect_error "types target below the cheapest types" 2 "--types-target-bits = 3" \
  "$AKV" calibrate -q "$d" --types $tl --types-target-bits 3 -o "$o/c.json"
expect_error "types: values only" 2 "a type for keys and one for values" "$AKV" calibrate -q "$d" --types tqv4 -o "$o/c.json"
expect_error "types: unknown name" 2 "not a KV cache type.*--types = q3_k" "$AKV" calibrate -q "$d" --types q4_0,q3_k -o "$o/c.json"
expect_error "types: a name twice" 2 "given twice" "$AKV" calibrate -q "$d" --types q4_0,q4_0 -o "$o/c.json"
# A type with its own rotation: heads choose between q4_0 and q4_0 rotated (the synthetic keys'
# outlier channels favour the rotation); the cache stores each tensor so, whatever --rotate says.
"$AKV" calibrate -q "$d" --types q4_0,q4_0+hadamard --types-target-bits 4.5 -o "$TMP/rot.json" >/dev/null
expect "types with their own rotation: both chosen" 0 "both" "$PY" -c "
import json
t = {x for l in json.load(open('$TMP/rot.json'))['layers'] for h in l['heads'] for x in h['ggml_types']}
print('both' if t == {'q4_0', 'q4_0+hadamard'} else t)"
expect "compress with per-head rotations: a version-4 cache" 0 "akv-cache v4" bash -c \
  "'$AKV' compress -q '$d' -o '$TMP/rot.h5' -m ggml --types '$TMP/rot.json' >/dev/null && '$AKV' info '$TMP/rot.h5'"
expect_error "emit refuses a head's own rotation" 2 "engines rotate every quantized layer alike.*q4_0\+hadamard" \
  "$AKV" calibrate -q "$d" --types q4_0,q4_0+hadamard --types-target-bits 4.5 --emit llama.cpp -o "$o/c.json"
# --emit: what vLLM and llama.cpp take of the assignment (layers at least half f16 stay unquantized).
# Target 12 bits leaves every layer at least half f16 (all skipped, no scales); 10 quantizes both
# layers (a scale for each).
for tb in 12 10; do
"$AKV" calibrate -q "$d" --types f16,fp8_e4m3 --types-target-bits $tb -o "$TMP/emit.json" --emit vllm >"$TMP/vllm.json"
expect "emit vllm at $tb bits: flags, skip layers and scales agree with the assignment" 0 "emit ok" "$PY" -c "
import json
c = json.load(open('$TMP/emit.json')); e = json.load(open('$TMP/vllm.json'))
skip = [str(l['layer']) for l in c['layers']
        if 2 * sum(t == 'f16' for h in l['heads'] for t in h['ggml_types']) >= 2 * len(l['heads'])]
scales = {}
for l in c['layers']:
    if str(l['layer']) in skip: continue
    at = 'model.layers.%d.self_attn.' % l['layer']
    scales[at + 'k_scale'] = max(h['key_amax'] for h in l['heads']) / 448
    scales[at + 'v_scale'] = max(h['value_amax'] for h in l['heads']) / 448
flags = '--kv-cache-dtype fp8_e4m3' + (' --kv-cache-dtype-skip-layers ' + ' '.join(skip) if skip else '')
ok = (e['kv_cache_dtype'] == 'fp8_e4m3' and e['kv_cache_dtype_skip_layers'] == skip and e['flags'] == flags and
      set(e['scales']) == set(scales) and all(abs(e['scales'][k] - v) <= 1e-12 * v for k, v in scales.items()) and
      len(skip) == (2 if $tb == 12 else 0) and len(scales) == (0 if $tb == 12 else 4))
print('emit ok' if ok else (e, skip))"
done
expect "emit llama.cpp" 0 '"flags": "-ctk (q8_0|q4_0) -ctv (q8_0|q4_0) -fa on"' \
  "$AKV" calibrate -q "$d" --types f16,q8_0,q4_0 --types-target-bits 6 --rotate hadamard --emit llama.cpp
expect "emit vllm with TurboQuant types" 0 '"kv_cache_dtype": "turboquant_k3v4_nc"' \
  "$AKV" calibrate -q "$d" --types tq3nc,tqv4 --rotate hadamard --types-target-bits 4 --emit vllm
expect_error "emit vllm: types vLLM does not take" 2 "vLLM takes one cache dtype.*--types = keys" \
  "$AKV" calibrate -q "$d" --types q4_0,fp8_e4m3 --types-target-bits 6 --emit vllm
expect_error "emit llama.cpp: types llama.cpp does not take" 2 "llama.cpp's cache types.*--types = (fp8_e4m3|tq3nc)" \
  "$AKV" calibrate -q "$d" --types fp8_e4m3,tq3nc --types-target-bits 6 --emit llama.cpp
expect_error "emit without --types" 1 "--emit reads the per-head types" "$AKV" calibrate -q "$d" --emit vllm
# Sharded calibration: layers split over shards, merged by akv merge into the same calib.json.
for extra in "" "--aggregate max" "--types $tl --types-target-bits 5 --rotate hadamard" \
             "--allocator adakv-proxy --update-interval 100"; do
  # shellcheck disable=SC2086
  "$AKV" calibrate -q "$d" "$TMP/d2.h5" $extra -o "$TMP/cal_full.json" >/dev/null
  for k in 1 2; do
    # shellcheck disable=SC2086
    "$AKV" calibrate -q "$d" "$TMP/d2.h5" $extra --shard "$k/2" -o "$TMP/cal_p$k.json"
  done
  "$AKV" merge "$TMP/cal_p2.json" "$TMP/cal_p1.json" -o "$TMP/cal_merged.json"
  if cmp -s "$TMP/cal_full.json" "$TMP/cal_merged.json"; then pass "calibrate --shard 1/2, 2/2 + merge = calibrate ($extra)"
  else fail "calibrate --shard 1/2, 2/2 + merge = calibrate ($extra)"; fi
done
if command -v parallel >/dev/null; then
  "$AKV" calibrate -q "$d" "$TMP/d2.h5" -o "$TMP/cal_full.json" >/dev/null
  bash "$SRC/scripts/run_sharded" --akv "$AKV" -j 2 3 "$TMP/cal_par.json" -- calibrate "$d" "$TMP/d2.h5"
  if cmp -s "$TMP/cal_full.json" "$TMP/cal_par.json"; then pass "run_sharded calibrate (GNU parallel) = calibrate"
  else fail "run_sharded calibrate (GNU parallel) = calibrate"; fi
fi
"$AKV" calibrate -q "$d" "$TMP/d2.h5" --target-bits 2.5 --shard 2/2 -o "$TMP/cal_other.json"
expect_error "merge: a calibration shard missing" 2 "shard missing .*shard = 2/2" "$AKV" merge "$TMP/cal_p1.json" -o "$o/m.json"
expect_error "merge: calibration parts of other options" 2 "part of another run: options" \
  "$AKV" merge "$TMP/cal_p1.json" "$TMP/cal_other.json" -o "$o/m.json"
"$AKV" --max-isa generic calibrate -q "$d" "$TMP/d2.h5" --allocator adakv-proxy --update-interval 100 --shard 2/2 \
  -o "$TMP/cal_generic.json"
expect_error "merge: a calibration part computed with the plain loops (--max-isa generic)" 2 "part of another run: kernels" \
  "$AKV" merge "$TMP/cal_p1.json" "$TMP/cal_generic.json" -o "$o/m.json"
expect_error "merge: not a partial output" 2 "not a partial output" "$AKV" merge "$TMP/cal_full.json" -o "$o/m.json"
expect_empty_dir "no output after errors" "$o"
finish
