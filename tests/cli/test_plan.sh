#!/usr/bin/env bash
# akv plan on the example configs and on a bare shape; bad sizes and budgets fail with one line.
source "$(dirname "$0")/lib.sh"

C="$SRC/docs/configs"
expect "plan llama-2-7b 16GiB" 0 "none +524288 +0 +7062 " \
  "$AKV" plan --config "$C/llama-2-7b.json" --memory 16GiB
expect "plan tinyllama lists the tiered presets" 0 "compact .* tiered compact hot 64" \
  "$AKV" plan --config "$C/tinyllama-1.1b.json" --memory 16GiB
expect "plan --json" 0 '"max_batch_at_context"' \
  "$AKV" plan --layers 32 --kv-heads 8 --head-dim 128 --memory 80GB --methods none,kivi-2,balanced:warm=4096 --json
expect_output "plan --json names its format" '"format": "akv-plan"'
expect "plan without weights: unbounded device use with a warm budget" 0 "balanced:warm=4096 .* unbounded" \
  "$AKV" plan --layers 32 --kv-heads 8 --head-dim 128 --memory 80GB --methods none,balanced:warm=4096
expect "plan --host-memory bounds the cold tier" 0 "host 68.72 GB" \
  "$AKV" plan --layers 32 --kv-heads 8 --head-dim 128 --memory 80GB --host-memory 64GiB --methods balanced:warm=4096
expect_error "plan: bad memory size" 2 "not a byte size.*--memory = 16 potatoes" \
  "$AKV" plan --layers 2 --kv-heads 2 --head-dim 64 --memory "16 potatoes"
expect_error "plan: weights do not fit" 2 "weights alone" \
  "$AKV" plan --config "$C/llama-2-7b.json" --memory 8GiB
# A RoPE type the model does not run (yarn) does not matter to the memory plan.
"$PY" - "$C/llama-2-7b.json" "$TMP/yarn.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
json.dump(c, open(sys.argv[2], "w"))
PY
expect "plan reads a config with yarn rope_scaling" 0 "max context" "$AKV" plan --config "$TMP/yarn.json" --memory 16GiB
expect_error "plan: shape or config" 1 "give --config, or --layers" "$AKV" plan --memory 1GB
expect_error "plan: missing config" 3 "cannot open model config" "$AKV" plan --config "$TMP/nope.json"
echo '{"num_hidden_layers": 2}' >"$TMP/bad.json"
expect_error "plan: config without hidden_size" 2 "num_attention_heads" "$AKV" plan --config "$TMP/bad.json"
# A calibration given as a method spec gives the per-head bits --calibration gives (the fixture
# calibration: 2 layers, 2 KV heads, head_dim 32); nuq counts its calibration's codebooks.
cal="$SRC/data/fixtures/calibration.json"
spec_bytes=$("$AKV" plan --layers 2 --kv-heads 2 --head-dim 32 --context 256 --memory 1GB --methods "kivi:calibration=$cal" \
  | awk '/^kivi:calibration=/ {print $2}')
flag_bytes=$("$AKV" plan --layers 2 --kv-heads 2 --head-dim 32 --context 256 --memory 1GB --methods kivi-2 --calibration "$cal" \
  | awk '/^kivi:calibration / {print $2}')
two_bytes=$("$AKV" plan --layers 2 --kv-heads 2 --head-dim 32 --context 256 --memory 1GB --methods kivi-2 | awk '/^kivi-2 / {print $2}')
if [[ -n $spec_bytes && $spec_bytes == "$flag_bytes" && $spec_bytes != "$two_bytes" ]]; then
  pass "plan: calibration= in a spec reads the per-head bits ($spec_bytes B/token, kivi-2 $two_bytes)"
else
  fail "plan: calibration= in a spec gave '$spec_bytes', --calibration '$flag_bytes', kivi-2 '$two_bytes'"
fi
expect "plan: nuq with the calibration's codebooks" 0 "nuq K3/V3 pre-RoPE" \
  "$AKV" plan --layers 2 --kv-heads 2 --head-dim 32 --context 256 --memory 1GB --methods "nuq:calibration=$cal"
# nuq without a calibration: KVQuant's defaults (sparsity 0.99, one f16 sink). By hand, head_dim
# 64, 3 bits, 1000 tokens: keys 288 (levels + per-channel thresholds) + 128 (sink) + 999 x (24 codes
# + 2 count + 4 x 0.64 outliers), values 32 + 128 + 999 x (24 + 2 + 8 range/offset + 2 x 4
# outliers): 71065.44 bytes, 71.06544 a token.
nuq_b=$("$AKV" plan --layers 1 --kv-heads 1 --head-dim 64 --context 1000 --methods nuq --json |
  "$PY" -c 'import json, sys; print(round(json.load(sys.stdin)["methods"][0]["device_bytes_per_token"], 6))')
