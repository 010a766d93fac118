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
# Gemma's two spellings of one vocabulary: the tokenizer.json of a model directory (Hugging Face
# tokenizers' ids) and the GGUF lists llama.cpp's converter writes (llama.cpp's ids: user-defined
# pieces taken whole, control pieces left to the text, no space prefix). The dump of a text chunk of
# exactly BOS + its tokens stores the ids akv used.
"$PY" "$SRC/tests/cli/tiny_hf.py" "$TMP/gemma" --dim 16 --hidden 32 --vocab 700 --heads 2 --kv-heads 1 --layers 2 \
  --seed 3 --gemma3 --pattern 2 --gguf "$TMP/gemma.gguf" --spm-vocab "$G/gemma-gguf.json"
cp "$G/gemma-tokenizer.json" "$TMP/gemma/tokenizer.json"
for i in 6 12 16 17 18; do
  for form in tokenizer.json gguf; do
    model=$TMP/gemma
    want=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['tokenizers']['gemma']['cases'][int(sys.argv[2])]['ids'])" "$G/golden.json" "$i")
    if [[ $form == gguf ]]; then
      model=$TMP/gemma.gguf
      want=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['ids'][int(sys.argv[2])])" "$G/gemma-gguf.json" "$i")
    fi
    "$PY" -c "import json, sys; sys.stdout.write(json.load(open(sys.argv[1]))['texts'][int(sys.argv[2])])" "$G/golden.json" "$i" >"$TMP/g$i.txt"
    n=$("$PY" -c "print(len($want) + 1)")
    run "$AKV" dump -q --model "$model" --text "$TMP/g$i.txt" --ctx "$n" --window 2 -o "$TMP/g.h5"
    got=$("$PY" -c "import h5py, sys; print([int(t) for t in h5py.File(sys.argv[1])['tokens'][1:]])" "$TMP/g.h5")
    expect_equal "Gemma $form, golden text $i: the reference's ids" "$got" "$want"
  done
done
mkdir -p "$TMP/none"
echo '{"model": {"type": "WordPiece"}}' >"$TMP/wp.json"
expect_error "a WordPiece tokenizer.json is refused" 2 "model.type = WordPiece" \
  "$AKV" evaluate -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 8 --tokenizer "$TMP/wp.json" -o "$TMP/none/x.txt"
"$PY" -c "import sys; open(sys.argv[1], 'w').write('{\"model\": {\"type\": \"BPE\", \"vocab\": ' + '[' * 100000 + ']' * 100000 + '}}')" "$TMP/deep.json"
expect_error "a tokenizer.json nested 100000 deep is refused at the parser" 2 "deeper than 64 levels .*deep.json" \
  "$AKV" evaluate -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 8 --tokenizer "$TMP/deep.json" -o "$TMP/none/x.txt"
# A pre-tokenizer regex whose lookahead scans to the end of the text (quadratic in it) is refused
# once it has read 1024 bytes per byte of the text, in well under a second on 200 KB (it took ~10 s
# before the budget); the bundled patterns' splits are unchanged (test_bpe).
"$PY" - "$G/llama3-tokenizer.json" "$TMP/quad.json" "$TMP/aaa.txt" <<'PYEOF'
import json, sys
t = json.load(open(sys.argv[1]))
t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a(?=[^x]*x)"
json.dump(t, open(sys.argv[2], "w"))
open(sys.argv[3], "w").write("a" * 200000 + "x")
PYEOF
expect_error "a quadratic pre-tokenizer regex is refused by the matching budget" 2 \
  "reads more than 1024 bytes per byte of the 200001-byte text .*pre_tokenizer pattern = a\\(\\?=" \
  "$AKV" evaluate -q --model "$TMP/hf" --text "$TMP/aaa.txt" --ctx 8 --tokenizer "$TMP/quad.json" -o "$TMP/none/x.txt"
# Outputs onto the run's side inputs are refused before anything runs (exit 1), the inputs intact.
cp "$TMP/t.txt" "$TMP/t-copy.txt"
echo '{}' >"$TMP/cal.json"
for target in "$TMP/t.txt" "$TMP/hf/tokenizer.json" "$TMP/hf/config.json" "$TMP/wp.json" "$TMP/cal.json"; do
  expect_error "evaluate -o onto an input ($(basename "$target"))" 1 "output is an input file" \
    "$AKV" evaluate -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 5 --tokenizer "$TMP/wp.json" \
    --methods "kivi-4:calibration=$TMP/cal.json" -o "$target"
done
expect_error "dump -o onto the model directory's tokenizer" 1 "output is an input file" \
  "$AKV" dump -q --model "$TMP/hf" --text "$TMP/t.txt" --ctx 8 --window 4 -o "$TMP/hf/tokenizer.json"
expect_error "bench decode -o onto a method's calibration file" 1 "output is an input file" \
  "$AKV" bench decode --model "$TMP/hf" --tokens "$TMP/t.txt" --methods "kivi-4:calibration=$TMP/cal.json" -o "$TMP/cal.json"
if cmp -s "$TMP/t.txt" "$TMP/t-copy.txt" && cmp -s "$G/llama3-tokenizer.json" "$TMP/hf/tokenizer.json" &&
   [[ $(cat "$TMP/cal.json") == "{}" ]]; then
  pass "the inputs are intact"
else
  fail "the inputs are intact"
fi
expect_empty_dir "no output after errors" "$TMP/none"
finish
