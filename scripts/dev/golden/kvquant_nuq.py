#!/usr/bin/env python3
"""Golden data for akv's KVQuant nuq numerics (lib/akv/quant/nuq.h; tests/unit/test_golden.cpp)
from KVQuant's simulated-quantization module:

  scripts/dev/golden/kvquant_nuq.py SIMQUANT_PY DUMP OUT.json [--commit C]

SIMQUANT_PY is quant/kvquant/simquant_module_quantizer.py of a KVQuant checkout
(SqueezeAILab/KVQuant), imported unmodified (numpy, torch and scikit-learn: Debian's python3-torch
and python3-sklearn). In each case one layer of DUMP, its pre-RoPE keys or its values laid out as
KVQuant's k_proj / v_proj outputs ([tokens, n_kv_heads * head_dim], the heads side by side), is
  - calibrated by SimQuant.quantize (keys per channel over the tokens, values per token over the
    channels; dense-and-sparse outliers at sparsity threshold 0.99, nuq levels by scikit-learn's
    KMeans, no Fisher weights, the first token kept exact: first_few_fp16=1), then
  - quantized by QuantLinearSim.forward with that quantizer (keys: the calibrated per-channel
    thresholds, values: per-token thresholds of the row itself), its projection an identity;
    values also one KV head at a time (rows [tokens, head_dim] with the layer's levels: the
    per-token thresholds of akv's per-head caches).
The one stand-in: QuantLinearSim multiplies in half precision, which torch's CPU backend lacks;
Tensor.__matmul__ on half tensors computes in f32 and rounds to f16 (exact with an identity), and
Tensor.cuda is the identity. Written per case: the thresholds (keys; f64 bits as hex, as
SimQuant returns them), the levels as fitted (f32 bits, scikit-learn's order), their k-means cost
over the calibration values, and the reconstructed rows (f16 bits, one hex string). "weighted":
two fits with Fisher weights 1 + x^2 (their levels and weighted k-means cost). Numbers only:
nothing of KVQuant is copied.
"""
import argparse
import importlib.util
import json

import h5py
import numpy as np
import torch

CASES = [(0, "key", 3), (0, "value", 3), (1, "key", 4), (1, "value", 4)]
# Sensitivity-weighted fits (KVQuant's Fisher information), with the weights 1 + x^2 of each
# element in f32 (any positive weights exercise the weighted k-means; akv's test makes the same).
WEIGHTED = [(0, "key", 3), (1, "value", 4)]
SPARSITY = 0.99
SINK = 1


def hex32(a):
    return [format(int(x), "08x") for x in np.asarray(a, dtype=np.float32).ravel().view(np.uint32)]


def hex64(a):
    return [format(int(x), "016x") for x in np.asarray(a, dtype=np.float64).ravel().view(np.uint64)]


