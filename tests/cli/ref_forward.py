"""A plain numpy forward of a small Hugging Face Qwen3, Phi-3, Gemma 2, Gemma 3 (or Llama) checkpoint written by
tiny_hf.py, transcribing transformers' modeling_qwen3.py / modeling_phi3.py / modeling_mistral.py
(v4.51; Mistral's sliding_window: every layer attends to i - j < sliding_window) and
modeling_gemma3.py's Gemma3TextModel (v4.53: layer_types; Gemma3RMSNorm x * rsqrt(mean(x^2) + eps) *
(1 + w) on inputs, q/k heads, attention and MLP outputs (sandwich norms) and the final norm;
embeddings times sqrt(hidden_size); local layers attend to positions i - j < sliding_window and rotate
with rope_local_base_freq, global ones with rope_theta; scaling query_pre_attn_scalar^-0.5; GeGLU
with gelu_pytorch_tanh; final_logit_softcapping; modeling_gemma2.py: the same without q/k norms and
local RoPE base, every other layer local from layer 0, scores soft-capped by
attn_logit_softcapping after scaling): RMSNorm
(x * rsqrt(mean(x^2) + eps) * w), Qwen3's q_norm / k_norm over each head's head_dim values before
RoPE, Phi-3's fused qkv_proj (q, k, v rows) and gate_up_proj (gate, up: chunk(2)), rotate-half
RoPE with inv_freq = theta^(-2i/d) (Phi-3's longrope: divided by the short factors, or the long
ones when the sequence passes original_max_position_embeddings, cos and sin times sqrt(1 + ln(max /
original) / ln(original)), as transformers' Phi3 rotary embedding), causal softmax attention with
GQA and scaling head_dim^-0.5, SiLU MLP. In float64, as an independent reference for akv's forward.

  ref_forward.py HF_DIR DUMP.h5 TOKENS_LINE [FIRST]

Compares every layer's keys (after RoPE) and values with an `akv dump` of the same tokens and
prints "reference ok" when all agree within 1e-4 of each tensor's largest magnitude; with FIRST,
also "reference nll X": the mean negative log-likelihood of tokens FIRST..n-1, each predicted from
the logits of the position before it (what `akv evaluate --prefill FIRST` reports as mean_nll).
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


def rope(x, pos, theta, cfg, scaled=True):  # x [heads, n, hd], rotate-half
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    scale = 1.0
    scaling = cfg.get("rope_scaling") if scaled else None
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
    qwen3, gemma = cfg["model_type"] == "qwen3", cfg["model_type"] in ("gemma3_text", "gemma2")
    gemma3 = cfg["model_type"] == "gemma3_text"
    H, K, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    n = len(tokens)
    pos = np.arange(n)
    x = w["model.embed_tokens.weight"][tokens]
    kinds = ["full_attention"] * L
    if gemma:
        for name in list(w):
            if name.endswith("norm.weight"):
                w[name] = 1 + w[name]
        x = x * np.sqrt(cfg["hidden_size"])
        pattern = cfg.get("sliding_window_pattern", 6 if gemma3 else 2)
        kinds = cfg.get("layer_types") or ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(L)]
    if cfg["model_type"] == "mistral" and cfg.get("sliding_window"):  # every layer local
        kinds = ["sliding_attention"] * L
    scaling = cfg.get("query_pre_attn_scalar", 256) ** -0.5 if gemma else hd ** -0.5
    def gelu_tanh(g):
        return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
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
        if qwen3 or gemma3:
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        local = kinds[l] == "sliding_attention"
        local_rope = local and gemma3  # Gemma 2's and Mistral's local layers rotate as global ones
        lt = cfg.get("rope_local_base_freq", 10000.0) if local_rope else theta
        q, k = rope(q, pos, lt, cfg, not local_rope), rope(k, pos, lt, cfg, not local_rope)
        for name, ref in (("key", k), ("value", v)):
            got = np.asarray(f[f"/layers/{l}/{name}"][:], dtype=np.float64)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 1e-4, (l, name, err)
            worst = max(worst, err)
        kk, vv = np.repeat(k, H // K, 0), np.repeat(v, H // K, 0)
        s = q @ kk.transpose(0, 2, 1) * scaling
        if cfg.get("attn_logit_softcapping"):
            s = cfg["attn_logit_softcapping"] * np.tanh(s / cfg["attn_logit_softcapping"])
        mask = np.tril(np.ones((n, n), bool))
        if local:
            i, j = np.indices((n, n))
            mask &= i - j < cfg["sliding_window"]
        s = np.where(mask, s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        att = (pr @ vv).transpose(1, 0, 2).reshape(n, H * hd)
        out = att @ w[p + "self_attn.o_proj.weight"].T
        if gemma:
            x = x + rmsnorm(out, w[p + "post_attention_layernorm.weight"], eps)
            h = rmsnorm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            g = h @ w[p + "mlp.gate_proj.weight"].T
            mlp = (gelu_tanh(g) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
            x = x + rmsnorm(mlp, w[p + "post_feedforward_layernorm.weight"], eps)
            continue
        x = x + out
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    print(f"reference ok (largest relative difference {worst:.2e})")
    if len(sys.argv) > 4:
        first = int(sys.argv[4])
        logits = rmsnorm(x, w["model.norm.weight"], eps) @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
        if cfg.get("final_logit_softcapping"):
            c = cfg["final_logit_softcapping"]
            logits = c * np.tanh(logits / c)
        m = logits.max(-1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
        nll = -np.mean([logp[i - 1, tokens[i]] for i in range(first, n)])
        print(f"reference nll {nll:.10f}")


if __name__ == "__main__":
    main()
