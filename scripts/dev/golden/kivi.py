#!/usr/bin/env python3
"""Runs KIVI's official quantizer on an akv dump and writes its codes, scales and zeros per layer,
KV head and bit width, as golden data for akv's tests (tests/unit/test_golden.cpp):

  scripts/dev/golden/kivi.py CHECKOUT DUMP OUT.json [--group 32] [--residual 128] [--bits 2,4]

CHECKOUT is a jy-yuan/KIVI checkout. Its quant/new_pack.py is imported unmodified and its
quant_and_pack_kcache / quant_and_pack_vcache (the torch reference of the Triton kernel that
models/llama_kivi.py calls: min and max per group, then the same arithmetic) quantize the keys
(groups of G tokens per channel) and values (groups of G channels per token); unpack_tensor
reads the packed int32 codes back. Its import of triton (used only by the GPU kernels) is
satisfied with a stand-in.

The tensors are fp16, as on the fp16 models KIVI evaluates: the dump's f32 keys and values are
rounded to f16 and every operation runs in fp16 (torch rounds each op's result to the nearest
f16). Debian's torch has no fp16 clamp_ and round_ on the CPU; those two ops run in f32 on the
same f16 values, which is exact (clamping and rounding an f16 to an integer give f16 values).

Which tokens are quantized follows llama_kivi.py's prefill (LlamaAttention_KIVI.forward,
876b4d2): keys quantize T - T mod R and keep the newest T mod R in fp16; values keep the newest R
in fp16 and quantize the rest. These few lines of index arithmetic are restated below
(prefill_split); nothing of KIVI's code is copied, and OUT.json holds numbers only: codes as one
hex digit each (row-major [n_quant, head_dim]), scales and zeros as f16 bit patterns in akv's
group order (keys: token group, then channel; values: token, then channel group).
"""
import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from reference import commit_of


class HalfOnCpu(TorchFunctionMode):
    """clamp_ and round_ of fp16 tensors in f32 (exact; Debian's CPU torch lacks the fp16 kernels)."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.clamp_, torch.Tensor.round_) and args[0].dtype == torch.half:
            t = args[0]
            t.copy_(func(t.float(), *args[1:], **kwargs))
            return t
        return func(*args, **kwargs)


class _AnyAttr(types.ModuleType):
    """triton.language stand-in: names used in the GPU kernels' annotations resolve to object."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return object


def load_new_pack(checkout):
    triton = types.ModuleType("triton")
    triton.jit = lambda fn=None, **_: fn if fn is not None else (lambda f: f)
    triton.language = _AnyAttr("triton.language")
    sys.modules.setdefault("triton", triton)
    sys.modules.setdefault("triton.language", triton.language)
    path = Path(checkout) / "quant" / "new_pack.py"
    spec = importlib.util.spec_from_file_location("official_kivi_new_pack", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prefill_split(n, residual):
    """(quantized keys, quantized values) of an n-token prefill, as llama_kivi.py splits them."""
    keys = n - n % residual if n >= residual else 0
    values = n - residual if n > residual else 0
    return keys, values


def f16_bits(t):
    return [int(v) for v in t.contiguous().view(torch.int16).flatten().numpy().astype(np.uint16)]


def hex_codes(codes):
    return "".join("%x" % int(c) for c in codes.flatten().tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkout")
    ap.add_argument("dump")
    ap.add_argument("out")
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--residual", type=int, default=128)
    ap.add_argument("--bits", default="2,4")
    a = ap.parse_args()
    official = load_new_pack(a.checkout)
    bits_list = [int(b) for b in a.bits.split(",")]
    out = {"format": "akv-golden-kivi", "version": 1,
           "reference": {"repository": "jy-yuan/KIVI", "commit": commit_of(a.checkout),
                         "functions": "quant/new_pack.py quant_and_pack_kcache, quant_and_pack_vcache, "
                                      "unpack_tensor; split of models/llama_kivi.py's prefill",
                         "dtype": "float16", "torch": torch.__version__},
           "dump": Path(a.dump).name, "group": a.group, "residual": a.residual, "heads": []}
    with h5py.File(a.dump, "r") as f, HalfOnCpu():
        n_layers = int(f.attrs["n_layers"])
        for layer in range(n_layers):
            key = torch.from_numpy(f[f"layers/{layer}/key"][...].astype(np.float32)).half()
            value = torch.from_numpy(f[f"layers/{layer}/value"][...].astype(np.float32)).half()
            n_kv, n, d = key.shape
            nk, nv = prefill_split(n, a.residual)
            for h in range(n_kv):
                for bits in bits_list:
                    entry = {"layer": layer, "head": h, "bits": bits}
                    k = key[h][None, None, :nk].contiguous()
                    code, scale, mn = official.quant_and_pack_kcache(k, a.group, bits)
                    codes = official.unpack_tensor(code, bits, pack_dim=2)
                    entry["key"] = {"n_quant": nk, "codes": hex_codes(codes), "scale": f16_bits(scale),
                                    "zero": f16_bits(mn)}
                    v = value[h][None, None, :nv].contiguous()
                    code, scale, mn = official.quant_and_pack_vcache(v, a.group, bits)
                    codes = official.unpack_tensor(code, bits, pack_dim=3)
                    entry["value"] = {"n_quant": nv, "codes": hex_codes(codes), "scale": f16_bits(scale),
                                      "zero": f16_bits(mn)}
                    out["heads"].append(entry)
    Path(a.out).write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {a.out}: {len(out['heads'])} head x bits entries, KIVI {out['reference']['commit'][:7]}")


if __name__ == "__main__":
    main()
