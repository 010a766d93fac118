"""h5py <-> akv interop, with independent numpy references.

usage: interop.py AKV TMPDIR
1. akv synth writes dumps; h5py reads them: attributes, shapes, dtypes, head kinds, and values:
   keys equal a numpy RoPE of key_pre_rope, and retrieval heads attend to the needles.
2. h5py writes a dump from numpy arrays (f32, f64, f16); akv info --json --stats reads it and
   its statistics equal numpy's.
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import make_dumps  # noqa: E402

AKV, TMP = sys.argv[1], sys.argv[2]


def rope(x, theta, layout):
    """RoPE in float64 for x [heads, tokens, dim] at positions 0..tokens-1."""
    d = x.shape[-1]
    half = d // 2
    freq = theta ** (-np.arange(half) * 2.0 / d)
    ang = np.arange(x.shape[1])[:, None] * freq[None, :]
    c, s = np.cos(ang), np.sin(ang)
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :half], x[..., half:]
    ra, rb = a * c - b * s, a * s + b * c
    out = np.empty_like(x)
    if layout == "interleaved":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :half], out[..., half:] = ra, rb
    return out


def check_synth(layout):
    path = os.path.join(TMP, f"synth-{layout}.h5")
    subprocess.run([AKV, "synth", "-o", path, "--layers", "2", "--heads", "8", "--kv-heads", "4",
                    "--head-dim", "32", "--tokens", "900", "--window", "16", "--pre-rope",
                    "--rope-layout", layout, "--seed", "5", "-q"], check=True,
                   stdout=subprocess.DEVNULL)
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert a["format"] == "akv-dump" and a["version"] == 1, dict(a)
        assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["head_dim"], a["n_tokens"]) == \
            (2, 8, 4, 32, 900)
        assert a["rope_layout"] == layout
        needles = f["needles"][:]
        assert len(needles) > 0 and needles.max() < 900
        for l in range(2):
            g = f[f"layers/{l}"]
            assert g["key"].shape == (4, 900, 32) and g["key"].dtype == np.float16
            assert g["value"].shape == (4, 900, 32)
            assert g["query"].shape == (8, 16, 32)
            kinds = [k.decode() if isinstance(k, bytes) else k for k in g["head_kind"][:]]
            assert set(kinds) <= {"local", "retrieval", "diffuse"}, kinds
            key = g["key"][:].astype(np.float64)
            pre = g["key_pre_rope"][:].astype(np.float64)
            ref = rope(pre, float(a["rope_theta"]), layout)
            # Both tensors were rounded to f16 separately: allow a few f16 ulps of the head's range.
            tol = 4 * 2.0 ** -10 * np.abs(key).max(axis=(1, 2), keepdims=True)
            assert np.all(np.abs(key - ref) <= tol), float(np.abs(key - ref).max())
            q = g["query"][:].astype(np.float64)
            needle_mass = []
            for h in range(8):
                kv = h // 2
                if kinds[kv] != "retrieval":
                    continue
                logits = q[h] @ key[kv].T / np.sqrt(32)
                pos = np.arange(900 - 16, 900)
                logits[np.arange(900)[None, :] > pos[:, None]] = -np.inf
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                mass = p[:, needles].sum(axis=1).mean()
                sinks = p[:, :4].sum(axis=1).mean()
                assert mass + sinks > 0.9, (l, h, mass, sinks)
                needle_mass.append(mass)
            assert not needle_mass or np.mean(needle_mass) > 0.6, needle_mass


def check_h5py_written():
    path = os.path.join(TMP, "numpy.h5")
    make_dumps.write_valid(path, np.random.default_rng(1))
    out = subprocess.run([AKV, "info", "--json", "--stats", path], check=True,
                         capture_output=True, text=True).stdout
    j = json.loads(out)
    assert j["model"] == "h5py-made" and j["n_query"] == make_dumps.Q
    with h5py.File(path, "r") as f:
        for l in range(make_dumps.L):
            lj = j["layers"][l]
            assert lj["key"]["dtype"] == "f32" and lj["value"]["dtype"] == "f64"
            assert lj["query"]["dtype"] == "f16"
            assert lj["head_kinds"] == ["local", "retrieval"]
            for name in ("key", "value", "query"):
                x = f[f"layers/{l}/{name}"][:].astype(np.float32).astype(np.float64)
                s = lj["stats"][name]
                assert list(f[f"layers/{l}/{name}"].shape) == lj[name]["shape"]
                for stat, ref in (("min", x.min()), ("max", x.max()), ("mean", x.mean()),
                                  ("std", x.std()), ("absmax", np.abs(x).max())):
                    assert abs(s[stat] - ref) <= 1e-9 + 1e-9 * abs(ref), (l, name, stat, s[stat], ref)


check_synth("interleaved")
check_synth("rotate-half")
check_h5py_written()
print("interop ok")
