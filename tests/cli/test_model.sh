#!/usr/bin/env bash
# Model commands on the shared stories260K checkpoint: dump, evaluate --model, bench decode,
# and bad input. Skipped when ../shared is absent.
source "$(dirname "$0")/lib.sh"
SHARED=${AKV_SHARED_DIR:-$SRC/../shared}
M="$SHARED/models/stories260K.bin"
T="$SHARED/data/stories260K-samples.txt"
if [[ ! -f $M || ! -f $T ]]; then
  echo "SKIP: $M or $T not found (set AKV_SHARED_DIR)"
  exit 77
fi

expect "dump from the model" 0 "5 layers, 8 heads / 4 kv heads, head_dim 8, 512 tokens" \
  "$AKV" dump --model "$M" --tokens "$T" --line 3 -o "$TMP/s.h5" --window 32
expect "dump is a valid dump" 0 "stories260K" "$AKV" info --stats "$TMP/s.h5"
expect "allocate on a real dump" 0 "adakv allocation" "$AKV" allocate -q "$TMP/s.h5" --budget 0.3
expect "compress a real dump" 0 "wrote" "$AKV" compress -q "$TMP/s.h5" -o "$TMP/c.h5" -m k4v2 --pre-rope
expect "evaluate a real dump" 0 "top32" "$AKV" evaluate -q --dump "$TMP/s.h5" --cache "$TMP/c.h5"

expect "dump --out-proj: the model's W_o in every layer" 0 "o_proj=yes" \
  bash -c "'$AKV' dump --model '$M' --tokens '$T' --line 3 -o '$TMP/so.h5' --window 32 --out-proj >/dev/null && '$AKV' info '$TMP/so.h5'"
# same_datasets A B: True when every dataset of HDF5 file A equals B's of the same name.
same_datasets() {
  "$PY" -c 'import h5py, numpy as np, sys
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
sets = []
a.visititems(lambda n, o: sets.append(np.array_equal(o[...], b[n][...])) if isinstance(o, h5py.Dataset) else None)
print(len(sets) > 0 and all(sets))' "$1" "$2"
}
expect "CriticalAdaKV on a dump with o_proj" 0 "kept 0\.30.*adakv/snapkv 0.3 critical" \
  "$AKV" compress -q "$TMP/so.h5" -o "$TMP/crit.h5" -m critical-adakv --budget 0.3 --window 16
expect "allocate with critical=on" 0 "adakv allocation \(snapkv scores, CriticalKV\)" "$AKV" allocate -q "$TMP/so.h5" --method adakv --capacity-rule kvpress \
  --critical on --budget 0.3 --window 16 -o "$TMP/crit_b.json"
"$AKV" compress -q "$TMP/so.h5" -o "$TMP/crit_f.h5" --budgets "$TMP/crit_b.json" >/dev/null
same=$(same_datasets "$TMP/crit.h5" "$TMP/crit_f.h5")
expect_equal "CriticalAdaKV through allocate's budgets file: every dataset as when compressed directly" "$same" "True"
# Pipes: "-o -" writes the JSON alone on stdout, "-" as an input reads stdin.
"$AKV" allocate -q "$TMP/so.h5" --method adakv --capacity-rule kvpress --critical on --budget 0.3 --window 16 -o - \
  | "$AKV" compress -q "$TMP/so.h5" -o "$TMP/crit_pipe.h5" --budgets - >/dev/null
same=$(same_datasets "$TMP/crit_f.h5" "$TMP/crit_pipe.h5")
expect_equal "allocate -o - | compress --budgets -: every dataset as through the budgets file" "$same" "True"
"$AKV" allocate -q "$TMP/so.h5" --method adakv --capacity-rule kvpress --critical on --budget 0.3 --window 16 \
  -o /dev/stdout | cat >"$TMP/crit_devout.json"
if cmp -s "$TMP/crit_b.json" "$TMP/crit_devout.json"; then pass "allocate -o /dev/stdout (a pipe): the JSON alone"; else
  fail "allocate -o /dev/stdout (a pipe): the JSON alone"; fi
head -n 2 "$T" >"$TMP/two.txt"
"$AKV" evaluate -q --model "$M" --tokens "$TMP/two.txt" --sequences 2 --prefill 200 --methods kivi-2 --json -o "$TMP/tok_file.json"
"$AKV" evaluate -q --model "$M" --tokens - --sequences 2 --prefill 200 --methods kivi-2 --json -o "$TMP/tok_pipe.json" <"$TMP/two.txt"
if cmp -s "$TMP/tok_file.json" "$TMP/tok_pipe.json"; then pass "evaluate --tokens - reads stdin as the file"; else
  fail "evaluate --tokens - reads stdin as the file"; fi
# A token file may be an HDF5 file with /tokens (one sequence); ids outside int32 are refused.
head -n 1 "$T" >"$TMP/one.txt"
"$PY" -c 'import h5py, sys
ids = [int(t) for t in open(sys.argv[1]).read().split()]
with h5py.File(sys.argv[2], "w") as f: f["tokens"] = ids
with h5py.File(sys.argv[3], "w") as f: f["tokens"] = ids[:5] + [2**31]' "$TMP/one.txt" "$TMP/one.h5" "$TMP/big.h5"
"$AKV" evaluate -q --model "$M" --tokens "$TMP/one.txt" --prefill 200 --methods kivi-2 --json -o "$TMP/tok_one.json"
"$AKV" evaluate -q --model "$M" --tokens "$TMP/one.h5" --prefill 200 --methods kivi-2 --json -o "$TMP/tok_h5.json"
same=$("$PY" -c 'import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(a["methods"] == b["methods"])' "$TMP/tok_one.json" "$TMP/tok_h5.json")
expect_equal "evaluate --tokens: an HDF5 file's /tokens as the text file's line" "$same" "True"
expect_error "token file: an HDF5 id past int32 refused" 2 "token id out of range.*big.h5: /tokens = 2147483648" \
  "$AKV" evaluate -q --model "$M" --tokens "$TMP/big.h5" --prefill 2 --methods kivi-2
expect_error "CriticalKV on a dump without o_proj" 2 "/layers/0/o_proj = missing" \
  "$AKV" compress -q "$TMP/s.h5" -o "$TMP/crit_missing.h5" -m critical-snapkv --budget 0.3 --window 16
