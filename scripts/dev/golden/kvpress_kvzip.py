#!/usr/bin/env python3
"""Runs NVIDIA/kvpress's KVzipPress on a llama2.c checkpoint and writes its scores and what each
head keeps, as golden data for akv's kvzip (tests/unit/test_golden.cpp):

  scripts/dev/golden/kvpress_kvzip.py KVPRESS_CHECKOUT MODEL.bin TOKENS.txt OUT.json
      [--context 200] [--chunk 96] [--ratio 0.75] [--plus]

--plus runs the press with kvzip_plus_normalization=True (KVzip+: each repeat query's attention
divided by the norm of its attention input, each key's multiplied by |W_o v|_2 of the query head).

--authors KVZIP_CHECKOUT (without --plus) also scores every chunk with the KVzip authors' own
scoring function, snu-mllab/KVzip attention/score.py `KVScore._get_score` (loaded from its file:
the package's other modules need CUDA), on the repeat queries and the cache that each chunk's
forward above computed (its sink the context's first 4 tokens, `n_sink`); OUT.json's `authors`
holds its scores. For the first chunk (start 0 < sink) the function puts the sink tokens into the
softmax twice (the authors always have a system prompt before the context); only later chunks
compare with kvpress's and akv's.

The context is the first --context ids of TOKENS.txt's first line; the repeat prompts are fixed
ids (the model has no text tokenizer here: a stand-in tokenizer hands KVzipPress these ids for its
three strings). KVzipPress runs unmodified, as its own __call__ drives it: the context prefilled
inside `with press(model)`, then one forward per chunk of prompt + suffix + chunk through the
cache, its forward hooks scoring, its compress_post choosing the pruned (head, token) pairs over
all layers (non-layerwise). Two settings are given without editing its code: prepare()'s default
chunk size (2048) is replaced by --chunk through the function's __defaults__, so a short context
has several chunks; and a subclass copies score_val before compress_post (the press resets it on
exit).

The model is a transcription of transformers' Llama (RMSNorm, RoPE rotate-half with theta 10000,
SiLU MLP, eager causal attention, f32) built from the checkpoint, with llama2.c's interleaved
wq / wk rows permuted to the rotate-half layout as transformers' converter does (attention
scores are unchanged). transformers itself is not installed: stand-ins satisfy kvpress's imports.
Nothing of kvpress is copied: OUT.json holds numbers only.
"""
import argparse
import importlib
import json
import math
import struct
import sys
import types
from pathlib import Path

import importlib.util

import numpy as np
import torch
from reference import commit_of
from torch import nn

# This folder's kvpress.py: the transformers stand-ins and the Llama RoPE transcription.
_spec = importlib.util.spec_from_file_location("kvpress_golden", Path(__file__).resolve().parent / "kvpress.py")
stand = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stand)

PROMPTS = {  # KVzipPress's strings -> the ids the stand-in tokenizer gives them
    "\n\nRepeat the previous context exactly.": [13, 13, 1, 2, 3, 4, 5],
    "\n\nRepeat the part of the previous context exactly, starting with": [13, 13, 1, 2, 6, 7, 4, 8, 9],
    "\n": [13],
    "": [],  # the chat-template prefix of a model without one
}


def load_llama2c(path):
    raw = Path(path).read_bytes()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("7i", raw[:28])
    tied = vocab > 0
    vocab = abs(vocab)
    data = np.frombuffer(raw[28:], dtype=np.float32)
    hd = dim // n_heads
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        out = torch.from_numpy(data[at:at + n].copy().reshape(shape))
        at += n
        return out

    w = {"embed": take(vocab, dim)}
    for name, shape in (("attn_norm", (dim,)), ("wq", (dim, dim)), ("wk", (n_kv * hd, dim)), ("wv", (n_kv * hd, dim)),
                        ("wo", (dim, dim)), ("ffn_norm", (dim,)), ("w1", (hidden, dim)), ("w2", (dim, hidden)),
                        ("w3", (hidden, dim))):
        w[name] = [take(*shape) for _ in range(n_layers)]
    w["norm"] = take(dim)
    at += seq_len * hd  # freq_cis_real and freq_cis_imag
    w["cls"] = w["embed"] if tied else take(vocab, dim)
    cfg = types.SimpleNamespace(hidden_size=dim, intermediate_size=hidden, num_hidden_layers=n_layers,
                                num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=hd, vocab_size=vocab,
                                name_or_path="stories260K", _attn_implementation="sdpa", rope_theta=10000.0)
    return cfg, w


