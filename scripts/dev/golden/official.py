#!/usr/bin/env python3
"""Runs the official code of akv's eviction methods on an akv dump and writes what each keeps, per
layer and KV head, as golden data for akv's tests (tests/unit/test_golden.cpp):

  --adakv CHECKOUT            FFY0/AdaKV adaptive_snapkv/monkeypatch/snapkv_utils.py: adakv, snapkv,
                              adakv-pyramid (AdaptiveSnapKVCluster with pyram_mode, pyram_beta 20)
  --kvcache-factory CHECKOUT  Zefan-Cai/KVCache-Factory pyramidkv/pyramidkv_utils.py: pyramid
  --h2o CHECKOUT              FMInference/H2O h2o_hf/utils_real_drop/modify_llama.py
                              (H2OKVCache_LayerWise; needs a dump of all prompt queries, MHA)
  --streaming-llm CHECKOUT    mit-han-lab/streaming-llm streaming_llm/kv_cache.py (StartRecentKVCache)

  scripts/dev/golden/official.py DUMP OUT.json [the flags above] [--budget 0.2] [--window 32]

Needs torch (Debian's python3-torch runs these CPU paths) and h5py. The official modules are
imported unmodified from the checkouts; their imports of flash_attn and transformers, used only
by their model classes and decoding caches, are satisfied with empty stand-ins. H2O's class
takes the attention weights its modified LlamaAttention computes: softmax(q k^T / sqrt(d) +
causal mask) in f32 over the whole prompt, computed here the same way. Nothing of it is copied:
OUT.json holds numbers only. Settings: float32 on the CPU, window 32, kernel 7, max pooling,
GQA support with gqa_func (gqa_score_agg) "mean", Ada-KV floor_alpha 0.2, skip 0, no
normalisation, PyramidKV beta 20; budget = round(budget * n_tokens) tokens per KV head including
the window (akv's --budget).

Kept positions are read back through the values: the value rows handed to the official code hold
their own position (values do not influence selection), so the rows it returns name the kept
tokens. For each head OUT.json also records the official selection score of the last token kept
(`cutoff`) and every position whose score equals it (`tied`): torch's sort does not say which of
equal scores come first, so a reimplementation may keep any of them.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import math
import sys
import types
from pathlib import Path

import h5py
import numpy as np
import torch
from reference import StandIn, commit_of


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_ins():
    sys.modules.setdefault("flash_attn", types.SimpleNamespace(flash_attn_func=None))
    for name in ("transformers", "transformers.cache_utils", "transformers.configuration_utils",
                 "transformers.models", "transformers.models.llama", "transformers.models.llama.modeling_llama"):
        sys.modules.setdefault(name, StandIn(name))


def load_official(checkout):
    path = Path(checkout) / "adaptive_snapkv" / "monkeypatch" / "snapkv_utils.py"
    return load_module(path, "official_snapkv_utils"), commit_of(checkout)


def tensors(f, layer, n_tokens):
    key = torch.from_numpy(f[f"layers/{layer}/key"][...].astype(np.float32))[None]
    q = f[f"layers/{layer}/query"][...].astype(np.float32)
    query = torch.zeros((1, q.shape[0], n_tokens, q.shape[2]), dtype=torch.float32)
    query[0, :, n_tokens - q.shape[1]:, :] = torch.from_numpy(q)  # only the last window is read
    heads, _, d = key.shape[1:]
    value = torch.arange(n_tokens, dtype=torch.float32).view(1, 1, n_tokens, 1).expand(1, heads, n_tokens, d)
    return key, query, value.contiguous()


def prompt_attention(key, query):
    """H2O's LlamaAttention: softmax(q k^T / sqrt(d) + causal mask), f32, every prompt query."""
    n, d = key.shape[2], key.shape[3]
    w = torch.matmul(query, key.transpose(2, 3)) / math.sqrt(d)
    mask = torch.full((n, n), torch.finfo(w.dtype).min)
    mask = torch.triu(mask, diagonal=1)
    return torch.softmax(w + mask[None, None], dim=-1, dtype=torch.float32)


def snap_scores(official, key, query, window, capacity, layer, n_layers, group):
    """The official window scores (GQA mean, then max pooling) that SnapKV and PyramidKV rank by."""
    helper = official.AdaptiveSnapKVCluster(
        window_size=window, kernel_size=7, pooling="maxpool", base_capacity=capacity, floor_alpha=0.2, skip=0,
        layer_idx=layer, num_hidden_layers=n_layers, gqa_support=True, num_key_value_groups=group, gqa_func="mean")
    return helper.calcul_attn_sore(official.repeat_kv(key, group), query)


