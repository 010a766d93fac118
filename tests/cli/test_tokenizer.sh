#!/usr/bin/env bash
# Text through a byte-level BPE tokenizer.json: a Hugging Face directory's tokenizer.json is found
# by itself, BOS first (Llama 3 layout) or none (Qwen2 layout), and the chunk count follows the
# golden token counts of data/golden/bpe (Hugging Face tokenizers' own encodings).
source "$(dirname "$0")/lib.sh"
need_python_h5py
G="$SRC/data/golden/bpe"
"$PY" - "$TMP/hf" <<'PY'
import json, struct, sys
from pathlib import Path
import numpy as np
d = Path(sys.argv[1]); d.mkdir()
DIM, HID, V = 16, 32, 658
cfg = {"model_type": "llama", "hidden_size": DIM, "intermediate_size": HID, "num_hidden_layers": 1,
       "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": V, "max_position_embeddings": 256,
       "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
(d / "config.json").write_text(json.dumps(cfg))
rng = np.random.default_rng(3)
shapes = {"model.embed_tokens.weight": (V, DIM), "model.norm.weight": (DIM,),
          "model.layers.0.input_layernorm.weight": (DIM,), "model.layers.0.post_attention_layernorm.weight": (DIM,),
          "model.layers.0.self_attn.q_proj.weight": (DIM, DIM), "model.layers.0.self_attn.k_proj.weight": (8, DIM),
          "model.layers.0.self_attn.v_proj.weight": (8, DIM), "model.layers.0.self_attn.o_proj.weight": (DIM, DIM),
          "model.layers.0.mlp.gate_proj.weight": (HID, DIM), "model.layers.0.mlp.up_proj.weight": (HID, DIM),
          "model.layers.0.mlp.down_proj.weight": (DIM, HID)}
header, blob = {}, b""
for name, shape in shapes.items():
    data = (rng.standard_normal(shape) * 0.3).astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
    blob += data
text = json.dumps(header).encode()
(d / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + blob)
PY
cp "$G/llama3-tokenizer.json" "$TMP/hf/tokenizer.json"
# Text 2 of golden.json: its Llama 3 token count + BOS, and its Qwen2 count (no BOS), in chunks of 5.
"$PY" -c "import json, sys; sys.stdout.write(json.load(open(sys.argv[1]))['texts'][2])" "$G/golden.json" >"$TMP/t.txt"
count() { "$PY" -c "import json, sys; print(len(json.load(open(sys.argv[1]))['tokenizers'][sys.argv[2]]['cases'][2]['ids']))" "$G/golden.json" "$1"; }
n3=$(count llama3) nq=$(count qwen2)
expect "golden text 2 has tokens" 0 "^[1-9][0-9]*$" echo "$n3"
expect "tokenizer.json of the model directory, BOS first" 0 "^$(((n3 + 1) / 5)) sequences" \
  "$AKV" evaluate -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 5 --methods kivi-4
expect "--tokenizer FILE.json without BOS (Qwen2 layout)" 0 "^$((nq / 5)) sequences" \
  "$AKV" evaluate -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 5 --tokenizer "$G/qwen2-tokenizer.json"
expect "dump --text through the tokenizer.json" 0 "" \
  "$AKV" dump -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 8 --line 2 --window 4 -o "$TMP/d.h5"
expect "passkey text mode through tokenizer.json" 0 "passkey \\(text mode\\)" \
  "$AKV" evaluate -q --model "$TMP/hf" --task passkey --lengths 200 --depths 0.5 --trials 1 --methods kivi-4
mkdir -p "$TMP/none"
echo '{"model": {"type": "WordPiece"}}' >"$TMP/wp.json"
expect_error "a WordPiece tokenizer.json is refused" 2 "model.type = WordPiece" \
  "$AKV" evaluate -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 8 --tokenizer "$TMP/wp.json" -o "$TMP/none/x.txt"
expect_empty_dir "no output after errors" "$TMP/none"
finish
