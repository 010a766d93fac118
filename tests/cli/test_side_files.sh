#!/usr/bin/env bash
# Side files (budgets, calibration, model configs) with wrong types or values the command line
# would reject: exit 2 with one line naming the file and the field, no output file.
source "$(dirname "$0")/lib.sh"
need_python_h5py
FIX="$SRC/data/fixtures"
o="$TMP/outdir"
mkdir -p "$o"
# edit IN OUT PYTHON: OUT is IN's JSON after the Python statement (on the dict j).
edit() { "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); $3; json.dump(j, open(sys.argv[2], 'w'))" "$1" "$2"; }
compress_with() { "$AKV" compress -q "$FIX/dump.h5" -o "$o/c.h5" -m adakv --budgets "$1" --quant kivi-4; }

edit "$FIX/budgets.json" "$TMP/b1.json" 'j["format"] = 5'
expect_error "budgets: format of another type" 2 "format = 5" compress_with "$TMP/b1.json"
edit "$FIX/budgets.json" "$TMP/b2.json" 'j["summary"]["params"]["alpha"] = -1'
expect_error "budgets: negative alpha" 2 "params.eviction.alpha = -1" compress_with "$TMP/b2.json"
edit "$FIX/budgets.json" "$TMP/b3.json" 'j["layers"][0]["heads"][1]["tokens"] = 60.5'
expect_error "budgets: fractional tokens" 2 "layers\[0\].heads\[1\].tokens = 60.5" compress_with "$TMP/b3.json"
edit "$FIX/budgets.json" "$TMP/b7.json" 'j["layers"].pop()'
expect_error "budgets: a layer missing from the heads' list" 2 "budgets made for another number of layers .*layers = " compress_with "$TMP/b7.json"
edit "$FIX/budgets.json" "$TMP/b8.json" 'j["layers"][1]["heads"].pop()'
expect_error "budgets: a head missing from a layer" 2 "budgets made for another number of KV heads .*layers\[1\].heads = " compress_with "$TMP/b8.json"
edit "$FIX/budgets.json" "$TMP/b4.json" 'j["summary"]["params"]["window"] = 1e19'
expect_error "budgets: a window past any count" 2 "params.eviction.window" compress_with "$TMP/b4.json"
edit "$FIX/budgets.json" "$TMP/b5.json" 'j["summary"]["params"]["sinks"] = "four"'
expect_error "budgets: sinks of another type" 2 "params.eviction.sinks" compress_with "$TMP/b5.json"
edit "$FIX/budgets-joint.json" "$TMP/b6.json" 'j["layers"][1]["heads"][0]["key_bits"] = 2.7'
expect_error "joint budgets: fractional bits" 2 "key_bits = 2.7" \
  "$AKV" compress -q "$FIX/dump.h5" -o "$o/c.h5" --budgets "$TMP/b6.json" --quant kivi

ccomp() { "$AKV" compress -q "$FIX/dump.h5" -o "$o/c.h5" -m kivi --calibration "$1"; }
edit "$FIX/calibration.json" "$TMP/c1.json" 'j["version"] = "1"'
expect_error "calibration: version of another type" 2 "version" ccomp "$TMP/c1.json"
edit "$FIX/calibration.json" "$TMP/c2.json" 'j["layers"][0]["heads"].append(j["layers"][1]["heads"].pop())'
expect_error "calibration: heads spread unevenly over layers" 2 "layers\[0\].heads = 3" ccomp "$TMP/c2.json"
edit "$FIX/calibration.json" "$TMP/c4.json" 'j["layers"].pop()'
expect_error "calibration: a layer missing from the heads' list" 2 "calibration made for another number of layers .*layers = " ccomp "$TMP/c4.json"
edit "$FIX/calibration.json" "$TMP/c3.json" 'j["layers"][0]["heads"][0]["bits_key"] = 2.7'
expect_error "calibration: fractional bits" 2 "bits_key = 2.7" ccomp "$TMP/c3.json"
edit "$FIX/calibration.json" "$TMP/c5.json" 'del j["shape"]'
expect_error "calibration: no shape" 2 "bad calibration file: .*'shape' not found \\(.*c5.json\\)" ccomp "$TMP/c5.json"
edit "$FIX/budgets.json" "$TMP/b9.json" 'del j["summary"]'
expect_error "budgets: no summary" 2 "bad budgets file: .*'summary' not found \\(.*b9.json\\)" compress_with "$TMP/b9.json"