def permute(w, heads):
    """llama2.c's interleaved RoPE rows -> rotate-half rows (transformers' convert_llama_weights)."""
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def rms(x, weight, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class Layer:
    def __init__(self):
        self.keys = torch.zeros(0)
        self.values = torch.zeros(0)


class Cache:
    def __init__(self, n_layers):
        self.layers = [Layer() for _ in range(n_layers)]

    def length(self):
        return self.layers[0].keys.shape[2] if self.layers[0].keys.numel() else 0


class Attention(nn.Module):
    def __init__(self, cfg, w, i):
        super().__init__()
        self.config, self.layer_idx, self.head_dim = cfg, i, cfg.head_dim
        self.num_key_value_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        lin = lambda m: nn.Linear(m.shape[1], m.shape[0], bias=False)  # noqa: E731
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (lin(m) for m in (w["wq"][i], w["wk"][i], w["wv"][i],
                                                                                 w["wo"][i]))
        with torch.no_grad():
            self.q_proj.weight.copy_(permute(w["wq"][i], cfg.num_attention_heads))
            self.k_proj.weight.copy_(permute(w["wk"][i], cfg.num_key_value_heads))
            self.v_proj.weight.copy_(w["wv"][i])
            self.o_proj.weight.copy_(w["wo"][i])

    # torch >= 2.0's register_forward_hook(..., with_kwargs=True), which KVzipPress uses, for
    # Debian's torch 1.13: hook(module, args, kwargs, output) after each call.
    def register_forward_hook(self, hook, with_kwargs=False):
        self.__dict__.setdefault("kw_hooks", []).append(hook)
        hooks = self.kw_hooks
        return types.SimpleNamespace(remove=lambda: hooks.remove(hook))

    def __call__(self, **kwargs):
        output = self.forward(**kwargs)
        for hook in list(self.__dict__.get("kw_hooks", [])):
            result = hook(self, (), kwargs, output)
            output = output if result is None else result
        return output

    # --authors: each forward's queries (after RoPE) and the layer's keys after its append.
    seen = None

    def forward(self, hidden_states, position_embeddings, past_key_values, cache_position):
        b, n, _ = hidden_states.shape
        hd, nh, nkv = self.head_dim, self.config.num_attention_heads, self.config.num_key_value_heads
        q = self.q_proj(hidden_states).view(b, n, nh, hd).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, n, nkv, hd).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, n, nkv, hd).transpose(1, 2)
        cos, sin = position_embeddings
        q = q * cos[:, None] + stand.rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + stand.rotate_half(k) * sin[:, None]
        layer = past_key_values.layers[self.layer_idx]
        layer.keys = torch.cat([layer.keys, k], dim=2) if layer.keys.numel() else k
        layer.values = torch.cat([layer.values, v], dim=2) if layer.values.numel() else v
        if Attention.seen is not None:
            Attention.seen.append((self.layer_idx, q.clone(), layer.keys.clone()))
        keys = stand.repeat_kv(layer.keys, self.num_key_value_groups)
        values = stand.repeat_kv(layer.values, self.num_key_value_groups)
        total = keys.shape[2]
        w = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(hd)
        mask = torch.full((n, total), float("-inf")).triu(total - n + 1)
        p = torch.softmax(w + mask, dim=-1, dtype=torch.float32)
        out = torch.matmul(p, values).transpose(1, 2).reshape(b, n, nh * hd)
        return self.o_proj(out), None


class DecoderLayer(nn.Module):
    def __init__(self, cfg, w, i):
        super().__init__()
        self.self_attn = Attention(cfg, w, i)
        self.w = {k: w[k][i] for k in ("attn_norm", "ffn_norm", "w1", "w2", "w3")}

    def forward(self, h, position_embeddings, cache, cache_position):
        a, _ = self.self_attn(hidden_states=rms(h, self.w["attn_norm"]), position_embeddings=position_embeddings,
                              past_key_values=cache, cache_position=cache_position)
        h = h + a
        x = rms(h, self.w["ffn_norm"])
        return h + (nn.functional.silu(x @ self.w["w1"].T) * (x @ self.w["w3"].T)) @ self.w["w2"].T


class Inner(nn.Module):
    def __init__(self, cfg, w):
        super().__init__()
        self.cfg, self.w = cfg, w
        self.layers = nn.ModuleList(DecoderLayer(cfg, w, i) for i in range(cfg.num_hidden_layers))

    def rotary_emb(self, x, position_ids):
        return stand.rope_cos_sin(self.cfg.rope_theta, self.cfg.head_dim, position_ids, x.dtype)

    def forward(self, input_ids=None, past_key_values=None, **kwargs):
        start = past_key_values.length()
        positions = torch.arange(start, start + input_ids.shape[1])
        pe = self.rotary_emb(torch.zeros(1), positions[None])
        h = self.w["embed"][input_ids]
        for layer in self.layers:
            h = layer(h, pe, past_key_values, positions)
        return rms(h, self.w["norm"])


