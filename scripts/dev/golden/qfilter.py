#!/usr/bin/env python3
"""Runs the Q-Filters authors' make_filters.py (NathanGodey/qfilters) on the queries of akv dumps, then
NVIDIA/kvpress's QFilterPress with those filters on a dump's keys, and writes the filters and what the
press keeps, per layer and KV head, as golden data for akv's tests (tests/unit/test_golden.cpp):

  make_filters.py  ->  `akv calibrate DUMP...`'s per-head `qfilter`
  QFilterPress (compression ratio --ratio)  ->  `akv compress DUMP --method qfilter` (budget 1 - ratio)

  scripts/dev/golden/qfilter.py QFILTERS_CHECKOUT KVPRESS_CHECKOUT OUT.json DUMP... [--ratio 0.75]

make_filters.py runs unmodified (runpy, as __main__); what it loads is stood in for: the model class
(its `modeling` package is not imported) returns, for the i-th "text" of the dataset, the i-th dump's
queries (after RoPE, [1, n_heads, n_query, head_dim] in f32) and keys (read for their number of heads)
as the (query, key) pairs its patched Llama puts in past_key_values, and the tokenizer n_query tokens; datasets, tqdm and huggingface_hub
(PyTorchModelHubMixin: save_pretrained writes the parameter with torch.save) are stand-ins, and
Tensor.cuda is the identity (no GPU). --num_sequences is the number of dumps + 1 (the script uses
sample_count < num_sequences) and --num_svd_samples covers every row, so its random subset is all
of them (shuffled; the SVD does not depend on the order). Every dump must have the same n_query.
QFilterPress (kvpress 8bb29b9) is handed the filters instead of loading them from the Hub
(post_init_from_model) and scores the last dump's keys in f32; kept positions are found by
matching the kept key rows. Nothing of either repository is copied: OUT.json holds numbers only.

For each head OUT.json also records the press's score of the lowest kept token (`cutoff`) and every
position whose score lies within a relative 1e-5 of it (`tied`): either side may keep any of them.
Needs torch (Debian's python3-torch) and h5py.
"""
import argparse
import importlib
import json
import runpy
import sys
import tempfile
import types
from pathlib import Path

import h5py
import numpy as np
import torch
from reference import StandIn, commit_of, source_packages

TIE = 1e-5


