#!/usr/bin/env bash
# The constructed retrieval model (scripts/make_retrieval_model, docs/retrieval_model.md): written
# the same bytes twice; through akv (Hugging Face directory and GGUF) it retrieves every text-mode
# passkey with the full cache. Two outcomes the mechanism fixes: StreamingLLM at budget 0.1 keeps 4
# sink tokens and the last 98, so it loses every needle but the one just before the question;
# H2O keeps the tokens with the most attention summed over the prompt, which the repeated filler
# collects (each filler span is attended by its next repetition) and the needle does not; SnapKV
# keeps the needle only when the question is compressed with the context. RULER's needle tasks
# (--task ruler) with the full cache.
source "$(dirname "$0")/lib.sh"
if ! "$PY" -c "import numpy" 2>/dev/null; then
  echo "SKIP: $PY cannot import numpy (scripts/setup installs python3-numpy)"
  exit 77
fi
M="$TMP/m"
expect "make_retrieval_model writes the model" 0 "retrieval.gguf" "$PY" "$SRC/scripts/make_retrieval_model" "$M"
"$PY" "$SRC/scripts/make_retrieval_model" "$TMP/m2" >/dev/null
if cmp -s "$M/model.safetensors" "$TMP/m2/model.safetensors" && cmp -s "$M/retrieval.gguf" "$TMP/m2/retrieval.gguf" &&
   cmp -s "$M/config.json" "$TMP/m2/config.json"; then
  pass "the same bytes on a second run"
else
  fail "the same bytes on a second run"
fi
rm -rf "$TMP/m2"
# accuracy FILE METHOD: the method's accuracy per cell, as "depth:accuracy" words.
accuracy() {
  "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
m = [x for x in r["methods"] if x["method"] == sys.argv[2]][0]
print(" ".join(f"{d:g}:{row[0]:g}" for d, row in zip(r["depths"], m["accuracy"])))
PYEOF
}
# expect_equal NAME GOT WANT
expect "passkey (text mode) through the Hugging Face directory" 0 "" \
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0,0.5,1 --trials 2 \
  --methods streamingllm:budget=0.1,h2o:budget=0.3 --json -o "$TMP/hf.json"
expect_equal "full cache: every passkey" "$(accuracy "$TMP/hf.json" full)" "0:1 0.5:1 1:1"
expect_equal "streamingllm budget 0.1: only the needle next to the question survives" \
  "$(accuracy "$TMP/hf.json" streamingllm:budget=0.1)" "0:0 0.5:0 1:1"
expect_equal "h2o budget 0.3: the filler outscores the needle at every depth" \
  "$(accuracy "$TMP/hf.json" h2o:budget=0.3)" "0:0 0.5:0 1:0"