mkdir -p "$TMP/cfg"
echo '{"num_hidden_layers": "2", "num_attention_heads": 4, "hidden_size": 64}' >"$TMP/cfg/config.json"
expect_error "model config: a size of another type" 2 "num_hidden_layers" "$AKV" plan --config "$TMP/cfg"
echo '{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 8, "vocab_size": 10, "tie_word_embeddings": "yes"}' >"$TMP/cfg/config.json"
expect_error "model config: a flag of another type" 2 "tie_word_embeddings" "$AKV" plan --config "$TMP/cfg"
echo '{"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8, "intermediate_size": 8, "vocab_size": 10, "max_position_embeddings": 16, "rms_norm_eps": -1e-5}' >"$TMP/cfg/config.json"
printf '1 2 3\n' >"$TMP/t.txt"
expect_error "model config: a negative eps (all-NaN activations)" 2 "rms_norm_eps = -1e-05" \
  "$AKV" dump --model "$TMP/cfg" --tokens "$TMP/t.txt" --window 1 -o "$o/d.h5"

# A llama2.c header whose sizes multiply past 2^64 (each field within its own bound).
"$PY" -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<7i', 1<<24, 1<<24, 1<<24, 16, 16, 1<<24, 1<<24))" "$TMP/huge.bin"
expect_error "llama2.c header sizes overflow" 2 "overflows 64 bits" \
  "$AKV" dump --model "$TMP/huge.bin" --tokens "$TMP/t.txt" --window 1 -o "$o/d.h5"

# Finite weights whose activations overflow f32 (a 1-layer llama2.c model, every weight 1e15):
# an error, not a NaN perplexity with exit 0.
"$PY" -c "
import struct, sys
d, h, L, H, K, V, S = 8, 16, 1, 2, 2, 10, 8
n = V*d + 2*L*d + 2*L*d*d + 2*L*K*(d//H)*d + 3*L*d*h + d + S*(d//H)
open(sys.argv[1], 'wb').write(struct.pack('<7i', d, h, L, H, K, V, S) + struct.pack('<%df' % n, *([1e15] * n)))
" "$TMP/overflow.bin"
printf '1 2 3 4 5 6 7 8\n' >"$TMP/t8.txt"
expect_error "model: activations overflow f32" 2 "non-finite activation.*hidden state after layer 0" \
  "$AKV" evaluate -q --model "$TMP/overflow.bin" --tokens "$TMP/t8.txt" --methods kivi-4 --prefill 4 -o "$o/e.txt"

# A cache with a NaN among its f16 residual rows: corrupt, not a result.
cp "$FIX/cache-v1-kivi.h5" "$TMP/nan.h5"
"$PY" -c "
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], 'r+') as f:
    d = f['layers/1/heads/0/value/residual']
    x = d[()]
    x.flat[5] = np.nan
    d[...] = x
" "$TMP/nan.h5"
expect_error "cache: NaN in the residual rows" 2 "non-finite f16 value.*residual\[5\]" \
  "$AKV" decompress -q "$TMP/nan.h5" --dump "$FIX/dump.h5" -o "$o/r.h5"
expect_error "evaluate: NaN in the cache" 2 "non-finite f16 value" \
  "$AKV" evaluate -q --dump "$FIX/dump.h5" --cache "$TMP/nan.h5" -o "$o/e.txt"
# JSON nested 100000 levels deep (printing or comparing it recursively overflowed the stack):
# every JSON reader refuses it at the parser, naming the file.
deep() { "$PY" -c "import sys; open(sys.argv[1], 'w').write(sys.argv[2] % ('[' * 100000 + ']' * 100000))" "$@"; }
deep "$TMP/deep-b.json" '{"format": "akv-budgets", "version": 1, "layers": %s}'
expect_error "budgets nested 100000 deep" 2 "nests arrays/objects deeper than 64 levels .*deep-b.json" compress_with "$TMP/deep-b.json"
deep "$TMP/deep-c.json" '{"format": %s, "version": 1}'
expect_error "calibration nested 100000 deep" 2 "deeper than 64 levels .*deep-c.json" ccomp "$TMP/deep-c.json"
mkdir -p "$TMP/deepcfg"
deep "$TMP/deepcfg/config.json" '{"num_hidden_layers": %s}'
expect_error "model config nested 100000 deep" 2 "deeper than 64 levels .*config.json" "$AKV" plan --config "$TMP/deepcfg"
deep "$TMP/deep-part.json" '{"format": "akv-perplexity-part", "version": 1, "inputs": %s}'
expect_error "merge part nested 100000 deep" 2 "deeper than 64 levels .*deep-part.json" "$AKV" merge "$TMP/deep-part.json" -o "$o/m.json"
expect_error "a directory where a JSON file is read" 3 "budgets file is a directory" compress_with "$TMP/deepcfg"
expect_empty_dir "no output after bad side files" "$o"
finish