[[ -e $TMP/crit_missing.h5 ]] && fail "no output after a refused CriticalKV" || pass "no output after a refused CriticalKV"
expect "evaluate --model: CriticalKV reads the model's W_o" 0 "critical-adakv:budget=0.5:window=16 +[0-9]+" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 \
  --methods critical-snapkv:budget=0.5:window=16,critical-adakv:budget=0.5:window=16
expect_error "CriticalKV refused in chunked prefill" 1 "CriticalKV" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 --prefill-mode chunked:64 \
  --methods critical-snapkv:budget=0.5:window=16
expect_error "evaluate --model without --tokens or --text" 1 "--model needs --tokens or --text" \
  "$AKV" evaluate -q --model "$M" --methods kivi-2
expect_error "passkey: a depth outside [0, 1]" 2 "depth must be in \[0, 1\].*--depths = 1.5" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --depths 1.5 --methods kivi-2
head -n 1 "$T" | cut -d' ' -f1-20 >"$TMP/short_filler.txt"
expect_error "passkey: a filler shorter than a prompt" 2 "filler has fewer tokens than a prompt needs.*--filler = 19" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --filler "$TMP/short_filler.txt" --task passkey --lengths 200 --methods kivi-2
expect_error "evaluate --model: a budgets file (it describes a dump) refused" 1 "budgets files describe a dump.*--budgets" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 64 --methods "adakv:budgets=$TMP/crit_b.json"
expect_error "evaluate --model: rotation with pre-RoPE keys refused" 2 "rotation needs keys after RoPE.*--rotate = hadamard" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 64 --methods kivi:pre-rope:rotate=hadamard

"$AKV" calibrate -q "$TMP/s.h5" -o "$TMP/qcal.json" --bits 2,4 >/dev/null
"$AKV" calibrate -q "$TMP/s.h5" -o - --bits 2,4 >"$TMP/qcal_stdout.json"
if cmp -s "$TMP/qcal.json" "$TMP/qcal_stdout.json"; then pass "calibrate -o -: stdout holds the calibration JSON alone"; else
  fail "calibrate -o -: stdout holds the calibration JSON alone"; fi
"$AKV" calibrate -q "$TMP/s.h5" -o /dev/stdout --bits 2,4 | cat >"$TMP/qcal_devout.json"
if cmp -s "$TMP/qcal.json" "$TMP/qcal_devout.json"; then pass "calibrate -o /dev/stdout (a pipe): the JSON alone"; else
  fail "calibrate -o /dev/stdout (a pipe): the JSON alone"; fi
expect "qfilter on a dump with the filters of akv calibrate" 0 "kept 0\.30.*uniform/qfilter 0.3" \
  "$AKV" compress -q "$TMP/s.h5" -o "$TMP/qf.h5" -m qfilter --qfilters "$TMP/qcal.json" --budget 0.3
expect "evaluate --model: qfilter in the decode loop, exact and chunked prefill" 0 "qfilter:budget=0.5:qfilters=.* +[0-9]+" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 --prefill-mode chunked:128 \
  --methods "qfilter:budget=0.5:qfilters=$TMP/qcal.json"
expect "evaluate --model: qfilter cuts the cache while decoding (every=, target=)" 0 "uniform/qfilter 0.5 every 32 to 96" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 \
  --methods "qfilter:budget=0.5:qfilters=$TMP/qcal.json:every=32:target=96"
"$PY" -c 'import json, sys; j = json.load(open(sys.argv[1])); del j["layers"][2]["heads"][3]["qfilter"]; json.dump(j, open(sys.argv[2], "w"))' \
  "$TMP/qcal.json" "$TMP/qold.json"
expect_error "qfilter with a calibration file without filters" 2 "layers\[2\].heads\[3\].qfilter" \
  "$AKV" compress -q "$TMP/s.h5" -o "$TMP/qf_old.h5" -m qfilter --qfilters "$TMP/qold.json" --budget 0.3
[[ -e $TMP/qf_old.h5 ]] && fail "no output after a refused qfilter" || pass "no output after a refused qfilter"
# KVzap: dumps with attention inputs and KVzip+ scores (text: the repeat prompt needs a tokenizer),
# calibrate's surrogate, then the method on a dump and in the decode loop.
for i in 1 2; do
  "$AKV" dump --model "$M" --text "$T" --tokenizer bytes --ctx 160 --line $i --kvzap -o "$TMP/z$i.h5" >/dev/null
done
expect_error "dump --kvzap without a tokenizer (a llama2.c model has none; it crashed)" 1 "--kvzap needs a tokenizer for KVzip's repeat prompt" \
  "$AKV" dump --model "$M" --tokens "$T" --kvzap -o "$TMP/z_none.h5"
expect_error "dump --passkey without a tokenizer (it crashed)" 1 "--passkey needs a tokenizer for the prompt's text" \
  "$AKV" dump --model "$M" --passkey 200 -o "$TMP/z_none.h5"
[[ -e $TMP/z_none.h5 ]] && fail "no dump after a refused dump" || pass "no dump after a refused dump"
expect_error "evaluate --task ruler without a tokenizer" 1 "--task ruler needs a tokenizer for RULER's text prompts .*\\(--task ruler\\)" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task ruler --tasks vt --lengths 64 --samples 1 --methods kivi-2 -o "$TMP/r_none.json"
expect "dump --kvzap: attention inputs and KVzip+ scores in every layer" 0 "attn_input=yes.*kvzip_plus=yes" "$AKV" info "$TMP/z1.h5"
expect "calibrate fits KVzap's surrogate on dumps with attention inputs" 0 "KVzap surrogate \(method kvzap\): ridge alpha 1 on 312 rows of 64 inputs" \
  "$AKV" calibrate "$TMP/z1.h5" "$TMP/z2.h5" -o "$TMP/zcal.json" --bits 2,4 --no-nuq
for k in 1 2; do "$AKV" calibrate -q "$TMP/z1.h5" "$TMP/z2.h5" --bits 2,4 --no-nuq --shard "$k/2" -o "$TMP/zcal_p$k.json"; done
"$AKV" merge -q "$TMP/zcal_p2.json" "$TMP/zcal_p1.json" -o "$TMP/zcal_merged.json" >/dev/null
if cmp -s "$TMP/zcal.json" "$TMP/zcal_merged.json"; then pass "calibrate --shard + merge = calibrate, KVzap surrogates included"
else fail "calibrate --shard + merge differs from calibrate with KVzap surrogates"; fi
expect "kvzap on a dump with attention inputs" 0 "kept 0\.50.*adakv-global/kvzap 0.5" \
  "$AKV" compress -q "$TMP/z2.h5" -o "$TMP/zc.h5" -m kvzap --surrogate "$TMP/zcal.json" --budget 0.5