# The key's log-probability: near 0 with the full cache (the model copies it with a margin of
# ~9 nats), far below it where a method lost the needle.
lp=$("$PY" -c 'import json,sys; m={x["method"]: x for x in json.load(open(sys.argv[1]))["methods"]}
print(m["full"]["mean_key_logprob"] > -1e-3, m["streamingllm:budget=0.1"]["mean_key_logprob"] < -1, m["full"]["bits_per_element"])' "$TMP/hf.json")
expect_equal "key log-probability near 0 with the full cache, far below where the needle is lost; 32 bits" "$lp" "True True 32.0"
# Query-agnostic: SnapKV's window (the context's last tokens, filler) does not attend to the
# needle, so at budget 0.5 it keeps it only where the question asks for it (query-aware).
expect "passkey --query-agnostic" 0 "" \
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0,0.5 --trials 1 \
  --methods snapkv:budget=0.5 --query-agnostic --json -o "$TMP/agnostic.json"
expect "passkey query-aware (default)" 0 "" \
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0,0.5 --trials 1 \
  --methods snapkv:budget=0.5 --json -o "$TMP/aware.json"
expect_equal "query-agnostic: the full cache still retrieves" "$(accuracy "$TMP/agnostic.json" full)" "0:1 0.5:1"
expect_equal "query-agnostic: snapkv 0.5 loses the needle" "$(accuracy "$TMP/agnostic.json" snapkv:budget=0.5)" "0:0 0.5:0"
expect_equal "query-aware: snapkv 0.5 keeps it" "$(accuracy "$TMP/aware.json" snapkv:budget=0.5)" "0:1 0.5:1"
# kvpress's query-free scorers run in the decode loop (one prefill, a lane each).
expect "passkey --query-agnostic: knorm, keydiff, tova, lagkv, expected-attention" 0 "" \
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0.5 --trials 1 --query-agnostic \
  --methods knorm:budget=0.5,keydiff:budget=0.5,tova:budget=0.5,lagkv:budget=0.5,expected-attention:budget=0.5 \
  --json -o "$TMP/free.json"
expect_equal "query-free scorers: one result each" "$("$PY" -c 'import json,sys; print(*[m["method"].split(":")[0] for m in json.load(open(sys.argv[1]))["methods"]])' "$TMP/free.json")" \
  "full knorm keydiff tova lagkv expected-attention"
# KVzip's reconstruction pass makes the induction heads copy the context: the positions retrieval
# needs are the ones it attends to, so a quarter of the cache keeps every needle without the
# question (docs/retrieval_model.md).
expect "passkey --query-agnostic: kvzip, duo (KVzip's head scores)" 0 "" \
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0,0.5 --trials 1 --query-agnostic \
  --methods kvzip:budget=0.25,duo:budget=0.6 --json -o "$TMP/kvzip.json"
expect_equal "kvzip 0.25, question decoded after compression: every needle" "$(accuracy "$TMP/kvzip.json" kvzip:budget=0.25)" "0:1 0.5:1"
# duo at 0.6: 3 of the 8 heads keep all 1024 tokens (round(8 x (614 - 384) / 640)), chosen by their
# best reconstruction score (at 0.45 one head keeps all: every needle lost).
expect_equal "duo 0.6 (KVzip head scores): every needle" "$(accuracy "$TMP/kvzip.json" duo:budget=0.6)" "0:1 0.5:1"
# duo with calibrated head scores (heads=): `akv calibrate` on dumps of two of akv's own text
# passkey prompts of 1024 tokens (`akv dump --passkey`, other seeds and depths than the test's)
# measures each head's attention error as a streaming head; the question's queries read the
# needle through layer 1's heads, so those score high and layer 0's (local) near 0; at 0.6 the 3
# best keep all and every needle survives.
expect "dump --passkey: a text passkey prompt, up to its question" 0 "1024 tokens, 32 window queries" \
  "$AKV" dump --model "$M" --passkey 1024 --depth 0.3 --seed 5 -o "$TMP/pk1.h5"
"$AKV" -q dump --model "$M" --passkey 1024 --depth 0.7 --seed 6 -o "$TMP/pk2.h5"
expect_error "dump --passkey too short for the prompt" 2 "--passkey = 10" \
  "$AKV" -q dump --model "$M" --passkey 10 -o "$TMP/pk_short.h5"
expect "calibrate on passkey dumps: DuoAttention head scores" 0 "" \
  "$AKV" -q calibrate "$TMP/pk1.h5" "$TMP/pk2.h5" -o "$TMP/pk_calib.json"
expect_equal "duo scores: layer 1's heads (reading the needle) above layer 0's" "$("$PY" -c 'import json,sys
c = json.load(open(sys.argv[1])); e = [[h["duo_error"] for h in l["heads"]] for l in c["layers"]]
print(max(e[0]) < 0.01, min(e[1]) > 0.5)' "$TMP/pk_calib.json")" "True True"
expect "passkey --query-agnostic: duo with calibrated heads" 0 "" \
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0,0.5 --trials 1 --query-agnostic \
  --methods "duo:budget=0.6:heads=$TMP/pk_calib.json,duo:budget=0.45:heads=$TMP/pk_calib.json" --json -o "$TMP/duo.json"
expect_equal "duo 0.6 (calibrated heads): every needle" "$(accuracy "$TMP/duo.json" "duo:budget=0.6:heads=$TMP/pk_calib.json")" "0:1 0.5:1"
expect_equal "duo 0.45 (one head keeps all): the needles lost" "$(accuracy "$TMP/duo.json" "duo:budget=0.45:heads=$TMP/pk_calib.json")" "0:0 0.5:0"
printf '1 2 3 4 5 6 7 8 9 10\n' >"$TMP/t10.txt"
# Three kvzip methods in one run, other sinks and KVzip+ (plus=on): each scored with its own
# reconstruction (the sinks are in its softmax, KVzip+ weighs it), as when run alone.
"$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0.5 --trials 1 --query-agnostic \
  --methods kvzip:budget=0.1,kvzip:budget=0.1:sinks=0,kvzip:budget=0.1:plus=on --json -o "$TMP/kvzip2.json"
for k in kvzip:budget=0.1:sinks=0 kvzip:budget=0.1:plus=on; do
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --depths 0.5 --trials 1 --query-agnostic \
    --methods "$k" --json -o "$TMP/kvzip0.json"
  same=$("$PY" -c 'import json,sys; k=sys.argv[3]; f=lambda p: [m for m in json.load(open(p))["methods"] if m["method"] == k][0]
print(f(sys.argv[1]) == f(sys.argv[2]))' "$TMP/kvzip2.json" "$TMP/kvzip0.json" "$k")
  expect_equal "$k beside kvzip: as when run alone" "$same" "True"
done
expect_error "kvzip needs the tokenizer for its repeat prompt" 1 "repeat prompt" \
  "$AKV" -q evaluate --model "$M" --tokens "$TMP/t10.txt" --methods kvzip:budget=0.5
expect_error "--query-agnostic needs --task passkey" 1 "--query-agnostic needs --task passkey" \
  "$AKV" -q evaluate --model "$M" --task ruler --lengths 1024 --query-agnostic
expect "passkey (text mode) through the GGUF file" 0 "" \
  "$AKV" -q evaluate --model "$M/retrieval.gguf" --task passkey --lengths 1024 --depths 0,0.5,1 --trials 1 --json -o "$TMP/gguf.json"
expect_equal "GGUF, full cache: every passkey" "$(accuracy "$TMP/gguf.json" full)" "0:1 0.5:1 1:1"
# RULER's needle tasks (noise, essay and needle haystacks; number and uuid values), the prompt
# ending with the needle's own words: the full cache answers every one.
expect "ruler needle tasks, answer prefix restate" 0 "" \
  "$AKV" -q evaluate --model "$M" --task ruler --tasks niah_single_1,niah_single_3,niah_multikey_2,niah_multikey_3 \
  --lengths 1024 --samples 2 --answer-prefix restate --answer-tokens 40 --json -o "$TMP/ruler.json"
scores=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["format"], r["methods"][0]["method"], *[row[0] for row in r["methods"][0]["score"]])' "$TMP/ruler.json")
expect_equal "ruler, full cache: every needle" "$scores" "akv-ruler full 100.0 100.0 100.0 100.0"
expect "ruler --ratios: eviction methods at budget 1 - ratio, a leaderboard" 0 "leaderboard" \
  "$AKV" -q evaluate --model "$M" --task ruler --tasks niah_single_1 --lengths 1024 --samples 1 --answer-tokens 12 \
  --answer-prefix restate --methods streamingllm,kivi-2 --ratios 0.5,0.75
ratios=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(*[m["ratio"] for m in r["methods"]])' \
  <("$AKV" -q evaluate --model "$M" --task ruler --tasks niah_single_1 --lengths 1024 --samples 1 --answer-tokens 12 \
    --methods streamingllm,kivi-2 --ratios 0.5,0.75 --json))
expect_equal "ruler --ratios: methods and ratios in the JSON" "$ratios" "None 0.5 0.75 None"
# Needle depths: the full cache and kivi-2 find the needle at every depth.
heat=$("$AKV" -q evaluate --model "$M" --task ruler --tasks niah_single_1 --lengths 1024 --depths 0,0.5,1 --samples 1 \
  --answer-tokens 40 --answer-prefix restate --methods kivi-2 --json |
  "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(r["depths"], *[m["depth_score"][0] for m in r["methods"]])')
expect_equal "ruler --depths: full and kivi-2 at every depth (the heatmap's JSON)" "$heat" \
  "[0.0, 0.5, 1.0] [[100.0], [100.0], [100.0]] [[100.0], [100.0], [100.0]]"
expect_error "ruler --depths: only needle tasks" 2 "--tasks = vt" \
  "$AKV" -q evaluate --model "$M" --task ruler --tasks vt --lengths 1024 --depths 0.5
expect_error "--ratios needs --task ruler" 1 "--ratios" \
  "$AKV" -q evaluate --model "$M" --task passkey --lengths 1024 --methods snapkv --ratios 0.5
expect_error "a ratio of 1 is refused" 2 "--ratios = 1" \
  "$AKV" -q evaluate --model "$M" --task ruler --lengths 1024 --methods snapkv --ratios 1
expect_error "ruler: an unknown task is refused by name" 2 "--tasks = qa_1" \
  "$AKV" -q evaluate --model "$M" --task ruler --tasks qa_1 --lengths 1024
expect_error "ruler: a length too short for the task is refused" 2 "--lengths = 64" \
  "$AKV" -q evaluate --model "$M" --task ruler --tasks cwe --lengths 64 -o "$TMP/short.txt"
if [[ -e $TMP/short.txt ]]; then fail "no partial report"; else pass "no partial report"; fi
finish
