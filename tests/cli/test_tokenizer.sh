#!/usr/bin/env bash
# Text through a byte-level BPE tokenizer.json: a Hugging Face directory's tokenizer.json is found
# by itself, BOS first (Llama 3 layout) or none (Qwen2 layout), and the chunk count follows the
# golden token counts of data/golden/bpe (Hugging Face tokenizers' own encodings).
source "$(dirname "$0")/lib.sh"
need_python_h5py
G="$SRC/data/golden/bpe"
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/hf" --dim 16 --hidden 32 --vocab 658 --heads 2 --kv-heads 1 --layers 1 --seed 3 --scale 0.3
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
