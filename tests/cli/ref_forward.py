"""A plain numpy forward of a small Hugging Face Qwen3, Phi-3 (or Llama) checkpoint written by
tiny_hf.py, transcribing transformers' modeling_qwen3.py / modeling_phi3.py (v4.51): RMSNorm
(x * rsqrt(mean(x^2) + eps) * w), Qwen3's q_norm / k_norm over each head's head_dim values before
RoPE, Phi-3's fused qkv_proj (q, k, v rows) and gate_up_proj (gate, up: chunk(2)), rotate-half
RoPE with inv_freq = theta^(-2i/d) (Phi-3's longrope: divided by the short factors, or the long
ones when the sequence passes original_max_position_embeddings, cos and sin times sqrt(1 + ln(max /
original) / ln(original)), as transformers' Phi3 rotary embedding), causal softmax attention with
GQA and scaling head_dim^-0.5, SiLU MLP. In float64, as an independent reference for akv's forward.

  ref_forward.py HF_DIR DUMP.h5 TOKENS_LINE

Compares every layer's keys (after RoPE) and values with an `akv dump` of the same tokens and
prints "reference ok" when all agree within 1e-4 of each tensor's largest magnitude.
"""
import json
import struct
import sys

import h5py
import numpy as np


def load(d):
    raw = open(f"{d}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(t["shape"]).astype(np.float64)
    return out


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, theta, cfg):  # x [heads, n, hd], rotate-half
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    scale = 1.0
    scaling = cfg.get("rope_scaling")
    if scaling and scaling.get("type", scaling.get("rope_type")) in ("longrope", "su"):
        original, longest = cfg["original_max_position_embeddings"], cfg["max_position_embeddings"]
        ext = scaling["long_factor"] if len(pos) > original else scaling["short_factor"]
        inv = inv / np.array(ext, dtype=np.float64)
        scale = np.sqrt(1 + np.log(longest / original) / np.log(original)) if longest > original else 1.0
    ang = np.outer(pos, inv)
    cos, sin = (np.concatenate([f(ang)] * 2, -1) * scale for f in (np.cos, np.sin))
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rot * sin


def main():
    d, dump, tokens = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split()]
    cfg = json.load(open(f"{d}/config.json"))
    w = load(d)
    qwen3 = cfg["model_type"] == "qwen3"
    H, K, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    n = len(tokens)
    pos = np.arange(n)
    x = w["model.embed_tokens.weight"][tokens]
    f = h5py.File(dump, "r")
    worst = 0.0
    for l in range(L):
        p = f"model.layers.{l}."
        if p + "self_attn.qkv_proj.weight" in w:  # Phi-3
            qkv = w[p + "self_attn.qkv_proj.weight"]
            w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"], w[p + "self_attn.v_proj.weight"] = np.split(
                qkv, [H * hd, H * hd + K * hd])
            w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = np.split(w[p + "mlp.gate_up_proj.weight"], 2)
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, H, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, K, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, K, hd).transpose(1, 0, 2)
        if qwen3:
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, theta, cfg), rope(k, pos, theta, cfg)
        for name, ref in (("key", k), ("value", v)):
            got = np.asarray(f[f"/layers/{l}/{name}"][:], dtype=np.float64)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 1e-4, (l, name, err)
            worst = max(worst, err)
        kk, vv = np.repeat(k, H // K, 0), np.repeat(v, H // K, 0)
        s = q @ kk.transpose(0, 2, 1) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        att = (pr @ vv).transpose(1, 0, 2).reshape(n, H * hd)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    print(f"reference ok (largest relative difference {worst:.2e})")


if __name__ == "__main__":
    main()