expect "evaluate --model: kvzap scores the prefill's attention inputs" 0 "kvzap:budget=0.5:surrogate=.* +[0-9]+" \
  "$AKV" evaluate -q --model "$M" --text "$T" --tokenizer bytes --ctx 160 --sequences 1 \
  --methods "kvzap:budget=0.5:surrogate=$TMP/zcal.json"
expect "kvzap with a threshold on a dump (DMSPress): each head keeps what scores >= T" 0 "threshold/kvzap >= -5" \
  "$AKV" compress -q "$TMP/z2.h5" -o "$TMP/zt.h5" -m kvzap --surrogate "$TMP/zcal.json" --threshold -5 --window 16
expect "evaluate --model: kvzap with a threshold while decoding" 0 "decoding=on:surrogate=.* +[0-9]+ .*threshold/kvzap >= -5 while decoding" \
  "$AKV" evaluate -q --model "$M" --text "$T" --tokenizer bytes --ctx 160 --sequences 1 \
  --methods "kvzap:threshold=-5:window=16:decoding=on:surrogate=$TMP/zcal.json"
expect_error "decoding=on is for the model's decode loop" 1 "akv evaluate --model \(--decoding = on\)" \
  "$AKV" compress -q "$TMP/z2.h5" -o "$TMP/zt2.h5" -m kvzap --surrogate "$TMP/zcal.json" --threshold -5 --decoding on
expect "a chunked prefill plans each chunk by the threshold" 0 "threshold/knorm >= -3" \
  "$AKV" evaluate -q --model "$M" --text "$T" --tokenizer bytes --ctx 160 --sequences 1 --prefill-mode chunked:64 \
  --methods "knorm:threshold=-3:window=8"
expect_error "chunked:N:replan refuses threshold eviction" 1 "re-planning cuts to budget x the tokens so far" \
  "$AKV" evaluate -q --model "$M" --text "$T" --tokenizer bytes --ctx 160 --sequences 1 --prefill-mode chunked:64:replan \
  --methods "knorm:threshold=-3"
expect_error "kvzap on a dump without attention inputs" 1 "/layers/0/attn_input = missing" \
  "$AKV" compress -q "$TMP/s.h5" -o "$TMP/zs.h5" -m kvzap --surrogate "$TMP/zcal.json" --budget 0.5
[[ -e $TMP/zs.h5 ]] && fail "no output after a refused kvzap" || pass "no output after a refused kvzap"
"$PY" -c 'import json, sys; j = json.load(open(sys.argv[1])); j["layers"][1]["heads"][2]["kvzap"]["weight"].pop(); json.dump(j, open(sys.argv[2], "w"))' \
  "$TMP/zcal.json" "$TMP/zcal_short.json"
expect_error "kvzap with a surrogate of another width" 2 "layers\[1\].heads\[2\].kvzap.weight = 63" \
  "$AKV" evaluate -q --model "$M" --text "$T" --tokenizer bytes --ctx 160 --sequences 1 \
  --methods "kvzap:budget=0.5:surrogate=$TMP/zcal_short.json"
expect_error "kvzap with a calibration file fitted without attention inputs" 2 "layers\[0\].heads\[0\].kvzap" \
  "$AKV" compress -q "$TMP/z2.h5" -o "$TMP/zs.h5" -m kvzap --surrogate "$TMP/qcal.json" --budget 0.5
"$AKV" calibrate -q "$TMP/s.h5" -o "$TMP/tcal.json" --bits 2,4 --no-nuq --types f16,fp8_e4m3,tq4nc,tqv4 \
  --types-target-bits 10 --rotate hadamard >/dev/null
expect "evaluate --model: per-head cache types from akv calibrate --types" 0 "ggml per-head types from .* hadamard" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 --methods "ggml:types=$TMP/tcal.json:rotate=hadamard"
expect "evaluate --model: nuq with the model's codebooks (akv calibrate on its dump)" 0 "nuq K3/V3 pre-RoPE" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 --methods "nuq:calibration=$TMP/qcal.json"
expect "evaluate --model: snapkv with quant=nuq" 0 "snapkv 0.5 \+ nuq K3/V3 pre-RoPE" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 \
  --methods "snapkv:budget=0.5:window=16:quant=nuq:calibration=$TMP/qcal.json"
expect "evaluate --model: nuq in chunked prefill" 0 "nuq K2/V4 pre-RoPE" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 --prefill-mode chunked:64 \
  --methods "nuq:calibration=$TMP/qcal.json:bits-key=2:bits-value=4"

expect "evaluate --model table" 0 "kivi-2 +[0-9]+ +[0-9.]+ +[0-9.]+" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 2 --methods kivi-2,adakv:budget=0.5:window=16
run "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 2 --prefill 400 --methods none --csv
if [[ $rc -eq 0 && $(wc -l <"$TMP/out") -eq 5 ]] && grep -q "^1,400,none,112," "$TMP/out"; then
  pass "evaluate --model --csv: one row per sequence and method"
else
  fail "evaluate --model --csv: rc $rc: $(head -3 "$TMP/out")"
fi
run "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 256 --json \
  --methods snapkv:budget=0.25:window=16:every=64:target=96
expect_output "decode-time compression: every 64 tokens cut back to 96 per head (the memory trace falls)" \
  'every 64 to 96'
if "$PY" - "$TMP/out" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["methods"][1]["memory_trace"]
b = t["bytes"]
assert any(y < x for x, y in zip(b, b[1:])), b
assert max(b) <= 4 * 5 * (96 + 64) * (8 * 2 * 2 + 4), max(b)  # 5 layers x 4 KV heads, f16 K and V of 8 dims
PY
then pass "decode-time compression: the trace falls at each cut and stays below target + every rows"
else fail "decode-time compression trace"; fi
expect_error "akv compress refuses decode-time compression" 1 "decode loop" \
  "$AKV" compress -q "$TMP/s.h5" -o "$TMP/never.h5" -m snapkv --budget 0.5 --every 64 --target 96