def hex16_string(a):
    return "".join(format(int(x), "04x") for x in np.asarray(a, dtype=np.float16).ravel().view(np.uint16))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("simquant_py")
    ap.add_argument("dump")
    ap.add_argument("out")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()

    matmul = torch.Tensor.__matmul__

    def half_matmul(x, y):
        if x.dtype == torch.float16 or y.dtype == torch.float16:
            return matmul(x.float(), y.float()).half()
        return matmul(x, y)

    torch.Tensor.__matmul__ = half_matmul
    torch.Tensor.cuda = lambda self, *args, **kw: self

    spec = importlib.util.spec_from_file_location("kvquant_simquant", a.simquant_py)
    sq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sq)

    out = {"format": "akv-golden-kvquant-nuq", "source": "KVQuant " + (a.commit or "(commit not given)"),
           "dump": a.dump, "sparsity_threshold": SPARSITY, "first_few_fp16": SINK, "cases": []}
    with h5py.File(a.dump, "r") as f:
        for layer, tensor, bits in CASES:
            name = "key_pre_rope" if tensor == "key" else "value"
            x = np.asarray(f[f"layers/{layer}/{name}"], dtype=np.float32)  # [kv heads, tokens, head_dim]
            rows = np.ascontiguousarray(x.transpose(1, 0, 2).reshape(x.shape[1], -1))  # [tokens, C]
            C = rows.shape[1]
            per_channel = tensor == "key"
            lin = torch.nn.Linear(C, C, bias=False)
            with torch.no_grad():
                lin.weight.copy_(torch.eye(C))
            cal = sq.SimQuant(lin, bits, perchannel=True, qchannel=0 if per_channel else -1)
            cal.add_batch(None, torch.tensor(rows))
            upper, lower, centroids = cal.quantize(include_sparse=True, sparsity_threshold=SPARSITY, nuq=True,
                                                   fisher=None, norm=False, cap_outliers=False,
                                                   first_few_fp16=SINK)
            levels = np.asarray(centroids[0], dtype=np.float32).ravel()
            # The k-means cost of the fitted levels over the values KMeans saw (the same selection
            # as SimQuant.quantize: normalized by the thresholds, outliers and the first token out).
            up = np.asarray(upper, dtype=np.float64).ravel()
            lo = np.asarray(lower, dtype=np.float64).ravel()
            axis = 0 if per_channel else -1
            zp = np.expand_dims((up + lo) / 2, axis)
            rg = np.expand_dims((up - lo) / 2, axis)
            norm = (rows.astype(np.float64) - zp) / rg
            keep = np.abs(norm) <= 1
            keep[:SINK, :] = False
            v = norm[keep]
            cost = float(np.min((v[:, None] - levels[None, :].astype(np.float64)) ** 2, axis=1).sum())
            sim = sq.QuantLinearSim(f"layers.{layer}.{tensor}", bits, (upper, lower, centroids), C, C, lin.weight.half(),
                                    False, perchannel=per_channel, include_sparse=True,
                                    sparsity_threshold=SPARSITY, dynamicquantization=not per_channel, nuq=True,
                                    nf_nuq=False, norm=False, first_few_fp16=SINK, cap_outliers=-1, clamp=False)
            with torch.no_grad():
                y = sim(torch.tensor(rows))
            case = {"layer": layer, "tensor": tensor, "bits": bits, "tokens": rows.shape[0], "channels": C,
                    "levels": hex32(levels), "kmeans_cost": cost, "kmeans_values": int(v.size),
                    "reconstruction": hex16_string(y.numpy())}
            if per_channel:
                case["upper"] = hex64(upper)
                case["lower"] = hex64(lower)
            else:
                # akv's caches hold each KV head apart: the values of each head quantized per token
                # over its own head_dim channels, with the layer's levels (the same module on
                # rows [tokens, head_dim]); the heads' rows one after another.
                H, n, d = x.shape
                heads = []
                for h in range(H):
                    lin_h = torch.nn.Linear(d, d, bias=False)
                    with torch.no_grad():
                        lin_h.weight.copy_(torch.eye(d))
                    sim_h = sq.QuantLinearSim(f"layers.{layer}.{tensor}.{h}", bits, (upper, lower, centroids), d, d,
                                              lin_h.weight.half(), False, perchannel=False, include_sparse=True,
                                              sparsity_threshold=SPARSITY, dynamicquantization=True, nuq=True,
                                              nf_nuq=False, norm=False, first_few_fp16=SINK, cap_outliers=-1,
                                              clamp=False)
                    with torch.no_grad():
                        heads.append(sim_h(torch.tensor(np.ascontiguousarray(x[h]))).numpy())
                case["per_head_reconstruction"] = hex16_string(np.stack(heads))
            out["cases"].append(case)
        out["weighted"] = []
        for layer, tensor, bits in WEIGHTED:
            name = "key_pre_rope" if tensor == "key" else "value"
            x = np.asarray(f[f"layers/{layer}/{name}"], dtype=np.float32)
            rows = np.ascontiguousarray(x.transpose(1, 0, 2).reshape(x.shape[1], -1))
            C = rows.shape[1]
            per_channel = tensor == "key"
            weights = (np.float32(1) + rows * rows).astype(np.float32)
            lin = torch.nn.Linear(C, C, bias=False)
            cal = sq.SimQuant(lin, bits, perchannel=True, qchannel=0 if per_channel else -1)
            cal.add_batch(None, torch.tensor(rows))
            upper, lower, centroids = cal.quantize(include_sparse=True, sparsity_threshold=SPARSITY, nuq=True,
                                                   fisher=torch.tensor(weights), norm=False, cap_outliers=False,
                                                   first_few_fp16=SINK)
            levels = np.asarray(centroids[0], dtype=np.float32).ravel()
            up = np.asarray(upper, dtype=np.float64).ravel()
            lo = np.asarray(lower, dtype=np.float64).ravel()
            axis = 0 if per_channel else -1
            norm = (rows.astype(np.float64) - np.expand_dims((up + lo) / 2, axis)) / np.expand_dims((up - lo) / 2, axis)
            keep = np.abs(norm) <= 1
            keep[:SINK, :] = False
            v = norm[keep].astype(np.float32).astype(np.float64)
            w = weights[keep].astype(np.float64)
            cost = float((w * np.min((v[:, None] - levels[None, :].astype(np.float64)) ** 2, axis=1)).sum())
            out["weighted"].append({"layer": layer, "tensor": tensor, "bits": bits, "weights": "1 + x^2 (f32)",
                                    "levels": hex32(levels), "kmeans_cost": cost, "kmeans_values": int(v.size)})
    with open(a.out, "w") as fo:
        json.dump(out, fo, indent=1)
        fo.write("\n")


if __name__ == "__main__":
    main()
