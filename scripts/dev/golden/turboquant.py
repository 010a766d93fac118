#!/usr/bin/env python3
"""Golden data for akv's TurboQuant rows (lib/akv/tensor/turboquant.h, tests/unit/test_quant.cpp)
from vLLM's TurboQuant code:

  scripts/dev/golden/turboquant.py CENTROIDS_PY OUT.json [--commit C] [--seed 7]

CENTROIDS_PY is vllm/model_executor/layers/quantization/turboquant/centroids.py of a vLLM
checkout, imported unmodified (it needs torch only: Debian's python3-torch). Its solve_lloyd_max
gives the Lloyd-Max levels for head_dim 8, 64 and 128 at 2, 3 and 4 bits.

vLLM stores and reads the rows in Triton kernels (vllm/v1/attention/ops/triton_turboquant_store.py
and triton_turboquant_decode.py), which do not run on a CPU. Their arithmetic is transcribed here
in torch f32, step for step (a transcription, not vLLM's code running):
  keys: norm = |k| (torch's norm), x = k / (norm + 1e-8), y = x @ H (H the Sylvester Hadamard
  matrix / sqrt(d), vLLM's serving rotation), index = the number of midpoints (c_i + c_{i+1}) / 2
  (f32) that are <= y (the kernel's binary search), norm stored as f16; read back as centroid[index],
  norm-corrected (c / sqrt(sum c^2 + 1e-16)) for the _nc presets, times the f16 norm, @ H;
  values: scale = (max - min) / (2^b - 1) (at least 1e-8), q = trunc((v - min) / scale + 0.5)
  clamped, scale and min stored as f16, read back as q * scale + min.
Inputs: normal keys and values with an outlier channel, a zero key row and an all-equal value row.
Values are written as the hex of their f32 bit patterns (f16 fields: of their u16 bits). Nothing of
vLLM is copied: OUT.json holds numbers only.
"""
import argparse
import importlib.util
import json
import math

import numpy as np
import torch


def hex32(a):
    return [format(int(x), "08x") for x in np.asarray(a, dtype=np.float32).view(np.uint32).ravel()]


def hex16(t):
    return [format(int(x), "04x") for x in t.numpy().astype(np.float16).view(np.uint16).ravel()]


def hadamard(d):
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("centroids_py")
    ap.add_argument("out")
    ap.add_argument("--commit", default="")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("vllm_tq_centroids", a.centroids_py)
    centroids_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(centroids_mod)

    out = {"format": "akv-golden-turboquant", "source": "vLLM " + (a.commit or "(commit not given)"),
           "codebooks": [], "cases": []}
    for d in (8, 64, 128):
        for bits in (2, 3, 4):
            c, _ = centroids_mod.solve_lloyd_max(d, bits)
            out["codebooks"].append({"head_dim": d, "bits": bits, "centroids": hex32(c.numpy())})

    rng = np.random.default_rng(a.seed)
    for d, kb, vb, nc in ((128, 4, 4, True), (128, 3, 4, True), (128, 3, 3, True), (64, 3, 4, False),
                          (64, 2, 2, True)):
        n = 6
        k = rng.standard_normal((n, d)).astype(np.float32)
        k[:, 3] *= 12.0  # an outlier channel
        k[4] = 0.0
        v = (rng.standard_normal((n, d)) * 0.7 + 0.2).astype(np.float32)
        v[5] = 0.25
        kt, vt = torch.from_numpy(k), torch.from_numpy(v)
        h = hadamard(d)
        c, _ = centroids_mod.solve_lloyd_max(d, kb)
        mid = (c[:-1] + c[1:]) / 2
        norms = kt.norm(dim=1, keepdim=True)
        y = (kt / (norms + 1e-8)) @ h
        idx = (y.unsqueeze(-1) >= mid).sum(-1)
        norm16 = norms.squeeze(1).half()
        cv = c[idx]
        if nc:
            cv = cv * (1.0 / torch.sqrt((cv * cv).sum(1, keepdim=True) + 1e-16))
        khat = (norm16.float().unsqueeze(1) * cv) @ h
        levels = float(2**vb - 1)
        vmin = vt.min(dim=1, keepdim=True).values
        vmax = vt.max(dim=1, keepdim=True).values
        scale = (vmax - vmin) / levels
        scale = torch.where(scale > 1e-8, scale, torch.full_like(scale, 1e-8))
        q = torch.clamp(((vt - vmin) / scale + 0.5).to(torch.int32), 0, int(levels))
        s16, z16 = scale.half(), vmin.half()
        vhat = q.float() * s16.float() + z16.float()
        out["cases"].append({
            "head_dim": d, "bits_key": kb, "bits_value": vb, "norm_correction": nc, "rows": n,
            "keys": hex32(k), "values": hex32(v), "y": hex32(y.numpy()), "key_index": idx.numpy().ravel().tolist(),
            "key_norm_f16": hex16(norm16), "keys_read": hex32(khat.numpy()),
            "value_codes": q.numpy().ravel().tolist(), "value_scale_f16": hex16(s16), "value_min_f16": hex16(z16),
            "values_read": hex32(vhat.numpy())})
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
