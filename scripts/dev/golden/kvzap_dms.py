#!/usr/bin/env python3
"""Runs NVIDIA/kvpress's DMSPress around its KVzapPress on an akv dump written with `akv dump
--kvzap` and writes which tokens each layer and KV head keeps, as golden data for akv's threshold
eviction (tests/unit/test_golden.cpp):

  DMSPress(KVzapPress, threshold T, sliding_window_size W)        ->  `akv compress DUMP --method
                                                                       kvzap --threshold T --window W
                                                                       --sinks 0`
  the same with decoding=True, the dump's first P tokens as the
  prompt and each later token one decoding step                   ->  the runtime cache of
                                                                       kvzap:threshold=T:window=W:
                                                                       sinks=0:decoding=on

  scripts/dev/golden/kvzap_dms.py KVPRESS_CHECKOUT OUT.json DUMP FIT.json [--threshold T]
      [--window W] [--prompt P]

FIT.json is kvzap.py's golden file (data/golden/kvzap-official.json): its `fit` (kvpress's
train_linear on two dumps) is the surrogate, handed to KVzapPress instead of a model from the Hub.
DMSPress.forward_hook (kvpress 8bb29b9) runs unmodified: per layer, with the dump's attention inputs
as hidden_states, a stand-in cache holding the dump's keys and values up to the step, and the step's
cache positions. Stand-ins: transformers (names kvpress imports). Nothing of kvpress is copied:
OUT.json holds numbers only. Each head also lists the positions whose press score lies within a
relative 1e-5 of the threshold (`tied`: f32 against akv's f64 scores, either side may keep them).
Needs torch (Debian's python3-torch) and h5py.
"""
import argparse
import importlib
import json
import types
from pathlib import Path

import h5py
import numpy as np
import torch
from reference import commit_of, kvzap_stand_ins

TIE = 1e-5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpress")
    ap.add_argument("out")
    ap.add_argument("dump")
    ap.add_argument("fit")
    ap.add_argument("--threshold", type=float, default=-5.2)
    ap.add_argument("--window", type=int, default=16, help="DMSPress sliding_window_size")
    ap.add_argument("--prompt", type=int, default=96, help="tokens of the prefill in the decoding run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    kvzap_stand_ins(args.kvpress, ("kvpress", "kvpress.presses"))
    zap = importlib.import_module("kvpress.presses.kvzap_press")
    dms = importlib.import_module("kvpress.presses.dms_press")

    fit = json.loads(Path(args.fit).read_text())["fit"]
    with h5py.File(args.dump, "r") as f:
        n_layers = int(f.attrs["n_layers"])
        x = [torch.from_numpy(f[f"layers/{l}/attn_input"][...].astype(np.float32)) for l in range(n_layers)]
        keys = [torch.from_numpy(f[f"layers/{l}/key"][...].astype(np.float32))[None] for l in range(n_layers)]
        values = [torch.from_numpy(f[f"layers/{l}/value"][...].astype(np.float32))[None] for l in range(n_layers)]
    n_tokens, n_kv = x[0].shape[0], keys[0].shape[1]
    model = zap.KVzapModel(zap.KVzapConfig(input_dim=x[0].shape[1], hidden_dim=None, output_dim=n_kv,
                                           n_modules=n_layers))
    for l in range(n_layers):
        model.layers[l].weight.data = torch.tensor(fit["weight"][l], dtype=torch.float32)
        model.layers[l].bias.data = torch.tensor(fit["bias"][l], dtype=torch.float32)
    scorer = zap.KVzapPress(model_type="linear")
    scorer.kvzap_model = model

    def run(decoding):
        press = dms.DMSPress(scorer, threshold=args.threshold, sliding_window_size=args.window, decoding=decoding)
        modules = [types.SimpleNamespace(layer_idx=l, masked_key_indices=None) for l in range(n_layers)]
        steps = [(0, args.prompt)] + [(t, t + 1) for t in range(args.prompt, n_tokens)] if decoding else [(0, n_tokens)]
        after_prompt = None
        with torch.no_grad():
            for start, end in steps:
                if start == args.prompt:
                    after_prompt = kept_sets(modules, end - 1)
                cache = types.SimpleNamespace(layers=[types.SimpleNamespace(keys=keys[l][:, :, :end],
                                                                            values=values[l][:, :, :end])
                                                      for l in range(n_layers)])
                for l in range(n_layers):
                    kwargs = {"hidden_states": x[l][start:end][None], "past_key_values": cache,
                              "cache_position": torch.arange(start, end)}
                    press.forward_hook(modules[l], [], kwargs, None)
        run = {"reference": "NVIDIA/kvpress DMSPress(KVzapPress linear)", "commit": commit_of(args.kvpress),
               "decoding": decoding, "prompt": args.prompt if decoding else n_tokens,
               "compression_ratio": float(press.compression_ratio), "layers": kept_sets(modules, n_tokens)}
        if after_prompt:
            run["after_prompt"] = after_prompt
        return run

    def kept_sets(modules, n):
        layers = []
        for l in range(n_layers):
            with torch.no_grad():
                score = scorer.score(types.SimpleNamespace(layer_idx=l), x[l][None], None, None, None, {})[0].numpy()
            masked = modules[l].masked_key_indices
            heads = []
            for h in range(n_kv):
                gone = set() if masked is None else {int(t) for hh, t in zip(masked[1], masked[2]) if int(hh) == h}
                kept = [t for t in range(n) if t not in gone]
                tied = [int(t) for t in np.flatnonzero(np.abs(score[h][:n] - args.threshold) <= TIE * abs(args.threshold))]
                heads.append({"kept": kept, "budget": len(kept), "tied": tied})
            layers.append(heads)
        return layers

    out = {"format": "akv-golden", "version": 1, "torch": torch.__version__, "dump": Path(args.dump).name,
           "fit": Path(args.fit).name, "threshold": args.threshold, "window": args.window, "sinks": 0,
           "tie_tolerance": TIE, "runs": {"prefill": run(False), "decoding": run(True)}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
