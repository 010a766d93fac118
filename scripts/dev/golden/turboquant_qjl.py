#!/usr/bin/env python3
"""Golden data for akv's TurboQuant keys with a QJL residual (TQ<b>J, lib/akv/tensor/turboquant.h;
tests/unit/test_golden.cpp) from turboquant-pytorch, the code vLLM's TurboQuant cites:

  scripts/dev/golden/turboquant_qjl.py COMPRESSORS_PY CENTROIDS_PY OUT.json [--commit C] [--seed 11]

COMPRESSORS_PY is turboquant/compressors.py of tonbistudio/turboquant-pytorch, imported unmodified
(torch and scipy: Debian's python3-torch, python3-scipy): its TurboQuantCompressorV2 stores keys as
TurboQuant_prod does (the paper's Algorithm 2): norm, a random rotation Pi, (b - 1)-bit Lloyd-Max
indices, the residual r = x - x_mse, the signs of S r (S Gaussian d x d) and |r|, and scores
queries by the asymmetric estimator <q, x_mse> + |r| sqrt(pi/2) / d <S q, signs>.
CENTROIDS_PY is vLLM's turboquant/centroids.py: its solve_lloyd_max levels (what akv uses) replace
the compressor's own (scipy quad) after construction, the one stand-in.

akv's cache rotates rows itself and its row type sees them rotated: each case gives akv the rows
x Pi^T and the projection S Pi^T, so that its signs are those of the same S r. Exported per case:
the rows, the rotated rows, S Pi^T, queries and their rotations, and the reference's signs, |r|
(f16) and scores, with its indices, rotated coordinates and projections recomputed by its own
steps (compress() returns none of them; they give the tie margins).
Values are the hex of their f32 bit patterns (f16 fields: of their u16 bits). Nothing of either
repository is copied: OUT.json holds numbers only.
"""
import argparse
import importlib.util
import json

import numpy as np
import torch


def hex32(a):
    return [format(int(x), "08x") for x in np.asarray(a, dtype=np.float32).view(np.uint32).ravel()]


def hex16(t):
    return [format(int(x), "04x") for x in t.numpy().astype(np.float16).view(np.uint16).ravel()]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("compressors_py")
    ap.add_argument("centroids_py")
    ap.add_argument("out")
    ap.add_argument("--commit", default="")
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    comp_mod = load(a.compressors_py, "tq_pytorch_compressors")
    cent_mod = load(a.centroids_py, "vllm_tq_centroids")

    out = {"format": "akv-golden-turboquant-qjl",
           "source": "tonbistudio/turboquant-pytorch " + (a.commit or "(commit not given)"), "cases": []}
    rng = np.random.default_rng(a.seed)
    for d, bits in ((128, 3), (64, 4), (64, 2), (8, 3)):
        n, nq = 6, 3
        x = rng.standard_normal((n, d)).astype(np.float32)
        x[:, 1] *= 9.0  # an outlier channel
        x[2] *= 0.01
        x[4] = 0.0  # a zero row: residual 0, every sign +1
        q = rng.standard_normal((nq, d)).astype(np.float32)
        comp = comp_mod.TurboQuantCompressorV2(d, bits, seed=1000 + d + bits)
        comp.centroids = cent_mod.solve_lloyd_max(d, comp.mse_bits)[0]
        xt = torch.from_numpy(x)
        states = xt.reshape(1, 1, n, d)
        c = comp.compress(states)
        scores = comp.asymmetric_attention_scores(torch.from_numpy(q).reshape(1, 1, nq, d), c).reshape(nq, n)
        pi, s = comp.Pi, comp.S
        x_rot = xt @ pi.T
        s_rot = s @ pi.T
        q_rot = torch.from_numpy(q) @ pi.T
        # For the tie margins: the normalized rotated coordinates the indices come from, and the
        # projections the signs come from (the compressor's own steps, repeated here).
        norms = torch.norm(xt, dim=-1, keepdim=True)
        y = (xt / (norms + 1e-8)) @ pi.T
        idx = (y.unsqueeze(-1) - comp.centroids).abs().argmin(dim=-1)
        k_mse = (comp.centroids[idx] @ pi) * norms
        projected = (xt - k_mse) @ s.T
        out["cases"].append({
            "head_dim": d, "bits": bits, "rows": n, "queries": nq,
            "x": hex32(x), "x_rot": hex32(x_rot.numpy()), "s_rot": hex32(s_rot.numpy()),
            "q": hex32(q), "q_rot": hex32(q_rot.numpy()), "y": hex32(y.numpy()),
            "index": idx.numpy().ravel().tolist(),
            "signs": c["qjl_signs"].reshape(n, d).numpy().ravel().tolist(),
            "projected": hex32(projected.numpy()),
            "residual_norm_f16": hex16(c["residual_norm"].reshape(n)),
            "scores": hex32(scores.numpy())})
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
