"""RoPE scaling against an independent numpy implementation (tests/cli/test_rope.sh).

For each rope_scaling of a tiny random Hugging Face llama (head_dim 64, theta 500000), `akv dump`
writes each head's keys before and after RoPE (f32); the angle each pair turned by at position p
must equal p * inv_freq[i] with inv_freq computed here from the transformers formulas (linear,
dynamic NTK with the prompt length, llama3's three wavelength regimes, yarn as transformers 4.45
computes it, whose attention factor must also scale every rotated pair's length; longrope as
transformers' Phi-3 computes it, short factors up to the top-level original_max_position_embeddings
and long ones past it, its attention factor sqrt(1 + ln(max / original) / ln(original)) scaling the
pairs; partial_rotary_factor rotating only the first dims and leaving the rest unchanged). Usage: rope_check.py AKV WORKDIR
"""
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

AKV, WORK = sys.argv[1], Path(sys.argv[2])
DIM, HEADS, KV, HD, HIDDEN, VOCAB, THETA = 128, 2, 1, 64, 32, 16, 500000.0
rng = np.random.default_rng(7)


def write_model(directory, rope_scaling, max_pos, partial=None, original=None):
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "llama", "hidden_size": DIM, "intermediate_size": HIDDEN, "num_hidden_layers": 1,
           "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": VOCAB,
           "max_position_embeddings": max_pos, "rms_norm_eps": 1e-5, "rope_theta": THETA,
           "tie_word_embeddings": True, "hidden_act": "silu", "rope_scaling": rope_scaling}
    if partial is not None:
        cfg["partial_rotary_factor"] = partial
    if original is not None:
        cfg["original_max_position_embeddings"] = original
    (directory / "config.json").write_text(json.dumps(cfg))
    shapes = {"model.embed_tokens.weight": (VOCAB, DIM), "model.norm.weight": (DIM,),
              "model.layers.0.input_layernorm.weight": (DIM,), "model.layers.0.post_attention_layernorm.weight": (DIM,),
              "model.layers.0.self_attn.q_proj.weight": (HEADS * HD, DIM),
              "model.layers.0.self_attn.k_proj.weight": (KV * HD, DIM),
              "model.layers.0.self_attn.v_proj.weight": (KV * HD, DIM),
              "model.layers.0.self_attn.o_proj.weight": (DIM, HEADS * HD),
              "model.layers.0.mlp.gate_proj.weight": (HIDDEN, DIM), "model.layers.0.mlp.up_proj.weight": (HIDDEN, DIM),
              "model.layers.0.mlp.down_proj.weight": (DIM, HIDDEN)}
    header, blob = {}, b""
    for name, shape in shapes.items():
        data = (rng.standard_normal(shape) * 0.5).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + blob)


def default_inv_freq(dim, base):
    exponent = (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)).astype(np.float32)
    return (np.float32(1.0) / np.power(np.float32(base), exponent)).astype(np.float32)


def inv_freq(scaling, dim, n_tokens, max_pos, original=None):
    kind = scaling["rope_type"] if scaling else "default"
    f = default_inv_freq(dim, THETA)
    if kind == "linear":
        return (f / np.float32(scaling["factor"])).astype(np.float32)
    if kind == "dynamic":
        seq = max(n_tokens, max_pos)
        base = THETA * ((scaling["factor"] * seq / max_pos) - (scaling["factor"] - 1)) ** (dim / (dim - 2))
        return default_inv_freq(dim, base)
    if kind == "llama3":
        factor, low, high = (np.float32(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old = scaling["original_max_position_embeddings"]
        wavelen = (np.float32(2 * math.pi) / f).astype(np.float32)
        low_wave, high_wave = np.float32(old / scaling["low_freq_factor"]), np.float32(old / scaling["high_freq_factor"])
        scaled = np.where(wavelen > low_wave, f / factor, f).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - low) / np.float32(scaling["high_freq_factor"] - scaling["low_freq_factor"]))
        smoothed = ((np.float32(1) - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wave) & ~(wavelen > low_wave)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    if kind == "longrope":
        ext = np.array(scaling["long_factor"] if n_tokens > original else scaling["short_factor"], dtype=np.float32)
        shape = (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)).astype(np.float32)
        return (np.float32(1) / (ext * np.power(np.float32(THETA), shape)).astype(np.float32)).astype(np.float32)
    if kind == "yarn":
        factor = scaling["factor"]
        def correction_dim(rotations):
            return (dim * math.log(max_pos / (rotations * 2 * math.pi))) / (2 * math.log(THETA))
        low = max(math.floor(correction_dim(32)), 0)
        high = min(math.ceil(correction_dim(1)), dim - 1)
        if low == high:
            high += 0.001
        pos_freqs = np.power(np.float32(THETA), (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)))
        extrapolation = (np.float32(1) / pos_freqs).astype(np.float32)
        interpolation = (np.float32(1) / (np.float32(factor) * pos_freqs)).astype(np.float32)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
        extra = (np.float32(1) - ramp).astype(np.float32)
        return (interpolation * (np.float32(1) - extra) + extrapolation * extra).astype(np.float32)
    return f


