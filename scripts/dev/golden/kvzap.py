#!/usr/bin/env python3
"""Runs NVIDIA/kvpress's KVzap code on akv dumps written with `akv dump --kvzap` and writes the
fitted surrogate and what the press keeps, per layer and KV head, as golden data for akv's tests
(tests/unit/test_golden.cpp):

  kvzap/train.py train_linear (scikit-learn Ridge)  ->  `akv calibrate DUMP...`'s per-head `kvzap`
  KVzapPress (ScorerPress, compression ratio --ratio)  ->  `akv compress DUMP --method snapkv
                                                           --score kvzap --window 0 --sinks 0`

  scripts/dev/golden/kvzap.py KVPRESS_CHECKOUT OUT.json DUMP... [--ratio 0.5] [--sinks 4]

train_linear runs unmodified on what kvzap/data.py's collector would hand it, taken from the
dumps: X [rows, n_layers, dim] the attention inputs (/layers/L/attn_input, f32) and y [rows,
n_layers, n_kv_heads] the log KVzip+ scores (/layers/L/kvzip_plus), every dump's tokens after its
first --sinks (akv calibrate's --kvzap-sinks), the dumps in the order given. Which tokens and which
KVzip+ scores a run collects is akv's choice (its kvzip pass; kvpress's collector runs a chat
template), said in docs/eviction.md; the fit and the press are kvpress's. Stand-ins: transformers
(PretrainedConfig, PreTrainedModel as a torch Module, and names train.py imports), skorch, kvzap.data,
tqdm, fire. KVzapPress (kvpress 8bb29b9) is handed the fitted model instead of loading one from the
Hub (post_init_from_model) and scores the last dump's attention inputs in f32; kept positions are
found by matching the kept key rows. Nothing of kvpress is copied: OUT.json holds numbers only.

For each head OUT.json also records the press's score of the lowest kept token (`cutoff`) and every
position whose score lies within a relative 1e-5 of it (`tied`): either side may keep any of them.
Needs torch (Debian's python3-torch), scikit-learn (python3-sklearn) and h5py.
"""
import argparse
import importlib
import json
import sys
import types
from pathlib import Path

import h5py
import numpy as np
import torch
from reference import StandIn, commit_of, kvzap_stand_ins

TIE = 1e-5


def stand_ins(kvpress):
    kvzap_stand_ins(kvpress, ("kvpress", "kvpress.presses", "kvzap"),
                    ("skorch", "skorch.callbacks", "skorch.dataset", "fire", "kvzap.data"))
    tqdm = StandIn("tqdm.auto")
    tqdm.tqdm = lambda it, *a, **k: it
    sys.modules["tqdm"] = StandIn("tqdm")
    sys.modules["tqdm.auto"] = tqdm


def read_dump(path):
    with h5py.File(path, "r") as f:
        n_layers = int(f.attrs["n_layers"])
        x = [f[f"layers/{l}/attn_input"][...].astype(np.float32) for l in range(n_layers)]
        s = [f[f"layers/{l}/kvzip_plus"][...].astype(np.float64) for l in range(n_layers)]
        keys = [f[f"layers/{l}/key"][...].astype(np.float32) for l in range(n_layers)]
        values = [f[f"layers/{l}/value"][...].astype(np.float32) for l in range(n_layers)]
        return x, s, keys, values, int(f.attrs["head_dim"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpress")
    ap.add_argument("out")
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--ratio", type=float, default=0.5, help="kvpress compression_ratio (akv budget 1 - ratio)")
    ap.add_argument("--sinks", type=int, default=4, help="each dump's first tokens left out of the fit")
    args = ap.parse_args()
    torch.set_num_threads(1)
    stand_ins(args.kvpress)
    train = importlib.import_module("kvzap.train")
    press_module = importlib.import_module("kvpress.presses.kvzap_press")
    dumps = [read_dump(p) for p in args.dumps]
    n_layers = len(dumps[0][0])
    xs, ys = [], []
    for x, s, _, _, _ in dumps:
        xs.append(np.stack([x[l][args.sinks:] for l in range(n_layers)], axis=1))
        ys.append(np.stack([np.log(s[l][:, args.sinks:]).T for l in range(n_layers)], axis=1))
    X = torch.from_numpy(np.concatenate(xs))
    y = torch.from_numpy(np.concatenate(ys)).float()
    model = train.train_linear(X, y)
    weights = [[model.layers[l].weight[h].tolist() for h in range(y.shape[2])] for l in range(n_layers)]
    biases = [model.layers[l].bias.tolist() for l in range(n_layers)]

    press = press_module.KVzapPress(model_type="linear", compression_ratio=args.ratio)
    press.kvzap_model = model
    x, _, keys, values, d = dumps[-1]
    layers = []
    for layer in range(n_layers):
        hidden = torch.from_numpy(x[layer])[None]
        key = torch.from_numpy(keys[layer])[None]
        value = torch.from_numpy(values[layer])[None]
        module = types.SimpleNamespace(layer_idx=layer, head_dim=d)
        with torch.no_grad():
            score = press.score(module, hidden, key, value, None, {})[0].numpy()
            kept_keys, _ = press.compress(module, hidden, key, value, None, {})
        heads = []
        for h in range(key.shape[1]):
            rows = key[0, h].numpy()
            kept = sorted(int(np.flatnonzero((rows == row).all(axis=1))[0]) for row in kept_keys[0, h].numpy())
            cutoff = min(float(score[h, t]) for t in kept)
            tied = [int(t) for t in np.flatnonzero(np.abs(score[h] - cutoff) <= TIE * abs(cutoff))]
            heads.append({"kept": kept, "budget": len(kept), "cutoff": cutoff, "tied": tied,
                          "scores": [float(v) for v in score[h]]})
        layers.append(heads)
    out = {"format": "akv-golden", "version": 1, "torch": torch.__version__,
           "dumps": [Path(p).name for p in args.dumps], "dump": Path(args.dumps[-1]).name,
           "budget": 1 - args.ratio, "tie_tolerance": TIE,
           "fit": {"reference": "NVIDIA/kvpress kvzap/train.py train_linear", "commit": commit_of(args.kvpress),
                   "sinks": args.sinks, "rows": int(X.shape[0]), "weight": weights, "bias": biases},
           "methods": {"kvzap": {"reference": "NVIDIA/kvpress KVzapPress (linear)", "commit": commit_of(args.kvpress),
                                 "method": "snapkv", "score": "kvzap", "budget": 1 - args.ratio, "window": 0,
                                 "sinks": 0, "layers": layers}}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