class Llama(nn.Module):
    def __init__(self, cfg, w):
        super().__init__()
        self.config, self.model = cfg, Inner(cfg, w)
        self.dtype, self.device = torch.float32, torch.device("cpu")

    def forward(self, input_ids=None, past_key_values=None, num_logits_to_keep=0, **kwargs):
        h = self.model(input_ids=input_ids, past_key_values=past_key_values)
        return h[:, -1:] @ self.model.w["cls"].T


class Tokenizer:
    chat_template = None

    def encode(self, text, return_tensors=None, add_special_tokens=False):
        return torch.tensor([PROMPTS[text]], dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpress")
    ap.add_argument("model")
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--chunk", type=int, default=96)
    ap.add_argument("--ratio", type=float, default=0.75)
    ap.add_argument("--plus", action="store_true", help="KVzip+ normalization")
    ap.add_argument("--authors", help="snu-mllab/KVzip checkout: its KVScore._get_score on every chunk too")
    args = ap.parse_args()
    if args.authors and args.plus:
        ap.error("--authors scores without KVzip+ normalization (the authors' code has none)")
    stand.stand_ins(args.kvpress)
    sys.modules["transformers"].AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda name: Tokenizer())
    kvzip = importlib.import_module("kvpress.presses.kvzip_press")
    kvzip.KVzipPress.prepare.__defaults__ = (args.chunk, 8)
    torch.set_num_threads(1)
    cfg, w = load_llama2c(args.model)
    model = Llama(cfg, w)
    context = [int(t) for t in Path(args.tokens).read_text().split("\n")[0].split()][:args.context]

    class Press(kvzip.KVzipPress):
        def compress_post(self, model):
            self.kept_scores = self.score_val.clone()
            super().compress_post(model)

    press = Press(compression_ratio=args.ratio, kvzip_plus_normalization=args.plus)
    Attention.seen = [] if args.authors else None
    with torch.no_grad():
        with press(model):
            model(input_ids=torch.tensor([context]), past_key_values=Cache(cfg.num_hidden_layers))
    n = len(context)
    layers = []
    for layer in model.model.layers:
        _, heads, seq = layer.self_attn.masked_key_indices
        pruned = {(int(h), int(t)) for h, t in zip(heads, seq)}
        layers.append([{"kept": [t for t in range(n) if (h, t) not in pruned],
                        "score": [float(x) for x in press.kept_scores[layer.self_attn.layer_idx][0, h]]}
                       for h in range(cfg.num_key_value_heads)])
    commit = commit_of(args.kvpress)
    out = {"format": "akv-golden", "version": 1, "torch": torch.__version__, "reference": "NVIDIA/kvpress KVzipPress",
           "commit": commit, "model": Path(args.model).name, "context": context, "chunk": args.chunk,
           "prompts": {"first": PROMPTS["\n\nRepeat the previous context exactly."],
                       "later": PROMPTS["\n\nRepeat the part of the previous context exactly, starting with"],
                       "suffix": PROMPTS["\n"]},
           "ratio": args.ratio, "n_sink": 4, "kvzip_plus_normalization": args.plus, "layers": layers}
    if args.authors:
        out["authors"] = authors_scores(args.authors, cfg, len(context), args.chunk, Attention.seen)
    Path(args.out).write_text(json.dumps(out) + "\n")


def authors_scores(checkout, cfg, n, chunk, seen):
    """The authors' KVScore._get_score over each chunk's forward (seen: the context's prefill, then
    one forward per chunk, each a call per layer), its sink the context's first 4 tokens."""
    spec = importlib.util.spec_from_file_location("kvzip_score", Path(checkout) / "attention" / "score.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scorer = module.KVScore()
    scorer.n_layers, scorer.n_heads_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    scorer.dtype, scorer.device, scorer.sink = torch.float32, torch.device("cpu"), 4
    scorer.init_score()
    chunks = [(a, min(a + chunk, n)) for a in range(0, n, chunk)]
    per_forward = cfg.num_hidden_layers
    forwards = [seen[i:i + per_forward] for i in range(0, len(seen), per_forward)]
    assert len(forwards) == 1 + len(chunks), "a prefill and one forward per chunk"
    with torch.no_grad():
        for (start, end), calls in zip(chunks, forwards[1:]):
            scorer.start_idx, scorer.end_idx = start, end
            for layer, q, keys in calls:
                scorer._get_score(q, keys, layer)
    return {"reference": "snu-mllab/KVzip attention/score.py KVScore._get_score", "commit": commit_of(checkout),
            "sink": 4, "chunks": chunks,
            "scores": [[[float(x) for x in scorer.score[l][0, h]] for h in range(cfg.num_key_value_heads)]
                       for l in range(cfg.num_hidden_layers)]}



if __name__ == "__main__":
    main()