def ties(score, kept_prefix):
    """The official score of the last kept prefix token and the prefix positions equal to it."""
    if not kept_prefix:
        return None, []
    cutoff = min(float(score[p]) for p in kept_prefix)
    return cutoff, [int(p) for p in np.flatnonzero(score == np.float32(cutoff))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("out")
    ap.add_argument("--adakv", help="FFY0/AdaKV checkout: adakv, snapkv")
    ap.add_argument("--kvcache-factory", help="Zefan-Cai/KVCache-Factory checkout: pyramid")
    ap.add_argument("--h2o", help="FMInference/H2O checkout: h2o")
    ap.add_argument("--streaming-llm", help="mit-han-lab/streaming-llm checkout: streamingllm")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--window", type=int, default=32)
    args = ap.parse_args()
    stand_ins()
    torch.set_num_threads(1)
    with h5py.File(args.dump, "r") as f:
        n_layers, n_heads, n_kv = (int(f.attrs[k]) for k in ("n_layers", "n_heads", "n_kv_heads"))
        n_tokens = int(f.attrs["n_tokens"])
        group = n_heads // n_kv
        capacity = int(round(args.budget * n_tokens))  # akv: round(F * n_tokens), window included
        out = {"format": "akv-golden", "version": 1, "torch": torch.__version__, "dump": Path(args.dump).name,
               "budget": args.budget, "capacity": capacity, "window": args.window, "kernel": 7,
               "pooling": "maxpool", "gqa_func": "mean", "floor_alpha": 0.2, "beta": 20, "methods": {}}
        methods = []
        official = factory = h2o = streaming = None
        if args.adakv:
            official, commit = load_official(args.adakv)
            methods += [("adakv", "FFY0/AdaKV", commit), ("snapkv", "FFY0/AdaKV", commit),
                        ("adakv-pyramid", "FFY0/AdaKV", commit)]
        if args.h2o:
            h2o = load_module(Path(args.h2o) / "h2o_hf" / "utils_real_drop" / "modify_llama.py", "official_h2o")
            methods.append(("h2o", "FMInference/H2O", commit_of(args.h2o)))
        if args.streaming_llm:
            streaming = load_module(Path(args.streaming_llm) / "streaming_llm" / "kv_cache.py", "official_streaming")
            methods.append(("streamingllm", "mit-han-lab/streaming-llm", commit_of(args.streaming_llm)))
        if args.kvcache_factory:
            if official is None:
                sys.exit("--kvcache-factory needs --adakv too (its scores name the ties)")
            factory = load_module(Path(args.kvcache_factory) / "pyramidkv" / "pyramidkv_utils.py", "kvcache_factory_utils")
            methods.append(("pyramid", "Zefan-Cai/KVCache-Factory", commit_of(args.kvcache_factory)))
        for method, reference, ref_commit in methods:
            layers = []
            for layer in range(n_layers):
                key, query, value = tensors(f, layer, n_tokens)
                if method in ("adakv", "adakv-pyramid"):
                    cluster = official.AdaptiveSnapKVCluster(
                        window_size=args.window, kernel_size=7, pooling="maxpool", base_capacity=capacity,
                        floor_alpha=0.2, skip=0, normalize=None, layer_idx=layer, num_hidden_layers=n_layers,
                        pyram_mode=method == "adakv-pyramid", pyram_beta=20,
                        gqa_support=True, num_key_value_groups=group, gqa_func="mean")
                    with contextlib.redirect_stdout(io.StringIO()):  # pyram mode prints its capacities
                        _, vals = cluster.update_kv(key, query, value)
                    lens = cluster.head_lens.tolist()
                    rows = vals[:, 0].round().long().tolist()
                    per_head, at = [], 0
                    for n in lens:
                        per_head.append(rows[at:at + n])
                        at += n
                    score = official.AdaptiveSnapKVCluster.calcul_attn_sore(cluster, official.repeat_kv(key, group), query)
                elif method == "h2o":
                    if f[f"layers/{layer}/query"].shape[1] != n_tokens or group != 1:
                        sys.exit("h2o needs an MHA dump with every prompt query (n_query = n_tokens)")
                    attn = prompt_attention(key, query)
                    cache = h2o.H2OKVCache_LayerWise(hh_size=capacity - args.window, recent_size=args.window)
                    _, vals = cache((key, value), attn)
                    per_head = [vals[0, h, :, 0].round().long().tolist() for h in range(n_kv)]
                    score = attn.sum(0).sum(1)[None]
                elif method == "streamingllm":
                    cache = streaming.StartRecentKVCache(start_size=4, recent_size=capacity - 4)
                    (_, vals), = cache([(key, value)])
                    per_head = [vals[0, h, :, 0].round().long().tolist() for h in range(n_kv)]
                    score = torch.arange(n_tokens, dtype=torch.float32).expand(1, n_kv, n_tokens)
                elif method == "pyramid":
                    cluster = factory.PyramidKVCluster(
                        num_hidden_layers=n_layers, window_size=args.window, max_capacity_prompt=capacity,
                        kernel_size=7, pooling="maxpool", beta=20, layer_idx=layer, gqa_score_agg="mean")
                    _, vals = cluster.update_kv(key, query, value, None, group)
                    per_head = [vals[0, h, :, 0].round().long().tolist() for h in range(n_kv)]
                    score = snap_scores(official, key, query, args.window, capacity, layer, n_layers, group)
                else:
                    cluster = official.SnapKVCluster(
                        window_size=args.window, max_capacity_prompt=capacity, kernel_size=7, pooling="maxpool",
                        layer_idx=layer, num_hidden_layers=n_layers, gqa_support=True,
                        num_key_value_groups=group, gqa_func="mean")
                    _, vals = cluster.update_kv(key, query, value)
                    per_head = [vals[0, h, :, 0].round().long().tolist() for h in range(n_kv)]
                    score = snap_scores(official, key, query, args.window, capacity, layer, n_layers, group)
                score = score[0].numpy()
                heads = []
                for h, kept in enumerate(per_head):
                    prefix = [p for p in kept if p < n_tokens - args.window]
                    cutoff, tied = ties(score[h], prefix)
                    heads.append({"kept": sorted(kept), "budget": len(kept), "cutoff": cutoff, "tied": tied})
                layers.append(heads)
            out["methods"][method] = {"reference": reference, "commit": ref_commit, "layers": layers}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
