#!/usr/bin/env python3
"""Dequantizes random ggml blocks with gguf-py (llama.cpp's Python package, gguf-py/gguf/quants.py)
and writes the blocks and the f32 values as golden data for akv's GGUF reader
(tests/unit/test_gguf.cpp, lib/akv/tensor/ggml_blocks.h):

  scripts/dev/golden/ggml_dequant.py GGUF_PY_DIR OUT.json [--commit C] [--seed 1] [--quantize QOUT.json]

GGUF_PY_DIR is the gguf-py directory of a llama.cpp checkout (it holds gguf/quants.py). The
module is imported unmodified, without running the package's __init__ (which pulls in the
writer, the reader and the vocabulary code): only gguf.quants and what it imports
(gguf.constants, gguf.lazy). Nothing of it is copied; OUT.json holds numbers only.

Blocks per type: for the types gguf-py can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16, F16),
normal random data quantized by gguf-py; for every quantized type also random bytes with the
f16 scale fields set to random finite values, so that every code and scale pattern occurs.
Values are stored as the hex of their f32 bit patterns, blocks as hex bytes.

--quantize QOUT.json: f32 rows (normal, scaled, with ties, zeros, one large value, all-equal)
and their blocks as gguf-py's reference quantizers make them (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), for
akv's ggml KV cache types (lib/akv/tensor/ggml_quant.h). gguf-py computes Q4_0 and Q5_0 codes in
f64 (its comment: the C reference "depends on FMA"); akv uses one f32 fused multiply-add, as an
x86 build of ggml with FMA does.
"""
import argparse
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np

from reference import commit_of

# (name, blocks of random bytes, byte offsets of f16 scale fields in a block)
TYPES = [("F16", 0, []), ("BF16", 0, []), ("Q4_0", 6, [0]), ("Q4_1", 6, [0, 2]), ("Q5_0", 6, [0]),
         ("Q5_1", 6, [0, 2]), ("Q8_0", 6, [0]), ("Q4_K", 2, [0, 2]), ("Q5_K", 2, [0, 2]), ("Q6_K", 2, [208])]


def load_quants(gguf_py):
    pkg = types.ModuleType("gguf")
    pkg.__path__ = [str(Path(gguf_py) / "gguf")]
    sys.modules["gguf"] = pkg
    return importlib.import_module("gguf.quants"), importlib.import_module("gguf.constants")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf_py")
    ap.add_argument("out")
    ap.add_argument("--commit", help="llama.cpp commit of GGUF_PY_DIR (default: git rev-parse)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quantize", help="also write quantizer golden data here")
    a = ap.parse_args()
    quants, constants = load_quants(a.gguf_py)
    rng = np.random.default_rng(a.seed)
    out = {"format": "akv-golden-ggml", "version": 1,
           "reference": {"repository": "ggml-org/llama.cpp", "commit": a.commit or commit_of(a.gguf_py),
                         "module": "gguf-py/gguf/quants.py (quantize, dequantize)", "numpy": np.__version__},
           "types": []}
    for name, random_blocks, scale_fields in TYPES:
        qtype = constants.GGMLQuantizationType[name]
        block, size = constants.GGML_QUANT_SIZES[qtype]
        parts = []
        if name in ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
            data = rng.normal(scale=0.5, size=(4, 64)).astype(np.float32)
            data[0, :4] = [0.0, -0.0, 1e-7, -3e4]  # zeros, an f16 subnormal, a large value
            parts.append(np.asarray(quants.quantize(data, qtype)).view(np.uint8).reshape(-1))
        if random_blocks:
            raw = rng.integers(0, 256, size=(random_blocks, size), dtype=np.uint8)
            for off in scale_fields:
                scale = rng.normal(scale=0.05, size=random_blocks).astype(np.float16)
                raw[:, off:off + 2] = scale.view(np.uint8).reshape(random_blocks, 2)
            parts.append(raw.reshape(-1))
        blocks = np.concatenate(parts)
        values = np.asarray(quants.dequantize(blocks, qtype), dtype=np.float32).reshape(-1)
        assert values.size == blocks.size // size * block
        out["types"].append({"type": name, "id": int(qtype), "n": int(values.size), "blocks": blocks.tobytes().hex(),
                             "values": values.view(np.uint32).astype(">u4").tobytes().hex()})
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}: {', '.join(t['type'] + ' ' + str(t['n']) for t in out['types'])}")
    if a.quantize:
        rows = [rng.normal(size=32 * 16).astype(np.float32),
                (rng.normal(size=32 * 8) * 1e-3).astype(np.float32),
                (rng.integers(-16, 17, size=32 * 8) / 4.0).astype(np.float32),  # many exact ties
                np.zeros(32, np.float32), np.full(32, 0.75, np.float32),
                np.concatenate([rng.normal(size=31), [40.0]]).astype(np.float32)]
        x = np.concatenate(rows).reshape(-1, 32)
        q = {"format": "akv-golden-ggml-quantize", "version": 1, "reference": out["reference"],
             "input": x.reshape(-1).view(np.uint32).astype(">u4").tobytes().hex(), "n": int(x.size), "types": []}
        for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
            qtype = constants.GGMLQuantizationType[name]
            blocks = np.asarray(quants.quantize(x, qtype)).view(np.uint8).reshape(-1)
            q["types"].append({"type": name, "blocks": blocks.tobytes().hex()})
        Path(a.quantize).write_text(json.dumps(q, indent=1) + "\n")
        print(f"wrote {a.quantize}: {x.size} values")


if __name__ == "__main__":
    main()
