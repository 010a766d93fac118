"""Writes akv dumps with h5py and numpy alone (no akv involved), valid and damaged.

usage: make_dumps.py OUT_DIR
Writes valid.h5 (a small, complete dump in several storage types) and one damaged variant per
validation rule of the dump reader; bad_cases.txt lists "file|expected message regex".
"""
import os
import shutil
import sys

import h5py
import numpy as np

L, H, HKV, D, T, Q = 2, 4, 2, 16, 48, 6


def write_valid(path, rng):
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "akv-dump"
        f.attrs["version"] = 1
        f.attrs["model"] = "h5py-made"
        f.attrs["n_layers"] = L
        f.attrs["n_heads"] = H
        f.attrs["n_kv_heads"] = HKV
        f.attrs["head_dim"] = D
        f.attrs["rope_theta"] = 10000.0
        f.attrs["rope_layout"] = "interleaved"
        f.attrs["n_tokens"] = T
        for l in range(L):
            g = f.create_group(f"layers/{l}")
            # Mixed storage types, as numpy users produce them.
            g["key"] = rng.standard_normal((HKV, T, D)).astype(np.float32)
            g["value"] = rng.standard_normal((HKV, T, D))  # float64
            g["query"] = rng.standard_normal((H, Q, D)).astype(np.float16)
            g["head_kind"] = ["local", "retrieval"]
        f["tokens"] = np.arange(T, dtype=np.int64)
        f["needles"] = np.array([5, 20], dtype=np.int32)


def main(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    valid = os.path.join(out, "valid.h5")
    write_valid(valid, rng)
    cases = []

    def variant(name, pattern, edit):
        path = os.path.join(out, name + ".h5")
        shutil.copy(valid, path)
        with h5py.File(path, "a") as f:
            edit(f)
        cases.append((name + ".h5", pattern))

    def replace(f, name, data):
        del f[name]
        f[name] = data

    variant("missing_attr", r"missing attribute .*: rope_theta\)",
            lambda f: f.attrs.__delitem__("rope_theta"))
    variant("no_format", r"not an akv file", lambda f: f.attrs.__delitem__("format"))
    variant("other_format", r"unknown akv file format .*format = spreadsheet\)",
            lambda f: f.attrs.__setitem__("format", "spreadsheet"))
    variant("version2", r"unsupported akv-dump version .*version = 2\)",
            lambda f: f.attrs.__setitem__("version", 2))
    variant("string_int_attr", r"attribute must be an integer .*n_layers",
            lambda f: f.attrs.__setitem__("n_layers", "two"))
    variant("heads_not_multiple", r"n_heads must be a multiple of n_kv_heads .*n_heads = 3\)",
            lambda f: f.attrs.__setitem__("n_heads", 3))
    variant("kv_heads_mismatch",
            r"layer 1 key has 3 kv heads, meta says 2 .*/layers/1/key.shape = \[3, 48, 16\]",
            lambda f: replace(f, "layers/1/key", np.zeros((3, T, D), np.float32)))
    variant("tokens_mismatch", r"layer 0 value has 40 tokens, expected 48",
            lambda f: replace(f, "layers/0/value", np.zeros((HKV, 40, D), np.float32)))
    variant("head_dim_mismatch", r"layer 1 query has head_dim 8, meta says 16",
            lambda f: replace(f, "layers/1/query", np.zeros((H, Q, 8), np.float32)))
    variant("rank", r"layer 0 key must have rank 3",
            lambda f: replace(f, "layers/0/key", np.zeros((HKV, T * D), np.float32)))
    variant("missing_dataset", r"missing dataset .*/layers/1/value\)",
            lambda f: f.__delitem__("layers/1/value"))
    variant("missing_layer", r"missing layer group .*/layers/1\)",
            lambda f: f.__delitem__("layers/1"))
    variant("int_dtype", r"unsupported dtype .*/layers/0/key.dtype",
            lambda f: replace(f, "layers/0/key", np.zeros((HKV, T, D), np.int32)))
    variant("bad_layout", r"unknown RoPE layout .*rope_layout = neox\)",
            lambda f: f.attrs.__setitem__("rope_layout", "neox"))
    variant("needle_range", r"needle position out of range .*/needles\[1\] = 48\)",
            lambda f: replace(f, "needles", np.array([3, 48], np.int32)))
    variant("tokens_length", r"/tokens length differs from n_tokens",
            lambda f: replace(f, "tokens", np.arange(10, dtype=np.int32)))

    variant("huge_n_layers", r"missing layer group .*/layers/2\)",
            lambda f: f.attrs.__setitem__("n_layers", 2**31 - 1))

    def unwritten(f):
        # Declared [2, 2^30, 16] f32 (128 GiB), never written: refused before any allocation.
        f.attrs["n_tokens"] = 2**30
        for l in range(2):
            for name in ("key", "value"):
                del f[f"layers/{l}/{name}"]
                f.create_dataset(f"layers/{l}/{name}", (HKV, 2**30, D), np.float32)

    variant("unwritten", r"dataset stores fewer bytes than its shape declares .*/layers/0/key = 0 bytes stored",
            unwritten)

    def put_nan(f):
        v = f["layers/1/value"][...]
        v[1, 30, 7] = np.nan
        replace(f, "layers/1/value", v)

    def put_inf(f):
        q = f["layers/0/query"][...]
        q[2, 4, 0] = -np.inf
        replace(f, "layers/0/query", q)

    variant("nan", r"non-finite value in layer 1 head 1 token 30 .*/layers/1/value\[1, 30, 7\] = nan\)",
            put_nan)
    variant("inf", r"non-finite value in layer 0 head 2 query 4 \(position 46\) .*= -inf\)", put_inf)

    trunc = os.path.join(out, "truncated.h5")
    with open(valid, "rb") as src:
        data = src.read()
    with open(trunc, "wb") as dst:
        dst.write(data[: len(data) // 2])
    cases.append(("truncated.h5", r"truncated or damaged"))
    with open(os.path.join(out, "text.h5"), "w") as f:
        f.write("layer,head,value\n0,0,1.0\n")
    cases.append(("text.h5", r"not an HDF5 file"))

    with open(os.path.join(out, "bad_cases.txt"), "w") as f:
        for name, pattern in cases:
            f.write(f"{name}|{pattern}\n")


if __name__ == "__main__":
    main(sys.argv[1])