def attention_scale(scaling, max_pos, original):
    kind = scaling.get("rope_type") if scaling else None
    if kind == "yarn":
        return 0.1 * math.log(scaling["factor"]) + 1.0
    if kind == "longrope":
        return math.sqrt(1 + math.log(max_pos / original) / math.log(original))
    return 1.0


def check(name, scaling, max_pos, n_tokens, partial=None, original=None):
    model = WORK / name
    write_model(model, scaling, max_pos, partial, original)
    tokens = WORK / f"{name}.txt"
    tokens.write_text(" ".join(str(i % VOCAB) for i in range(n_tokens)) + "\n")
    dump = WORK / f"{name}.h5"
    subprocess.run([AKV, "dump", "-q", "--model", str(model), "--tokens", str(tokens), "-o", str(dump),
                    "--window", "1"], check=True)
    rot = int(HD * partial) if partial else HD
    want = inv_freq(scaling, rot, n_tokens, max_pos, original).astype(np.float64)
    with h5py.File(dump, "r") as f:
        k0, k1 = f["layers/0/key_pre_rope"][0], f["layers/0/key"][0]  # [tokens, head_dim], KV head 0
    half = rot // 2
    a0, b0, a1, b1 = k0[:, :half], k0[:, half:rot], k1[:, :half], k1[:, half:rot]
    turned = np.arctan2(a0 * b1 - b0 * a1, a0 * a1 + b0 * b1)  # angle from (a0, b0) to (a1, b1)
    pos = np.arange(n_tokens)[:, None]
    expect = np.angle(np.exp(1j * (pos * want[None, :].astype(np.float32)).astype(np.float32)))
    err = np.abs(np.angle(np.exp(1j * (turned - expect))))
    worst = float(err.max())
    untouched = float(np.abs(k1[:, rot:] - k0[:, rot:]).max()) if rot < HD else 0.0
    scale = attention_scale(scaling, max_pos, original)
    length = np.hypot(a1, b1) / np.maximum(np.hypot(a0, b0), 1e-30)
    scale_err = float(np.abs(length - scale).max())
    ok = worst < 2e-4 and untouched == 0.0 and scale_err < 1e-5 * scale
    regimes = ""
    if scaling and scaling.get("rope_type") == "llama3":
        wave = 2 * math.pi / default_inv_freq(rot, THETA)
        old = scaling["original_max_position_embeddings"]
        regimes = f", pairs kept/smoothed/scaled {int((wave < old / 4).sum())}/" \
                  f"{int(((wave >= old / 4) & (wave <= old)).sum())}/{int((wave > old).sum())}"
    print(f"{'ok  ' if ok else 'FAIL'} {name}: worst angle error {worst:.2e} rad over {n_tokens} positions x {half} "
          f"pairs{regimes}{', unrotated dims unchanged' if rot < HD else ''}"
          f"{f', pair lengths x {scale:.6f} (worst error {scale_err:.1e})' if scale != 1.0 else ''}")
    return ok


LONGROPE = {"rope_type": "longrope", "short_factor": [float(x) for x in 1 + rng.random(HD // 2)],
            "long_factor": [float(x) for x in 1 + 3 * rng.random(HD // 2)]}
results = [
    check("default", None, 64, 48),
    check("linear", {"rope_type": "linear", "factor": 4.0}, 64, 48),
    check("dynamic-short", {"rope_type": "dynamic", "factor": 2.0}, 64, 48),
    check("dynamic-long", {"rope_type": "dynamic", "factor": 2.0}, 32, 60),
    check("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}, 131072, 48),
    check("partial", None, 64, 40, partial=0.5),
    check("yarn", {"rope_type": "yarn", "factor": 4.0}, 4096, 48),
    check("longrope-short", LONGROPE, 2048, 48, original=64),
    check("longrope-long", LONGROPE, 2048, 60, original=32),
]
print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
sys.exit(0 if all(results) else 1)
