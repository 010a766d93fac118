#!/usr/bin/env python3
"""Runs NVIDIA/kvpress's scorer presses on an akv dump and writes what each keeps, per layer and
KV head, as golden data for akv's tests (tests/unit/test_golden.cpp):

  KnormPress, KeyDiffPress, TOVAPress, ExpectedAttentionPress, LagKVPress  ->  knorm, keydiff,
  tova, expected-attention (compression ratio --ratio), lagkv (lag_size 32, compression ratio 0.5:
  past the sinks and the scored-1 tail); AdaKVPress over KnormPress (alpha_safeguard 0.2)  ->
  adakv with score knorm and capacity rule kvpress (--ratio; kept: what its masked pairs leave);
  CriticalKVPress and CriticalAdaKVPress (epsilon 1e-4, first_stage_ratio 0.5) over KnormPress and
  over ExpectedAttentionPress(use_vnorm=False)  ->  critical-snapkv and critical-adakv with score
  knorm / expected-attention (vnorm off); W_o from the dump's /layers/L/o_proj

  scripts/dev/golden/kvpress.py KVPRESS_CHECKOUT DUMP OUT.json [--ratio 0.75]

The dump must hold every prompt query (n_query = n_tokens: Expected Attention fits its Gaussian to
all of them) and use rotate-half RoPE without scaling (Hugging Face's Llama RoPE). Needs torch
(Debian's python3-torch) and h5py. kvpress's modules are imported unmodified from the checkout
(its package __init__, which builds the pipelines, is not run); its imports of transformers are
satisfied with stand-ins: empty classes for the model and cache types it only names, and two
functions it calls, transcribed from transformers' Llama code (repeat_kv; the default
LlamaRotaryEmbedding's cos and sin). The attention module the presses are handed has q_proj = the
identity and gets the dump's queries with RoPE undone (f64, then f32) as hidden states; TOVA gets
the attention weights of the last query, softmax(q k^T / sqrt(d)) in f32 over every key, as
attentions. Each press runs its own compress() (scores, topk of int(T (1 - ratio)) per head) on the
dump's keys and values in f32; kept positions are found by matching the kept key rows to the
dump's. Nothing of kvpress is copied: OUT.json holds numbers only.

For each head OUT.json also records the press's score of the lowest kept token (`cutoff`) and every
position whose score lies within a relative 1e-5 of it (`tied`): akv scores in f64 and kvpress in
f32, and topk leaves the order of equal scores open, so either side may keep any of them. For the
CriticalKV presses `tied` holds the near-ties of both stages: the wrapped press's score near the
lowest of the head's int(budget * 0.5) best (stage 1), and (score + 1e-4) * |W_o v|_1 near the lowest
kept by it (stage 2).
"""
import argparse
import importlib
import json
import math
import sys
import types
from pathlib import Path

import h5py
import numpy as np
import torch
from reference import KVPRESS_TRANSFORMERS, StandIn, commit_of, source_packages

TIE = 1e-5


