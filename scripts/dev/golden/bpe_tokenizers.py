#!/usr/bin/env python3
"""Writes the BPE test tokenizers of data/golden/bpe/ (tokenizer.json as Hugging Face tokenizers
saves it), in the layouts akv reads: byte-level Llama 3 (Split with its regex, then ByteLevel
without regex; ignore_merges; <|begin_of_text|> added by the post-processor), GPT-2 (ByteLevel
with its built-in regex) and Qwen2 (NFC normalizer, Split with its regex, no BOS), sharing one
vocabulary (the 256 byte symbols, then MERGES merges); and the SentencePiece-style BPE of
Mistral/TinyLlama (normalizer Prepend and Replace with U+2581, no pre-tokenizer, byte fallback to
<0xXX> pieces, <s> first) in two spellings: as older files write it (spm) and with the Metaspace
pre-tokenizer of newer ones (metaspace); and Gemma's: a SentencePiece BPE model trained here by
libsentencepiece with Gemma's settings (no dummy prefix, identity normalization, byte fallback, digits
split, user-defined pieces such as "\n\n" and U+2581 U+2581; gemma-tokenizer.model) and the
tokenizer.json that transformers' GemmaConverter makes of it (normalizer Replace " " -> U+2581 alone,
Split " " merged with the previous piece, merges from the pieces' scores, "\t" for <0x09>, control and
user-defined pieces as added tokens; a transcription of that converter, v4.5x, as transformers cannot be
installed here). Merges are learned here from the repository's docs (as of
commit CORPUS_COMMIT) by plain pair counting; they are only data: how a text is encoded is decided by the reference,
scripts/dev/golden/bpe_ids.mjs, which runs Hugging Face tokenizers.

  /usr/bin/python3 scripts/dev/golden/bpe_tokenizers.py
"""
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "data" / "golden" / "bpe"
MERGES = 400
CORPUS_COMMIT = "63c8d3d"  # the docs/*.md of this commit are the training text (stable across edits)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bos_template(token, token_id):
    """The TemplateProcessing post-processor that puts `token` first (Hugging Face's single and pair
    templates)."""
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": token, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {token: {"id": token, "ids": [token_id], "tokens": [token]}}}


def learn_merges(words, split, allowed, on_merge=lambda a, b: None):
    """MERGES times: merge the most frequent adjacent pair with allowed(a, b) in every word."""
    merges = []
    for _ in range(MERGES):
        pairs = collections.Counter()
        for w, n in words.items():
            s = split[w]
            for a, b in zip(s, s[1:]):
                if allowed(a, b):
                    pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        on_merge(a, b)
        for w in words:
            s, out, i = split[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            split[w] = out
    return merges


def learn(text):
    enc = bytes_to_unicode()
    words = collections.Counter(re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", text))
    split = {w: [enc[b] for b in w.encode()] for w in words}
    merges = learn_merges(words, split, lambda a, b: True)
    vocab = {}
    for b in range(256):
        vocab[enc[b]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    return vocab, merges


def tokenizer(vocab, merges, kind):
    n = len(vocab)
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": kind == "llama3", "vocab": vocab, "merges": [[a, b] for a, b in merges]}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": kind == "gpt2"}
    if kind == "gpt2":
        pre = byte_level
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3 if kind == "llama3" else QWEN2}, "behavior": "Isolated",
             "invert": False}, byte_level]}
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] if kind == "llama3" else ["<|endoftext|>", "<|im_start|>"]
    added = [{"id": n + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, s in enumerate(specials)]
    post = None
    if kind == "llama3":
        post = bos_template(specials[0], n)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "NFC"} if kind == "qwen2" else None, "pre_tokenizer": pre, "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": model}


def learn_spm(text):
    """<unk> <s> </s>, the 256 <0xXX> pieces, the corpus' characters (ASCII ones and a few others;
    the rest go through byte fallback), then merges over U+2581-joined words."""
    words = collections.Counter(re.findall(r"[^ \n]+", text))
    split = {w: list("\u2581" + w) for w in words}
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    chars = sorted({c for w in split.values() for c in w if ord(c) < 128} | set("\u2581éü—"))
    for c in chars:
        vocab.setdefault(c, len(vocab))
    merges = learn_merges(words, split, lambda a, b: a in vocab and b in vocab,
                          lambda a, b: vocab.setdefault(a + b, len(vocab)))
    return vocab, merges