expect_equal "plan: nuq without calibration= counts KVQuant's defaults" "$nuq_b" "71.06544"
# TurboQuant presets keep vLLM's boundary layers in f16 (the first and last 2): of 6 layers, 4
# cost none's f16 rows and 2 the quantized rows of boundary=0.
tq=$("$AKV" plan --layers 6 --kv-heads 1 --head-dim 128 --context 4096 --json \
  --methods none,turboquant_4bit_nc,turboquant_4bit_nc:boundary=0 |
  "$PY" -c 'import json, sys
r = {m["method"]: m["device_bytes_per_token"] for m in json.load(sys.stdin)["methods"]}
n, b, b0 = r["none"], r["turboquant_4bit_nc"], r["turboquant_4bit_nc:boundary=0"]
print(n == 3072 and b0 < n and abs(b - (4 * n / 6 + 2 * b0 / 6)) <= 1e-9 * b)')
expect_equal "plan: TurboQuant's boundary layers cost f16 rows" "$tq" "True"
cp "$cal" "$TMP/cal_copy.json"
expect_error "plan: the output is a method's calibration" 1 "output is an input" \
  "$AKV" plan --layers 2 --kv-heads 2 --head-dim 32 --methods "nuq:calibration=$TMP/cal_copy.json" -o "$TMP/cal_copy.json"
expect_error "plan: unknown tiered preset" 2 "unknown tiered preset" \
  "$AKV" plan --layers 2 --kv-heads 2 --head-dim 64 --methods tiered:preset=huge
# A model file instead of a config: a GGUF plans the shape of its Hugging Face directory (the same
# KV bytes), its weights as `akv info` counts them: f32 as stored, where the config's count is 2
# bytes a parameter of the Llama architecture (without Qwen3's q/k norms: 2 layers x 2 x 32).
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/q3" --dim 64 --hidden 96 --vocab 64 --heads 4 --kv-heads 2 --layers 2 --seed 3 \
  --qwen3 --head-dim 32 --gguf "$TMP/q3.gguf"
"$AKV" info --json "$TMP/q3.gguf" >"$TMP/q3-info.json"
same=$(for m in "$TMP/q3" "$TMP/q3.gguf"; do
  "$AKV" plan --config "$m" --json --methods none,kivi-2,nuq,snapkv:budget=0.3 || echo failed; done |
  "$PY" -c 'import json, sys
a, b = (json.loads(t) for t in sys.stdin.read().replace("}\n{", "}\x00{").split("\x00"))
rows = lambda j: [(m["method"], m["device_bytes_per_token"]) for m in j["methods"]]
w = json.load(open(sys.argv[1]))["akv"]["weight_bytes"]
print(rows(a) == rows(b) and (a["layers"], a["kv_heads"], a["head_dim"]) == (b["layers"], b["kv_heads"], b["head_dim"]) == (2, 2, 32)
      and b["weight_bytes"] == w == 4 * (a["weight_bytes"] // 2 + 128))' "$TMP/q3-info.json")
expect_equal "plan --config a GGUF: its directory's KV bytes, its stored weights" "$same" "True"
# stories260K (llama2.c, f32, shared classifier): 512 x 64 embeddings, 5 layers of 2 norms of 64,
# wq and wo 64 x 64, wk and wv 32 x 64, w1 w2 w3 172 x 64, a final norm: 260032 parameters, 4 bytes each.
M="${AKV_SHARED_DIR:-$SRC/../shared}/models/stories260K.bin"
if [[ -f $M ]]; then
  expect "plan --config a llama2.c checkpoint" 0 '"weight_bytes": 1040128' "$AKV" plan --config "$M" --json --methods none
  expect_output "plan of a llama2.c checkpoint: its shape" '"kv_heads": 4'
  head -c 1000 "$M" >"$TMP/short.bin"
  expect_error "plan: a truncated checkpoint" 2 "short.bin" "$AKV" plan --config "$TMP/short.bin"
fi
expect_error "plan: bytes per parameter of a model file" 1 "is for a config.json .*--weight-bytes-per-param = 2" \
  "$AKV" plan --config "$TMP/q3.gguf" --weight-bytes-per-param 2
finish
