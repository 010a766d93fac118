#!/usr/bin/env node
// Reference encodings of data/golden/bpe/*-tokenizer.json by Hugging Face tokenizers (the Rust
// library, 0.22.2, through its Node binding @anush008/tokenizers 0.6.0), for
// tests/unit/test_bpe.cpp. Outside the build: needs node and that package.
//
//   (cd /tmp/t && npm install @anush008/tokenizers@0.6.0)
//   NODE_PATH=/tmp/t/node_modules node scripts/dev/golden/bpe_ids.mjs
import { createRequire } from "module";
import { readFileSync, writeFileSync } from "fs";
import { dirname, join } from "path";
import { fileURLToPath } from "url";

const require = createRequire(process.env.NODE_PATH ? join(process.env.NODE_PATH, "x.js") : import.meta.url);
const { Tokenizer } = require("@anush008/tokenizers");
const dir = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "data", "golden", "bpe");

const texts = [
  "",
  "Hello world",
  "The KV cache, not the weights, fills the accelerator.",
  "I'm sure they'LL say it's 'quoted' and DON'T",
  "1234567 + 89 = 1234656; pi ~ 3.14159",
  "  leading spaces, trailing   ",
  "tabs\tand\nnew\n\nlines\r\n  indented\n",
  "naïve café résumé — “smart quotes”",
  "日本語のテキスト と 中文 混合",
  "emoji 🙂👍🏽 and symbols ∑∫√",
  "e\u0301 (e + combining acute) vs \u00e9",
  "<|begin_of_text|>special <|end_of_text|> tokens<|endoftext|><|im_start|>",
  "x".repeat(40) + " " + " ".repeat(17) + "end",
  "```cpp\nint main() { return 0; }\n```",
  "<s>begins</s> with <unk> pieces",
  " two  spaces and a trailing one ",
  "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
  "a\n\n\nb    c\t\td \n \n",
  "literal \u2581\u2581 pieces and <table> tags",
];

const out = {
  reference: "Hugging Face tokenizers 0.22.2 (Rust) via @anush008/tokenizers 0.6.0, encode without special tokens added",
  texts,
  tokenizers: {},
};
for (const kind of ["llama3", "gpt2", "qwen2", "spm", "metaspace", "gemma"]) {
  const tok = Tokenizer.fromFile(join(dir, `${kind}-tokenizer.json`));
  const cases = [];
  for (const t of texts) {
    const enc = await tok.encode(t, null, { addSpecialTokens: false });
    const ids = enc.getIds();
    cases.push({ ids, decoded: await tok.decode(ids, false) });
  }
  const withBos = await tok.encode("Hello world", null, { addSpecialTokens: true });
  out.tokenizers[kind] = { cases, hello_with_specials: withBos.getIds() };
}
writeFileSync(join(dir, "golden.json"), JSON.stringify(out, null, 1) + "\n");
console.log("wrote", join(dir, "golden.json"));
