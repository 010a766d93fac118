#!/usr/bin/env bash
# Writes data/golden/bpe/gemma-gguf.json: the Gemma-style test vocabulary (gemma-tokenizer.model)
# as llama.cpp's own converter writes it into a GGUF (user-defined pieces typed 4 with their
# U+2581 turned into spaces, control pieces 3, scores -1000 for both, add_space_prefix false), and
# llama.cpp's token ids for the texts of golden.json (llama_tokenize.cpp: no special-token parsing,
# as llama-perplexity). Outside the build: needs a llama.cpp checkout built with libllama, and
# the converter's Python imports (numpy, torch, sentencepiece; stand-ins on PYTHONPATH for what
# Debian lacks, see docs/model.md).
#
#   scripts/dev/golden/gemma_gguf_ids.sh LLAMA_CPP_DIR LLAMA_CPP_BUILD_DIR
set -euo pipefail
LC=$1 BUILD=$2
SRC=$(cd "$(dirname "$0")/../../.." && pwd)
G=$SRC/data/golden/bpe
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=${PYTHON:-/usr/bin/python3}
"$PY" "$SRC/tests/cli/tiny_hf.py" "$T/hf" --dim 64 --hidden 128 --vocab 700 --heads 2 --kv-heads 1 --layers 2 \
  --head-dim 32 --gemma3 --pattern 2 --window 16 --seed 7 >/dev/null
cp "$G/gemma-tokenizer.model" "$T/hf/tokenizer.model"
cp "$G/gemma-tokenizer.json" "$T/hf/tokenizer.json"
# The repository files a Gemma checkpoint ships beside them: architectures, and tokenizer_config.json
# whose added_tokens_decoder tells the converter which pieces are control and which user-defined.
"$PY" - "$T/hf" "$G/gemma-tokenizer.json" <<'PYEOF'
import json, sys
d, tj = sys.argv[1], json.load(open(sys.argv[2]))
c = json.load(open(f"{d}/config.json"))
c["architectures"] = ["Gemma3ForCausalLM"]
json.dump(c, open(f"{d}/config.json", "w"))
dec = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
       for a in tj["added_tokens"]}
json.dump({"added_tokens_decoder": dec, "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
           "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "tokenizer_class": "GemmaTokenizer"},
          open(f"{d}/tokenizer_config.json", "w"), ensure_ascii=False)
PYEOF
"$PY" "$LC/convert_hf_to_gguf.py" "$T/hf" --outtype f32 --outfile "$T/g.gguf" >/dev/null 2>&1
g++ -O1 -std=c++17 -I"$LC/include" -I"$LC/ggml/include" "$SRC/scripts/dev/golden/llama_tokenize.cpp" \
  -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin" -o "$T/llama_tokenize"
"$PY" - "$T" "$G" "$LC" "$(git -C "$LC" rev-parse --short HEAD)" <<'PYEOF'
import json, subprocess, sys
t, g, lc, commit = sys.argv[1:]
sys.path.insert(0, f"{lc}/gguf-py")
import gguf
r = gguf.GGUFReader(f"{t}/g.gguf")
def field(k):
    return r.fields[k].contents() if k in r.fields else None
texts = json.load(open(f"{g}/golden.json"))["texts"]
run = subprocess.run([f"{t}/llama_tokenize", f"{t}/g.gguf"], input="".join(x.encode().hex() + "\n" for x in texts),
                     capture_output=True, text=True, check=True)
out = {"reference": f"llama.cpp {commit}: convert_hf_to_gguf.py on gemma-tokenizer.model + tokenizer_config.json, "
                    "llama_tokenize(add_special false, parse_special false)",
       "tokens": field("tokenizer.ggml.tokens"), "scores": field("tokenizer.ggml.scores"),
       "token_type": field("tokenizer.ggml.token_type"), "bos_token_id": field("tokenizer.ggml.bos_token_id"),
       "unknown_token_id": field("tokenizer.ggml.unknown_token_id"),
       "add_space_prefix": field("tokenizer.ggml.add_space_prefix"),
       "ids": [json.loads(line) for line in run.stdout.splitlines()]}
assert len(out["ids"]) == len(texts)
open(f"{g}/gemma-gguf.json", "w").write(json.dumps(out, ensure_ascii=False) + "\n")
print("wrote", f"{g}/gemma-gguf.json")
PYEOF