class HubMixin:
    """huggingface_hub.PyTorchModelHubMixin: save_pretrained keeps the parameters on disk."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__()

    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "state.pt")


def dump_queries(paths):
    out = []
    for p in paths:
        with h5py.File(p, "r") as f:
            n_layers = int(f.attrs["n_layers"])
            out.append([(torch.from_numpy(f[f"layers/{l}/query"][...].astype(np.float32)),
                         torch.from_numpy(f[f"layers/{l}/key"][...].astype(np.float32))) for l in range(n_layers)])
    return out


class FakeModel:
    """What make_filters.py reads of a causal LM: .model.layers and past_key_values = (query, key) pairs."""

    def __init__(self, queries):
        self.queries = queries
        self.model = types.SimpleNamespace(layers=list(range(len(queries[0]))))

    def eval(self):
        return self

    def __call__(self, input_ids):
        i = int(input_ids[0, 0])
        return types.SimpleNamespace(past_key_values=[(q[None], k[None]) for q, k in self.queries[i]])


def stand_ins(queries):
    n = queries[0][0][0].shape[1]
    hub = StandIn("huggingface_hub")
    hub.PyTorchModelHubMixin = HubMixin
    sys.modules["huggingface_hub"] = hub
    tqdm = StandIn("tqdm")
    tqdm.tqdm = lambda it, *a, **k: it
    sys.modules["tqdm"] = tqdm
    transformers = StandIn("transformers")
    transformers.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *a, **k: (
        lambda text, return_tensors=None: types.SimpleNamespace(input_ids=torch.full((1, n), int(text)))))
    sys.modules["transformers"] = transformers
    for name in ("transformers.models", "transformers.models.llama", "transformers.models.llama.modeling_llama",
                 "transformers.models.gemma3", "transformers.models.gemma3.modeling_gemma3",
                 "transformers.models.phi3", "transformers.models.phi3.modeling_phi3",
                 "transformers.models.qwen3", "transformers.models.qwen3.modeling_qwen3"):
        sys.modules[name] = StandIn(name)
    datasets = StandIn("datasets")
    datasets.load_dataset = lambda *a, **k: [{"text": str(i)} for i in range(len(queries))]
    sys.modules["datasets"] = datasets
    modeling = StandIn("modeling")
    modeling.Dumps = types.SimpleNamespace(from_pretrained=lambda *a, **k: FakeModel(queries))
    sys.modules["modeling"] = modeling
    torch.Tensor.cuda = lambda self, *a, **k: self


def make_filters(checkout, queries):
    """The filters [n_layers, n_kv_heads, head_dim] make_filters.py writes."""
    n = queries[0][0][0].shape[1]
    if any(q[0][0].shape[1] != n for q in queries):
        sys.exit("every dump must have the same n_query")
    rows = n * len(queries)
    sys.path.insert(0, str(checkout))
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = ["make_filters.py", "--model_name", "akv/dumps", "--model_cls", "Dumps", "--max_seq_len", str(n),
                    "--num_sequences", str(len(queries) + 1), "--num_svd_samples", str(rows), "--dataset_name",
                    "dumps", "--save_dir", tmp, "--torch_dtype", "float32"]
        torch.manual_seed(0)
        runpy.run_path(str(Path(checkout) / "make_filters.py"), run_name="__main__")
        return torch.load(Path(tmp) / "dumps_qfilt" / "state.pt")["q_filters"]


def press_entry(kvpress, filters, dump, ratio):
    source_packages(kvpress, ("kvpress", "kvpress.presses"))
    press = importlib.import_module("kvpress.presses.qfilter_press").QFilterPress(compression_ratio=ratio)
    press.q_filters = filters.float()
    layers = []
    with h5py.File(dump, "r") as f:
        n_layers, n_kv, d, n = (int(f.attrs[k]) for k in ("n_layers", "n_kv_heads", "head_dim", "n_tokens"))
        for layer in range(n_layers):
            key = torch.from_numpy(f[f"layers/{layer}/key"][...].astype(np.float32))[None]
            value = torch.from_numpy(f[f"layers/{layer}/value"][...].astype(np.float32))[None]
            module = types.SimpleNamespace(layer_idx=layer, head_dim=d)
            score = press.score(module, None, key, value, None, {})[0].numpy()
            kept_keys, _ = press.compress(module, None, key, value, None, {})
            heads = []
            for h in range(n_kv):
                rows = key[0, h].numpy()
                kept = sorted(int(np.flatnonzero((rows == row).all(axis=1))[0]) for row in kept_keys[0, h].numpy())
                cutoff = min(float(score[h, t]) for t in kept)
                tied = [int(t) for t in np.flatnonzero(np.abs(score[h] - cutoff) <= TIE * abs(cutoff))]
                heads.append({"kept": kept, "budget": len(kept), "cutoff": cutoff, "tied": tied})
            layers.append(heads)
    return {"reference": "NVIDIA/kvpress QFilterPress", "commit": commit_of(kvpress), "budget": 1 - ratio,
            "window": 0, "sinks": 0, "layers": layers}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qfilters")
    ap.add_argument("kvpress")
    ap.add_argument("out")
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--ratio", type=float, default=0.75, help="kvpress compression_ratio (akv budget 1 - ratio)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    queries = dump_queries(args.dumps)
    stand_ins(queries)
    filters = make_filters(args.qfilters, queries)
    out = {"format": "akv-golden", "version": 1, "torch": torch.__version__,
           "dumps": [Path(p).name for p in args.dumps], "dump": Path(args.dumps[-1]).name,
           "budget": 1 - args.ratio, "tie_tolerance": TIE,
           "filters": {"reference": "NathanGodey/qfilters make_filters.py", "commit": commit_of(args.qfilters),
                       "rows": int(queries[0][0][0].shape[1]) * len(queries), "values": filters.tolist()},
           "methods": {"qfilter": press_entry(args.kvpress, filters, args.dumps[-1], args.ratio)}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