expect_error "decode-time compression takes both every= and target=" 1 "every= and target=" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --methods snapkv:budget=0.5:every=64
expect "evaluate --model --json" 0 '"ppl_delta"' \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --methods kivi:bits=8 --json
expect_output "evaluate --model --json names its format" '"format": "akv-perplexity"'
expect "passkey grid" 0 "depth +64 +128" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --lengths 64,128 --depths 0,0.5,1 --trials 2 --methods kivi-4
expect "passkey --json" 0 '"mean_accuracy"' \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --lengths 64 --depths 0.5 --trials 1 --json
expect_output "passkey --json names its format" '"format": "akv-passkey"'
expect "evaluate --model with tiered presets, fifo vs importance" 0 "balanced:demotion=fifo .* tiered balanced hot 128 .* fifo" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 200 --methods quality,compact,balanced,balanced:demotion=fifo,compact:warm=64:cold-bits=16
expect_error "tiered hot budget below the protected tokens" 2 "hot budget cannot hold the protected tokens.*hot = 40" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --methods compact:hot=40
expect "bench decode" 0 "x full time" \
  "$AKV" bench decode --model "$M" --tokens "$T" --sequences 1 --repeats 1 --methods kivi-2
expect "bench decode --json names its format" 0 '"format": "akv-bench-decode"' \
  "$AKV" bench decode --model "$M" --tokens "$T" --sequences 1 --repeats 1 --methods kivi-2 --json
expect "bench decode: kvzap scores the prefill's attention inputs, with a threshold while decoding" 0 \
  "threshold/kvzap >= -5 while decoding" \
  "$AKV" bench decode --model "$M" --tokens "$T" --sequences 1 --repeats 1 \
  --methods "kvzap:threshold=-5:window=16:decoding=on:surrogate=$TMP/zcal.json,kvzap:budget=0.5:surrogate=$TMP/zcal.json"
"$PY" -c 'import random; random.seed(4); print(" ".join(str(random.randrange(1, 500)) for _ in range(600)))' >"$TMP/t600.txt"
expect "bench decode past the trained context: a warning, the run goes on" 0 "past the model's trained context \(seq_len 512\)" \
  "$AKV" bench decode --model "$M" --tokens "$TMP/t600.txt" --prefill 500 --sequences 1 --repeats 1 --methods kivi-2
expect_error "bench decode --max-context refuses it" 2 "t600.txt: length = 600" \
  "$AKV" bench decode --model "$M" --tokens "$TMP/t600.txt" --prefill 500 --sequences 1 --repeats 1 --methods kivi-2 --max-context 512
run "$AKV" bench decode --model "$M" --tokens "$T" --sequences 2 --repeats 1 --methods kivi-2,snapkv:budget=0.5:window=16 --no-full --json
expect_equal "bench decode --no-full: no full row, the ratios null" \
  "$("$PY" -c 'import json, sys; j = json.load(open(sys.argv[1])); print([(m["method"], m["time_per_token_vs_full"]) for m in j["methods"]])' "$TMP/out")" \
  "[('kivi-2', None), ('snapkv:budget=0.5:window=16', None)]"

o="$TMP/out_dir"
mkdir -p "$o"
head -c 1000 "$M" >"$TMP/short.bin"
expect_error "truncated checkpoint" 2 "file size does not match the llama2.c header" \
  "$AKV" dump --model "$TMP/short.bin" --tokens "$T" -o "$o/d.h5"