def spm_tokenizer(vocab, merges, kind):
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
             "vocab": vocab, "merges": [[a, b] for a, b in merges]}
    added = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in ("<unk>", "<s>", "</s>")]
    if kind == "spm":
        normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                          {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        pre = None
    else:
        normalizer = None
        pre = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    post = bos_template("<s>", 1)
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": pre, "post_processor": post, "decoder": decoder, "model": model}


GEMMA_USER = ["<start_of_turn>", "<end_of_turn>", "\n", "\n\n", "\u2581\u2581", "\u2581\u2581\u2581", "<table>"]
GEMMA_SPECIAL = {"<start_of_turn>", "<end_of_turn>"}  # user-defined pieces GemmaConverter marks special


def train_gemma(text, path):
    """A SentencePiece BPE model with the trainer settings of Gemma's tokenizer.model (ids 0-3
    <pad> <eos> <bos> <unk>, <mask> a control piece, then the user-defined pieces, the 256 byte
    pieces, the merges). One thread and relative file names (the model records them): the same
    bytes on every run."""
    import os
    import sentencepiece as spm
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "corpus.txt").write_text(text)
        cwd = os.getcwd()
        os.chdir(d)
        spm.SentencePieceTrainer.train(
            input="corpus.txt", model_prefix="gemma", model_type="bpe", vocab_size=700,
            byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
            bos_piece="<bos>", unk_piece="<unk>", control_symbols=["<mask>"], user_defined_symbols=GEMMA_USER,
            add_dummy_prefix=False, normalization_rule_name="identity", remove_extra_whitespaces=False,
            split_digits=True, allow_whitespace_only_pieces=True, character_coverage=1.0, max_sentence_length=100000,
            num_threads=1, minloglevel=2)
        os.chdir(cwd)
        path.write_bytes((Path(d) / "gemma.model").read_bytes())
    return spm.SentencePieceProcessor(model_file=str(path))


def gemma_tokenizer(sp):
    """tokenizer.json as transformers' GemmaConverter writes it for the model sp."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab_scores = [(p if p != "<0x09>" else "\t", sp.get_score(i)) for i, p in enumerate(pieces)]
    vocab_scores[:3] = [("<pad>", 0.0), ("<eos>", 0.0), ("<bos>", 0.0)]
    vocab = {p: i for i, p in enumerate(pieces)}
    vocab.setdefault("\t", vocab["<0x09>"])
    # generate_merges(vocab, vocab_scores): every split of a piece into two pieces, by the piece's
    # score (highest first), then longer left and right parts first.
    merges = []
    for piece, score in dict(vocab_scores).items():
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges = [[a, b] for a, b, _ in sorted(merges, key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)]
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
             "vocab": {p: i for i, (p, _) in enumerate(vocab_scores)}, "merges": merges}
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": sp.is_control(i) or sp.is_unknown(i) or p in GEMMA_SPECIAL}
             for i, p in enumerate(pieces) if sp.is_control(i) or sp.is_unknown(i) or p in GEMMA_USER]
    post = bos_template("<bos>", 2)
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
            "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
            "post_processor": post, "decoder": decoder, "model": model}


def main():
    git = ["git", "-C", str(ROOT)]
    names = subprocess.run(git + ["ls-tree", "--name-only", CORPUS_COMMIT, "docs/"], capture_output=True, text=True,
                           check=True).stdout.split()
    text = "".join(subprocess.run(git + ["show", f"{CORPUS_COMMIT}:{n}"], capture_output=True, text=True, check=True).stdout
                   for n in sorted(names) if n.endswith(".md"))
    vocab, merges = learn(text)
    OUT.mkdir(parents=True, exist_ok=True)
    for kind in ("llama3", "gpt2", "qwen2"):
        (OUT / f"{kind}-tokenizer.json").write_text(json.dumps(tokenizer(vocab, merges, kind), ensure_ascii=False) + "\n")
    print(f"{len(vocab)} tokens, {len(merges)} merges -> {OUT}")
    vocab, merges = learn_spm(text)
    for kind in ("spm", "metaspace"):
        (OUT / f"{kind}-tokenizer.json").write_text(json.dumps(spm_tokenizer(vocab, merges, kind), ensure_ascii=False) + "\n")
    print(f"SentencePiece-style: {len(vocab)} tokens, {len(merges)} merges")
    sp = train_gemma(text, OUT / "gemma-tokenizer.model")
    gemma = gemma_tokenizer(sp)
    (OUT / "gemma-tokenizer.json").write_text(json.dumps(gemma, ensure_ascii=False) + "\n")
    print(f"Gemma: {sp.get_piece_size()} pieces, {len(gemma['model']['merges'])} merges")


if __name__ == "__main__":
    main()