def repeat_kv(hidden_states, n_rep):
    """transformers' Llama repeat_kv: [b, kv, s, d] -> [b, kv * n_rep, s, d]."""
    b, kv, s, d = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    return hidden_states[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(theta, head_dim, position_ids, dtype):
    """transformers' default LlamaRotaryEmbedding.forward (attention_scaling 1)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = (inv_freq[None, :, None].float() @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def stand_ins(checkout):
    for name in ("transformers",) + KVPRESS_TRANSFORMERS:
        sys.modules.setdefault(name, StandIn(name))
    llama = StandIn("transformers.models.llama.modeling_llama")
    llama.repeat_kv = repeat_kv
    llama.rotate_half = rotate_half
    sys.modules["transformers.models.llama.modeling_llama"] = llama
    source_packages(checkout, ("kvpress", "kvpress.presses"))


class Attention:
    """What the scorer presses read of a Llama attention module."""

    def __init__(self, n_heads, n_kv, head_dim, theta):
        self.head_dim = head_dim
        self.num_key_value_groups = n_heads // n_kv
        self.config = types.SimpleNamespace(num_attention_heads=n_heads, num_key_value_heads=n_kv,
                                            head_dim=head_dim, _attn_implementation="sdpa")
        self.theta = theta
        self.o_proj = None  # per layer: types.SimpleNamespace(weight=[hidden, n_heads * head_dim])

    def set_o_proj(self, weight):
        self.o_proj = types.SimpleNamespace(weight=weight)
        self.config.hidden_size = weight.shape[0]

    def q_proj(self, hidden_states):
        return hidden_states

    def rotary_emb(self, x, position_ids):
        return rope_cos_sin(self.theta, self.head_dim, position_ids, x.dtype)


def add_o_proj(path, hidden, seed):
    """Writes /layers/L/o_proj [hidden, n_heads * head_dim] (f32, N(0, 1 / (n_heads * head_dim)), numpy's
    default_rng(seed) over the layers in order) into the dump when it has none."""
    with h5py.File(path, "r+") as f:
        if "o_proj" in f["layers/0"]:
            return
        cols = int(f.attrs["n_heads"]) * int(f.attrs["head_dim"])
        rng = np.random.default_rng(seed)
        for layer in range(int(f.attrs["n_layers"])):
            f[f"layers/{layer}/o_proj"] = (rng.standard_normal((hidden, cols)) / math.sqrt(cols)).astype(np.float32)


def layer_inputs(f, layer, n, n_heads, n_kv, d, cos, sin):
    """The dump's keys, values (f32), the presses' hidden states (queries with RoPE undone) and TOVA's
    attentions of the last query."""
    key = torch.from_numpy(f[f"layers/{layer}/key"][...].astype(np.float32))[None]
    value = torch.from_numpy(f[f"layers/{layer}/value"][...].astype(np.float32))[None]
    query = torch.from_numpy(f[f"layers/{layer}/query"][...].astype(np.float64))[None]
    if query.shape[2] != n:
        sys.exit("the dump must hold every prompt query (n_query = n_tokens)")
    pre = query * cos[:, None] - rotate_half(query) * sin[:, None]  # RoPE undone
    hidden = pre.transpose(1, 2).reshape(1, n, n_heads * d).float()
    last = query[:, :, -1:].float()
    attentions = torch.softmax(torch.matmul(last, repeat_kv(key, n_heads // n_kv).transpose(2, 3))
                               / math.sqrt(d), dim=-1, dtype=torch.float32)
    return key, value, hidden, attentions


def near(values, cutoff, positions):
    return {int(t) for t in positions if abs(float(values[t]) - cutoff) <= TIE * abs(cutoff)}


def critical_entries(f, module, ratio, shape, cos, sin, checkout):
    """CriticalKVPress and CriticalAdaKVPress over KnormPress and ExpectedAttentionPress(use_vnorm=False)."""
    n_layers, n_heads, n_kv, d, n = shape
    critical = importlib.import_module("kvpress.presses.criticalkv_press")
    knorm = importlib.import_module("kvpress.presses.knorm_press").KnormPress
    ea = importlib.import_module("kvpress.presses.expected_attention_press").ExpectedAttentionPress
    inner = {  # akv score: (press factory, sinks, options, akv options)
        "knorm": (lambda: knorm(compression_ratio=ratio), 0, {}, {}),
        "expected-attention": (lambda: ea(compression_ratio=ratio, n_future_positions=512, n_sink=4, use_vnorm=False),
                               4, {"n_future_positions": 512, "n_sink": 4, "use_vnorm": False}, {"vnorm": False}),
    }
    entries = {}
    for method, ada in (("critical-snapkv", False), ("critical-adakv", True)):
        for score_name, (make, sinks, options, akv_options) in inner.items():
            scorer = make()
            press = critical.CriticalAdaKVPress(scorer, alpha_safeguard=0.2) if ada else critical.CriticalKVPress(scorer)
            n_kept = int(n * (1 - ratio))
            layers = []
            for layer in range(n_layers):
                module.set_o_proj(torch.from_numpy(f[f"layers/{layer}/o_proj"][...].astype(np.float32)))
                key, value, hidden, attentions = layer_inputs(f, layer, n, n_heads, n_kv, d, cos, sin)
                base = scorer.score(module, hidden, key, value, attentions, {})[0].numpy()
                norm = critical.CriticalKVPress.vwl1norm(value, module)[0].numpy()
                weighed = (base + 1e-4) * norm
                if ada:
                    press.compress(module, hidden, key, value, attentions, {})
                    _, mh, mt = module.masked_key_indices
                    masked = {(int(a), int(b)) for a, b in zip(mh, mt)}
                    kept_sets = [[t for t in range(n) if (h, t) not in masked] for h in range(n_kv)]
                else:
                    kept_keys, _ = press.compress(module, hidden, key, value, attentions, {})
                    kept_sets = [sorted(int(np.flatnonzero((key[0, h].numpy() == row).all(axis=1))[0])
                                        for row in kept_keys[0, h].numpy()) for h in range(n_kv)]
                heads = []
                for h in range(n_kv):
                    kept = kept_sets[h]
                    budget = len(kept)
                    first = int(budget * 0.5) if ada else int((1 - ratio) * n * 0.5)
                    if ada:
                        first = max(first, int(n_kept * 0.2))
                    order = np.argsort(-base[h], kind="stable")
                    stage1 = [int(t) for t in order[:first]]
                    selectable = [t for t in range(sinks, n)]
                    c1 = float(base[h][stage1[-1]])
                    stage2 = [t for t in kept if t not in set(stage1) and t >= sinks]
                    tied = near(base[h], c1, selectable)
                    cutoff = c1
                    if stage2:
                        cutoff = min(float(weighed[h][t]) for t in stage2)
                        tied |= near(weighed[h], cutoff, selectable)
                    heads.append({"kept": kept, "budget": budget, "cutoff": cutoff, "tied": sorted(tied)})
                layers.append(heads)
            name = ("CriticalAdaKVPress" if ada else "CriticalKVPress") + f"({type(scorer).__name__})"
            entry = {"method": method, "score": score_name, "reference": f"NVIDIA/kvpress {name}",
                     "commit": commit_of(checkout), "options": {**options, "epsilon": 1e-4, "first_stage_ratio": 0.5},
                     "budget": 1 - ratio, "window": 0, "sinks": sinks, "layers": layers, **akv_options}
            if ada:
                entry.update({"capacity_rule": "kvpress", "alpha": 0.2})
            entries[f"{method}/{score_name}"] = entry
    return entries


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpress")
    ap.add_argument("dump")
    ap.add_argument("out")
    ap.add_argument("--ratio", type=float, default=0.75, help="kvpress compression_ratio (akv budget 1 - ratio)")
    ap.add_argument("--add-o-proj", type=int, metavar="HIDDEN",
                    help="first write a random /layers/L/o_proj [HIDDEN, n_heads * head_dim] into the dump (seed 5)")
    args = ap.parse_args()
    if args.add_o_proj:
        add_o_proj(args.dump, args.add_o_proj, 5)
    stand_ins(args.kvpress)
    presses = {  # press, options, akv's window, sinks, compression ratio
        "knorm": (importlib.import_module("kvpress.presses.knorm_press").KnormPress, {}, 0, 0, args.ratio),
        "keydiff": (importlib.import_module("kvpress.presses.keydiff_press").KeyDiffPress, {}, 0, 0, args.ratio),
        "tova": (importlib.import_module("kvpress.presses.tova_press").TOVAPress, {}, 1, 0, args.ratio),
        "expected-attention": (importlib.import_module("kvpress.presses.expected_attention_press")
                               .ExpectedAttentionPress, {"n_future_positions": 512, "n_sink": 4}, 0, 4, args.ratio),
        "lagkv": (importlib.import_module("kvpress.presses.lagkv_press").LagKVPress, {"n_sink": 4, "lag_size": 32}, 0, 4,
                  0.5),
    }
    adakv = importlib.import_module("kvpress.presses.adakv_press").AdaKVPress
    torch.set_num_threads(1)
    with h5py.File(args.dump, "r") as f:
        n_layers, n_heads, n_kv, d, n = (int(f.attrs[k]) for k in ("n_layers", "n_heads", "n_kv_heads", "head_dim",
                                                                     "n_tokens"))
        theta = float(f.attrs["rope_theta"])
        if f.attrs["rope_layout"] != "rotate-half" or "rope_variant" in f.attrs:
            sys.exit("the dump must use plain rotate-half RoPE")
        module = Attention(n_heads, n_kv, d, theta)
        cos, sin = rope_cos_sin(theta, d, torch.arange(n)[None], torch.float64)
        out = {"format": "akv-golden", "version": 1, "torch": torch.__version__, "dump": Path(args.dump).name,
               "budget": 1 - args.ratio, "tie_tolerance": TIE, "methods": {}}
        for method, (cls, options, window, sinks, ratio) in [*presses.items(), ("adakv", (None, {}, 0, 0, args.ratio))]:
            # adakv: AdaKVPress over KnormPress (alpha_safeguard 0.2): scores from the wrapped press,
            # the kept set from the (head, token) pairs it masks.
            press = adakv(presses["knorm"][0](compression_ratio=ratio), alpha_safeguard=0.2) if cls is None else \
                cls(compression_ratio=ratio, **options)
            scorer = press.press if cls is None else press
            layers = []
            for layer in range(n_layers):
                key, value, hidden, attentions = layer_inputs(f, layer, n, n_heads, n_kv, d, cos, sin)
                score = scorer.score(module, hidden, key, value, attentions, {})[0].numpy()
                kept_keys, _ = press.compress(module, hidden, key, value, attentions, {})
                masked = set()
                if cls is None:
                    _, mh, mt = module.masked_key_indices
                    masked = {(int(a), int(b)) for a, b in zip(mh, mt)}
                heads = []
                for h in range(n_kv):
                    rows = key[0, h].numpy()
                    if cls is None:
                        kept = [t for t in range(n) if (h, t) not in masked]
                    else:
                        kept = sorted(int(np.flatnonzero((rows == row).all(axis=1))[0]) for row in kept_keys[0, h].numpy())
                    selectable = [t for t in kept if sinks <= t < n - window]
                    cutoff = min(float(score[h, t]) for t in selectable)
                    tied = [int(t) for t in np.flatnonzero(np.abs(score[h] - cutoff) <= TIE * abs(cutoff))
                            if sinks <= t < n - window]
                    heads.append({"kept": kept, "budget": len(kept), "cutoff": cutoff, "tied": tied})
                layers.append(heads)
            name = "AdaKVPress(KnormPress, alpha_safeguard 0.2)" if cls is None else cls.__name__
            out["methods"][method] = {"reference": f"NVIDIA/kvpress {name}", "commit": commit_of(args.kvpress),
                                      "options": options, "budget": 1 - ratio, "window": window, "sinks": sinks,
                                      "layers": layers}
            if cls is None:
                out["methods"][method].update({"score": "knorm", "capacity_rule": "kvpress", "alpha": 0.2})
            if "lag_size" in options:
                out["methods"][method]["lag"] = options["lag_size"]
        if "o_proj" in f["layers/0"]:
            out["methods"].update(critical_entries(f, module, args.ratio, (n_layers, n_heads, n_kv, d, n), cos, sin,
                                                   args.kvpress))
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