# A NaN in the second layer's wk (after the 512 x 64 embeddings, 5 x 64 norms, 5 wq of 64 x 64 and
# the first wk of 32 x 64): the error names the tensor as llama2.c does.
"$PY" -c 'import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
o = 28 + 4 * (512 * 64 + 5 * 64 + 5 * 64 * 64 + 32 * 64)
b[o:o + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(b)' "$M" "$TMP/nan.bin"
expect_error "a non-finite weight" 2 "non-finite weight .*nan.bin.*wk = nan" \
  "$AKV" dump --model "$TMP/nan.bin" --tokens "$T" -o "$o/d.h5"
# --text: llama-perplexity's chunks (BOS + 1000 bytes = 1001 tokens -> 10 chunks of 100, each
# scoring its second half: 49 tokens).
head -c 1000 /dev/zero | tr '\0' 'a' >"$TMP/a.txt"
expect "evaluate --text cuts llama-perplexity chunks" 0 "10 sequences, 490 predicted tokens" \
  "$AKV" evaluate -q --model "$M" --tokenizer bytes --text "$TMP/a.txt" --ctx 100 --methods kivi-2
expect "evaluate --text --sequences takes the first chunks" 0 "3 sequences, 147 predicted tokens" \
  "$AKV" evaluate -q --model "$M" --tokenizer bytes --text "$TMP/a.txt" --ctx 100 --sequences 3 --methods kivi-2
expect "dump --text: chunk 2 of llama-perplexity's cut" 0 "100 tokens" \
  "$AKV" dump --model "$M" --tokenizer bytes --text "$TMP/a.txt" --ctx 100 --line 2 --window 8 -o "$TMP/text.h5"
expect "the chunk starts with BOS (256) then the text's bytes (97)" 0 "^\[256, 97, 97\]" "$PY" -c \
  "import h5py, sys; print([int(t) for t in h5py.File(sys.argv[1], 'r')['tokens'][:3]])" "$TMP/text.h5"
expect_error "--text without a tokenizer" 1 "--text needs a tokenizer" \
  "$AKV" evaluate -q --model "$M" --text "$TMP/a.txt" --ctx 100 --methods kivi-2
expect_error "--text shorter than a chunk" 2 "--text = 1001 tokens" \
  "$AKV" evaluate -q --model "$M" --tokenizer bytes --text "$TMP/a.txt" --ctx 2000 --methods kivi-2
expect_error "--text with --tokens" 1 "excludes" \
  "$AKV" evaluate -q --model "$M" --tokenizer bytes --text "$TMP/a.txt" --tokens "$T" --methods kivi-2
# GGUF: the tiny random llama that tests/fuzz/make_data.py writes (F32 and F16 seeds).
G="$SRC/tests/fuzz/corpus/gguf/seed-0"
printf '1 2 3 4 5 6 7 8\n3 1 4 1 5 9 2 6\n' >"$TMP/tiny.txt"
expect "dump of a GGUF model" 0 "1 layers, 2 heads / 1 kv heads" \
  "$AKV" dump --model "$G" --tokens "$TMP/tiny.txt" --window 4 -o "$TMP/g.h5"
expect "evaluate a GGUF model (F16 weights)" 0 "kivi-2" \
  "$AKV" evaluate -q --model "$SRC/tests/fuzz/corpus/gguf/seed-1" --tokens "$TMP/tiny.txt" --methods kivi-2:residual=0:group=4
expect "evaluate a GGUF model, weights converted to f32 on load" 0 "kivi-2" \
  "$AKV" evaluate -q --model "$SRC/tests/fuzz/corpus/gguf/seed-1" --tokens "$TMP/tiny.txt" --weights f32 --methods kivi-2:residual=0:group=4
# --weights q8 on a random GGUF in llama.cpp's Q4_K_M mix (Q4_K and Q6_K matrices): integer
# products against 8-bit activations move the mean NLLs a little (0.1% here; not at all would
# mean the mode did nothing); on F32 weights it is the stored path, bit for bit.
"$PY" "$SRC/scripts/dev/make_bench_gguf" "$TMP/km.gguf" --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 \
  --vocab 16 --ctx 64
for w in stored q8; do
  expect "evaluate a Q4_K_M GGUF, --weights $w" 0 "" "$AKV" evaluate -q --json --model "$TMP/km.gguf" \
    --tokens "$TMP/tiny.txt" --weights "$w" --methods kivi-2:residual=0:group=4 -o "$TMP/km-$w.json"
done
expect "--weights q8: mean NLLs within 2% of stored's, not equal" 0 "q8 close" "$PY" - "$TMP/km-stored.json" "$TMP/km-q8.json" <<'PY'
import json, sys
def ppl(path):
    out = {}
    def walk(o):
        if isinstance(o, dict):
            if "mean_nll" in o and "method" in o:
                out[o["method"]] = o["mean_nll"]
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(json.load(open(path)))
    return out
a, b = ppl(sys.argv[1]), ppl(sys.argv[2])
assert a.keys() == b.keys() and a, (a, b)
for m in a:
    assert a[m] != b[m] and abs(b[m] / a[m] - 1) < 0.02, (m, a[m], b[m])
print("q8 close", a, b)
PY
for w in stored q8; do
  run "$AKV" evaluate -q --json --model "$SRC/tests/fuzz/corpus/gguf/seed-0" --tokens "$TMP/tiny.txt" --weights "$w" \
    --methods kivi-2:residual=0:group=4
  cp "$TMP/out" "$TMP/f32-$w.json"
done
if cmp -s "$TMP/f32-stored.json" "$TMP/f32-q8.json"; then pass "--weights q8 on F32 weights: the stored results"
else fail "--weights q8 on F32 weights: the stored results"; fi
expect_error "unknown weight mode" 2 "--weights: f8" "$AKV" dump --model "$G" --tokens "$TMP/tiny.txt" --weights f8 -o "$o/d.h5"
expect "info on a GGUF file" 0 "GGUF v3" "$AKV" info "$G"
expect_output "info lists the tensor types" "F32 +11 tensors"
expect "info --json on a GGUF file" 0 '"architecture": "llama"' "$AKV" info --json "$SRC/tests/fuzz/corpus/gguf/seed-1"
"$AKV" info --json "$SRC/tests/fuzz/corpus/gguf/seed-1" >"$TMP/seed1-info.json"
"$AKV" plan --layers 1 --heads 2 --kv-heads 1 --head-dim 4 --context 32 --methods nuq:bits=3 --json >"$TMP/seed1-plan.json"
same=$("$PY" -c 'import json, sys
i = {r["method"]: r for r in json.load(open(sys.argv[1]))["akv"]["kv_bytes"]}["nuq:bits=3"]["bytes_per_token"]
p = json.load(open(sys.argv[2]))["methods"][0]["device_bytes_per_token"]
print(i == p and p > 0)' "$TMP/seed1-info.json" "$TMP/seed1-plan.json")
expect_equal "info on a model: nuq at KVQuant's defaults, the bytes akv plan counts" "$same" "True"
head -c 300 "$G" >"$TMP/short.gguf"
expect_error "truncated GGUF" 2 "short.gguf" "$AKV" dump --model "$TMP/short.gguf" --tokens "$TMP/tiny.txt" -o "$o/d.h5"
mkdir -p "$TMP/hf"
echo '{"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10, "max_position_embeddings": 32}' >"$TMP/hf/config.json"
expect_error "HF directory without safetensors" 3 "no model.safetensors" "$AKV" dump --model "$TMP/hf" --tokens "$T" -o "$o/d.h5"
echo '{"model_type": "gpt_neox"}' >"$TMP/hf/config.json"
expect_error "unsupported HF model type" 2 "model_type = gpt_neox" "$AKV" dump --model "$TMP/hf" --tokens "$T" -o "$o/d.h5"
# akv info on models: what akv does with it, or the feature it lacks.
expect "info on a llama2.c checkpoint: its header's shape" 0 "5 layers, 8 query / 4 KV heads, head_dim 8, dim 64, hidden 172, vocab 512" \
  "$AKV" info "$M"
expect_output "info on a llama2.c checkpoint: akv runs it" "akv runs it +yes"
expect "info on a truncated llama2.c checkpoint: the loader's refusal" 0 "no: file size does not match the llama2.c header" \
  "$AKV" info "$TMP/short.bin"
expect "info on a GGUF model: akv runs it, KV bytes per token" 0 "akv runs it +yes" "$AKV" info "$G"
expect_output "info lists the KV bytes per token of kivi-2" "kivi-2 +[0-9.]+ +kivi-2 K2/V2"
mkdir -p "$TMP/g1"
echo '{"model_type": "gemma", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 64}' >"$TMP/g1/config.json"
expect "info on a Gemma 1 directory names what akv lacks" 0 "no: akv does not implement Gemma 1's layers" "$AKV" info "$TMP/g1"
expect "info --json: runs false, missing" 0 '"runs": false' "$AKV" info --json "$TMP/g1"
expect_error "a Gemma 1 model is refused naming what is missing" 2 "Gemma 1's layers.*model_type = gemma" \
  "$AKV" dump --model "$TMP/g1" --tokens "$T" -o "$o/d.h5"
# Qwen3 (q_norm / k_norm before RoPE; q_proj wider than the model), from safetensors and from a
# GGUF of the same f32 weights: every layer's keys and values equal a numpy transcription of
# transformers' Qwen3 forward; the decode path (batch protocol) gives the prefill's perplexity.
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/q3" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 2 --seed 3 \
  --qwen3 --head-dim 32 --gguf "$TMP/q3.gguf" --tokens "$TMP/q3.txt" 2 40
for m in "$TMP/q3" "$TMP/q3.gguf"; do
  rm -f "$TMP/q3d.h5"  # a failed dump must not leave the previous model's to compare
  "$AKV" dump -q --model "$m" --tokens "$TMP/q3.txt" -o "$TMP/q3d.h5" >/dev/null
  expect "Qwen3 from $(basename "$m"): keys and values equal the numpy reference" 0 "reference ok" \
    "$PY" "$SRC/tests/cli/ref_forward.py" "$TMP/q3" "$TMP/q3d.h5" "$(head -1 "$TMP/q3.txt")"
done
# Phi-3: fused qkv_proj and gate_up_proj (GGUF: attn_qkv, ffn_up = gate then up), untied output.
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/p3" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 2 --seed 4 \
  --phi3 --gguf "$TMP/p3.gguf" --tokens "$TMP/p3.txt" 2 40
for m in "$TMP/p3" "$TMP/p3.gguf"; do
  rm -f "$TMP/p3d.h5"  # a failed dump must not leave the previous model's to compare
  "$AKV" dump -q --model "$m" --tokens "$TMP/p3.txt" -o "$TMP/p3d.h5" >/dev/null
  expect "Phi-3 from $(basename "$m"): keys and values equal the numpy reference" 0 "reference ok" \
    "$PY" "$SRC/tests/cli/ref_forward.py" "$TMP/p3" "$TMP/p3d.h5" "$(head -1 "$TMP/p3.txt")"
done
# Phi-3's longrope (40 tokens: original 64 takes the short factors, original 32 the long ones).
for orig in 64 32; do
  "$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/lr$orig" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 2 \
    --seed 4 --phi3 --longrope "$orig" --gguf "$TMP/lr$orig.gguf"
  for m in "$TMP/lr$orig" "$TMP/lr$orig.gguf"; do
    rm -f "$TMP/lrd.h5"
    "$AKV" dump -q --model "$m" --tokens "$TMP/p3.txt" -o "$TMP/lrd.h5" >/dev/null
    expect "Phi-3 longrope, original $orig, from $(basename "$m"): keys and values equal the numpy reference" 0 \
      "reference ok" "$PY" "$SRC/tests/cli/ref_forward.py" "$TMP/lr$orig" "$TMP/lrd.h5" "$(head -1 "$TMP/p3.txt")"
  done
done
# same_nll REF JSON: ref_forward.py's output REF says "reference ok" and its mean NLL equals the
# first method's mean_nll in the evaluate report JSON within 1e-6 relative.
same_nll() {
  "$PY" - "$1" "$2" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[0].startswith("reference ok"), lines
ref = float(lines[1].split()[-1])
got = json.load(open(sys.argv[2]))["methods"][0]["mean_nll"]
assert abs(got - ref) < 1e-6 * abs(ref), (got, ref)
print("same nll")
PY
}
# Gemma 3 (gemma3_text; a GGUF gemma3 as llama.cpp's converter writes it): layers 0 and 1 local
# (window 8), layer 2 global, (1 + w) q/k and sandwich norms, GeGLU, embeddings times sqrt(64),
# final soft-capping 5. Keys and values equal the numpy reference, and 20 tokens decoded through
# the windowed cache after a 20-token prompt give the reference's mean NLL; query_pre_attn_scalar
# 24 (not head_dim) from the safetensors config.
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/g3" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 3 --seed 5 \
  --gemma3 --head-dim 32 --softcap 5 --gguf "$TMP/g3.gguf" --tokens "$TMP/g3.txt" 1 40
mkdir -p "$TMP/g3q" && cp "$TMP/g3/model.safetensors" "$TMP/g3q/"
sed 's/"query_pre_attn_scalar": 32/"query_pre_attn_scalar": 24/' "$TMP/g3/config.json" >"$TMP/g3q/config.json"
# Gemma 2: no q/k norms, every other layer local from layer 0, attention logits soft-capped (2,
# small enough to bind on these weights) and final logits (5).
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/g2" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 3 --seed 6 \
  --gemma2 --head-dim 32 --attn-softcap 2 --softcap 5 --gguf "$TMP/g2.gguf"
for m in "$TMP/g3" "$TMP/g3.gguf" "$TMP/g3q" "$TMP/g2" "$TMP/g2.gguf"; do
  ref="${m%.gguf}"
  rm -f "$TMP/g3d.h5" "$TMP/g3e.json"
  "$AKV" dump -q --model "$m" --tokens "$TMP/g3.txt" -o "$TMP/g3d.h5" >/dev/null
  "$AKV" evaluate -q --model "$m" --tokens "$TMP/g3.txt" --prefill 20 --methods none --json -o "$TMP/g3e.json"
  "$PY" "$SRC/tests/cli/ref_forward.py" "$ref" "$TMP/g3d.h5" "$(head -1 "$TMP/g3.txt")" 20 >"$TMP/g3ref.txt" || true
  expect "Gemma from $(basename "$m"): keys, values and the decoded NLL past the window equal the numpy reference" 0 \
    "same nll" same_nll "$TMP/g3ref.txt" "$TMP/g3e.json"
done
"$AKV" evaluate -q --model "$TMP/g3.gguf" --tokens "$TMP/g3.txt" --prefill 20 --methods kivi-2,snapkv:budget=0.5:window=4 \
  --json -o "$TMP/g3m.json"
expect "Gemma 3: methods run on the global layers; the local layers' windows are counted" 0 "windows counted" \
  "$PY" - "$TMP/g3m.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for m in r["methods"]:
    assert m["mean_nll"] > 0 and m["cache_bytes"] > 0, m
print("windows counted")
PY
# A dump records its local layers' windows; past a window the offline commands refuse it, within
# every window it reads as global layers.
"$AKV" dump -q --model "$TMP/g3.gguf" --tokens "$TMP/g3.txt" -o "$TMP/g3w.h5" >/dev/null
expect "info on a Gemma 3 dump: the windows it records" 0 "windows +global in layer 2; 8 tokens in layers 0 1" \
  "$AKV" info "$TMP/g3w.h5"
expect_error "compress over a window shorter than the dump is refused, naming the layer" 2 \
  "layer 0 attends within 8 of the 40 tokens.*/layers/0.sliding_window = 8" \
  "$AKV" compress "$TMP/g3w.h5" -o "$o/c.h5" --method kivi-4
expect_error "calibrate over a window shorter than the dump is refused" 2 "calibration over a sliding-window layer" \
  "$AKV" calibrate "$TMP/g3w.h5" -o "$o/c.json"
awk '{print $1, $2, $3, $4, $5, $6, $7, $8}' "$TMP/g3.txt" >"$TMP/g3_8.txt"
"$AKV" dump -q --model "$TMP/g3.gguf" --tokens "$TMP/g3_8.txt" --window 4 -o "$TMP/g3w8.h5" >/dev/null
expect "compress a dump within every window" 0 "wrote" "$AKV" compress "$TMP/g3w8.h5" -o "$TMP/g3w8c.h5" --method kivi-4
# Its calibration (every model layer) serves the methods over the global layer in the decode loop.
"$AKV" calibrate -q "$TMP/g3w8.h5" -o "$TMP/g3cal.json" >/dev/null
expect "Gemma 3: calibration files index the model's layers; the methods read the global layer's heads" 0 \
  "qfilters=.*uniform/qfilter 0.5" "$AKV" evaluate -q --model "$TMP/g3.gguf" --tokens "$TMP/g3.txt" --prefill 20 \
  --methods "kivi:calibration=$TMP/g3cal.json:residual=0,nuq:calibration=$TMP/g3cal.json:bits=3,snapkv:score=qfilter:qfilters=$TMP/g3cal.json:budget=0.5:window=4"
expect "info on a Gemma 3 GGUF: the global and the local layers, KV bytes with the windows" 0 \
  "global in layer 2; sliding window of 8 tokens in the other 2" "$AKV" info "$TMP/g3.gguf"
# Gemma 3's multimodal checkpoint (Gemma3ForConditionalGeneration): text_config and the language
# model's tensors under either transformers layout give the text model's NLL exactly.
"$AKV" evaluate -q --model "$TMP/g3" --tokens "$TMP/g3.txt" --prefill 20 --methods kivi-2 --json -o "$TMP/g3t.json"
for prefix in language_model.model. model.language_model.; do
  rm -rf "$TMP/g3m"
  "$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/g3m" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 3 --seed 5 \
    --gemma3 --head-dim 32 --softcap 5 --multimodal "$prefix"
  "$AKV" evaluate -q --model "$TMP/g3m" --tokens "$TMP/g3.txt" --prefill 20 --methods kivi-2 --json -o "$TMP/g3m.json"
  expect "Gemma 3 multimodal checkpoint ($prefix): the text model's results" 0 "same results" "$PY" - "$TMP/g3t.json" "$TMP/g3m.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["methods"] for p in sys.argv[1:3])
assert [m["mean_nll"] for m in a] == [m["mean_nll"] for m in b], (a, b)
print("same results")
PY
done
# Mistral's sliding window in every layer (8): past it, none decodes through the window and gives the
# numpy reference's NLL; kivi-2 is refused there and runs within the window.
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/mw" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 2 --seed 7 \
  --mistral 8
rm -f "$TMP/g3d.h5" "$TMP/mwe.json"
"$AKV" dump -q --model "$TMP/mw" --tokens "$TMP/g3.txt" -o "$TMP/g3d.h5" >/dev/null
"$AKV" evaluate -q --model "$TMP/mw" --tokens "$TMP/g3.txt" --prefill 20 --methods none --json -o "$TMP/mwe.json"
"$PY" "$SRC/tests/cli/ref_forward.py" "$TMP/mw" "$TMP/g3d.h5" "$(head -1 "$TMP/g3.txt")" 20 >"$TMP/g3ref.txt" || true
expect "Mistral past its sliding window: keys, values and the decoded NLL equal the numpy reference" 0 "same nll" \
  same_nll "$TMP/g3ref.txt" "$TMP/mwe.json"
expect_error "Mistral past its sliding window: a method other than none is refused" 1 "only none and f32 run" \
  "$AKV" evaluate -q --model "$TMP/mw" --tokens "$TMP/g3.txt" --prefill 20 --methods kivi-2 -o "$o/e.txt"
head -c 30 "$TMP/g3.txt" | awk '{print $1, $2, $3, $4, $5, $6, $7, $8}' >"$TMP/mw8.txt"
expect "Mistral within its sliding window: kivi-2 runs" 0 "kivi-2" \
  "$AKV" evaluate -q --model "$TMP/mw" --tokens "$TMP/mw8.txt" --prefill 4 --methods kivi-2
# A sharded run of a Hugging Face directory records the hash of every file in it: a file added
# between the shards makes them parts of different runs.
rm -rf "$TMP/mwd" && cp -r "$TMP/mw" "$TMP/mwd"
"$AKV" evaluate -q --model "$TMP/mwd" --tokens "$TMP/mw8.txt" --prefill 4 --methods kivi-2 --shard 1/2 -o "$TMP/mwd1.json"
"$AKV" evaluate -q --model "$TMP/mwd" --tokens "$TMP/mw8.txt" --prefill 4 --methods kivi-2 --shard 2/2 -o "$TMP/mwd2.json"
echo "notes" >"$TMP/mwd/README.md"
"$AKV" evaluate -q --model "$TMP/mwd" --tokens "$TMP/mw8.txt" --prefill 4 --methods kivi-2 --shard 2/2 -o "$TMP/mwd2b.json"
expect "merge: shards of a Hugging Face directory" 0 "kivi-2" "$AKV" merge "$TMP/mwd1.json" "$TMP/mwd2.json"
expect_error "merge: a file added to the model directory between shards" 2 "part of another run: inputs" \
  "$AKV" merge "$TMP/mwd1.json" "$TMP/mwd2b.json"
expect "info on Mistral: a sliding window in every layer" 0 "sliding window of 8 tokens in every layer" "$AKV" info "$TMP/mw"
expect "plan on a Mistral config: every layer's window" 0 "every layer attends within a sliding window of 8 tokens" \
  "$AKV" plan --config "$TMP/mw" --memory 1GiB --methods none,kivi-2
rm -rf "$TMP/mw_noweights" && mkdir "$TMP/mw_noweights" && cp "$TMP/mw/config.json" "$TMP/mw_noweights/"
expect "info on a model the loader refuses: runs false, the loader's message" 0 \
  '"error": "no model.safetensors or model.safetensors.index.json' "$AKV" info --json "$TMP/mw_noweights"
expect_output "info on a model the loader refuses: runs false" '"runs": false'
expect "plan on a Gemma 3 config: the local layers' windows counted, the methods over the global layer" 0 \
  "2 of the 3 layers attend within a sliding window of 8 tokens" "$AKV" plan --config "$TMP/g3" --memory 1GiB --methods none,kivi-2
# Chunked prefill over Gemma 3's windows (chunks of 6 over windows of 8): the full cache's NLL is the
# exact protocol's; a method runs.
"$AKV" evaluate -q --model "$TMP/g3.gguf" --tokens "$TMP/g3.txt" --prefill 20 --methods kivi-2 --json -o "$TMP/g3x.json"
"$AKV" evaluate -q --model "$TMP/g3.gguf" --tokens "$TMP/g3.txt" --prefill 20 --methods kivi-2 --prefill-mode chunked:6 \
  --json -o "$TMP/g3c.json"
expect "Gemma 3: chunked prefill within the windows gives the exact protocol's full-cache NLL" 0 "same nll" \
  "$PY" - "$TMP/g3x.json" "$TMP/g3c.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["methods"] for p in sys.argv[1:3])
assert abs(a[0]["mean_nll"] - b[0]["mean_nll"]) < 1e-5 * abs(a[0]["mean_nll"]), (a[0], b[0])
assert b[1]["mean_nll"] > 0, b[1]
print("same nll")
PY
"$AKV" evaluate -q --model "$TMP/q3" --tokens "$TMP/q3.txt" --methods none --json -o "$TMP/q3e.json"
"$AKV" evaluate -q --model "$TMP/q3" --tokens "$TMP/q3.txt" --methods none --prefill-mode batch --json -o "$TMP/q3b.json"
expect "Qwen3 decode path: the batch protocol's full-cache NLL equals the prefill's" 0 "same nll" "$PY" - "$TMP/q3e.json" "$TMP/q3b.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["methods"][0]["mean_nll"] for p in sys.argv[1:3])
assert abs(a - b) < 1e-6 * abs(a), (a, b)
print("same nll")
PY
expect_error "missing checkpoint" 3 "model file not found" "$AKV" dump --model "$o/none.bin" --tokens "$T" -o "$o/d.h5"
printf '1 2 3\n4 five 6\n' >"$TMP/bad.txt"
expect_error "bad token file" 2 "line 2 = five" "$AKV" dump --model "$M" --tokens "$TMP/bad.txt" -o "$o/d.h5"
printf '1 2 3 999\n' >"$TMP/oov.txt"
expect_error "token outside the vocabulary" 2 "token = 999" "$AKV" dump --model "$M" --tokens "$TMP/oov.txt" --window 2 -o "$o/d.h5"
printf '1 2 3 4 5 6 7 8\n1 2 3 4 5 6 7 999\n' >"$TMP/oov_target.txt"
expect_error "evaluate: a prediction target outside the vocabulary" 2 "sequence 2 position 8 token = 999" \
  "$AKV" evaluate -q --model "$M" --tokens "$TMP/oov_target.txt" --methods kivi-2 --prefill 4 -o "$o/e.txt"
expect_error "bench decode: a token outside the vocabulary" 2 "token = 999" \
  "$AKV" bench decode --model "$M" --tokens "$TMP/oov_target.txt" --methods kivi-2 --prefill 4
expect_error "no such line" 2 "--line = 99" "$AKV" dump --model "$M" --tokens "$T" --line 99 -o "$o/d.h5"
expect_error "unknown method flag" 1 "bogus" "$AKV" evaluate -q --model "$M" --tokens "$T" --methods kivi:bogus=1 -o "$o/e.txt"
expect_error "prefill too long" 2 "--prefill = 600" "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --prefill 600 --methods none -o "$o/e.txt"
expect_error "streaming eviction with quantization" 1 "--quant" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 1 --methods h2o:budget=0.5:quant=kivi-2 -o "$o/e.txt"
expect_error "passkey length too short" 2 "--lengths = 10" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --lengths 10 -o "$o/e.txt"
expect_error "passkey beyond --max-context" 2 "model's context \(seq_len 512\).*--lengths = 510" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --lengths 510 --max-context 512 -o "$o/e.txt"
expect_error "a ruler flag without --task ruler" 1 "--query-aware needs --task ruler" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --query-aware -o "$o/e.txt"
expect_error "ruler beyond --max-context" 2 "position limit \(1000, --max-context\).*--lengths = 990" \
  "$AKV" evaluate -q --model "$M" --tokenizer bytes --task ruler --tasks niah_single_1 --lengths 990 --max-context 1000 -o "$o/e.txt"
if [[ -f $SHARED/models/llama2-tokenizer.model ]]; then
  expect_error "tokenizer larger than the model vocabulary" 2 "vocab_size = 32000" \
    "$AKV" evaluate -q --model "$M" --task passkey --tokenizer "$SHARED/models/llama2-tokenizer.model" -o "$o/e.txt"
fi
expect_error "tokenizer file not SentencePiece" 2 "not a SentencePiece model" \
  "$AKV" evaluate -q --model "$M" --task passkey --tokenizer "$T" -o "$o/e.txt"
expect_empty_dir "no output after errors" "$o"
# Past the trained context (512): the run goes on, as llama.cpp's, with one warning and the JSON's
# "context" field.
expect "passkey past the trained context" 0 "" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --lengths 600 --depths 0.5 --trials 1 --methods kivi-2 \
  --json -o "$TMP/past.json"
if [[ $(grep -c "akv: warning: the run reaches position 604, past the model's trained context (seq_len 512)" "$TMP/err") == 1 ]] &&
   "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1]))["context"]; sys.exit(0 if c == {"trained": 512, "longest": 604, "past_trained": True} else 1)' "$TMP/past.json"; then
  pass "past the trained context: one warning, the JSON says so"
else
  fail "past the trained context: one warning, the JSON says so: $(head -c 300 "$TMP/err")"
fi
finish
