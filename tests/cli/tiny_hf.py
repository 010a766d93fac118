"""Writes a small random Hugging Face llama (config.json + model.safetensors, f32) for CLI tests.

  tiny_hf.py DIR --dim D --hidden H --vocab V --heads Q --kv-heads K --layers L [--seed S] [--tokens FILE N LEN]
             [--qwen3 | --phi3 [--longrope ORIGINAL] | --gemma3 | --gemma2 [--window W] [--pattern P] [--qpas S]
              [--softcap C] [--attn-softcap A]]
             [--head-dim HD] [--gguf OUT.gguf [--byte-vocab | --spm-vocab LISTS.json]]

head_dim = D / Q. Norm weights are 1, the rest normal * 0.2 (or --scale). --tokens also writes N
random token sequences of LEN ids in [1, V) to FILE. --qwen3: model_type qwen3 with per-head
q_norm / k_norm weights (1 + 0.3 normal), head_dim HD (default D / Q: Qwen3's q_proj may be wider
than the model), rope_theta 1e6, tied embeddings; --gguf also writes the same f32 weights as a GGUF
of architecture qwen3 (llama.cpp's tensor names; no permutation: NeoX RoPE) with placeholder
tokens, or with --byte-vocab (needs --vocab 258) a byte-level BPE vocabulary (GPT-2's byte
characters, no merges, BOS 256, EOS 257) that llama.cpp and akv both tokenize text with, or with
--spm-vocab a "llama" vocabulary from the lists of LISTS.json (tokens, scores, token_type,
bos_token_id, unknown_token_id, add_space_prefix: data/golden/bpe/gemma-gguf.json; --vocab must
equal its token count).
--phi3: model_type phi3, the same random weights with q/k/v fused into self_attn.qkv_proj and
gate/up into mlp.gate_up_proj (GGUF: attn_qkv, and ffn_up holding gate then up), untied
embeddings (lm_head). --longrope ORIGINAL (with --phi3): Phi-3's longrope, max_position_embeddings
8 x ORIGINAL, original_max_position_embeddings ORIGINAL, short factors 1 + uniform[0, 1) and long
factors 1 + 3 uniform[0, 1) drawn after the weights (GGUF: rope_factors_short / rope_factors_long,
rope.scaling.original_context_length, rope.scaling.attn_factor sqrt(1 + ln 8 / ln ORIGINAL), as
llama.cpp's converter writes them).
--gemma3: model_type gemma3_text: q_norm / k_norm and the four sandwich norms per layer
(input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm)
stored as Gemma's w of (1 + w), 0.1 normal; layer_types with every P-th layer global (--pattern,
default 3) and the others sliding_attention of window W (--window, default 8), rope_theta 1e6,
rope_local_base_freq 10000, query_pre_attn_scalar S (--qpas, default head_dim),
final_logit_softcapping C (--softcap, default none), gelu_pytorch_tanh, tied embeddings. GGUF:
architecture gemma3 as llama.cpp's converter writes it (norms stored as 1 + w,
post_attention_norm, ffn_norm = pre_feedforward_layernorm, post_ffw_norm, attention.sliding_window,
attention.sliding_window_pattern P; no rope.freq_base_swa: llama.cpp's default 10000).
--multimodal PREFIX (with --gemma3): the same weights as a Gemma3ForConditionalGeneration
checkpoint: model_type gemma3 with the text model's fields under text_config, its tensors named
PREFIX + the name after "model." (transformers' two layouts: language_model.model. or
model.language_model.), and a vision tensor of zeros.
--mistral WINDOW: model_type mistral with sliding_window WINDOW (every layer local), the Llama
weights.
--gemma2: model_type gemma2, the same without q_norm / k_norm and without a local RoPE base, every
other layer local from layer 0 (--pattern default 2), attn_logit_softcapping A (--attn-softcap,
default 50) and final_logit_softcapping C (--softcap, default 30). GGUF: architecture gemma2 with
attention.sliding_window, attn_logit_softcapping and final_logit_softcapping.
"""
import argparse
import json
import struct
from pathlib import Path

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("dir")
for flag in ("--dim", "--hidden", "--vocab", "--heads", "--kv-heads", "--layers"):
    ap.add_argument(flag, type=int, required=True)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--scale", type=float, default=0.2)
ap.add_argument("--tokens", nargs=3)
ap.add_argument("--qwen3", action="store_true")
ap.add_argument("--phi3", action="store_true")
ap.add_argument("--longrope", type=int, metavar="ORIGINAL")
ap.add_argument("--head-dim", type=int)
ap.add_argument("--gemma3", action="store_true")
ap.add_argument("--gemma2", action="store_true")
ap.add_argument("--window", type=int, default=8)
ap.add_argument("--pattern", type=int)
ap.add_argument("--attn-softcap", type=float)
ap.add_argument("--multimodal", choices=["language_model.model.", "model.language_model."])
ap.add_argument("--mistral", type=int, metavar="WINDOW")
ap.add_argument("--qpas", type=float)
ap.add_argument("--softcap", type=float)
ap.add_argument("--gguf")
ap.add_argument("--byte-vocab", action="store_true")
ap.add_argument("--spm-vocab")
a = ap.parse_args()
if a.multimodal and (not a.gemma3 or a.gguf):
    ap.error("--multimodal needs --gemma3 and writes no GGUF")
gemma = a.gemma3 or a.gemma2
pattern = a.pattern or (2 if a.gemma2 else 3)
if a.gguf and not (a.qwen3 or a.phi3 or gemma):
    ap.error("--gguf needs --qwen3, --phi3, --gemma3 or --gemma2 (a llama GGUF's q/k rows are permuted for interleaved RoPE)")
d = Path(a.dir)
d.mkdir(parents=True)
hd = a.head_dim or a.dim // a.heads
cfg = {"model_type": "qwen3" if a.qwen3 else "phi3" if a.phi3 else "gemma3_text" if a.gemma3 else "gemma2" if a.gemma2 else "llama", "hidden_size": a.dim, "intermediate_size": a.hidden,
       "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
       "vocab_size": a.vocab, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
if a.qwen3:
    cfg.update({"head_dim": hd, "rope_theta": 1e6, "attention_bias": False})
if a.phi3:
    cfg.update({"tie_word_embeddings": False, "rope_theta": 10000.0})
if gemma:
    cfg.update({"head_dim": hd, "rope_theta": 1e6, "sliding_window": a.window,
                "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(a.layers)],
                "query_pre_attn_scalar": a.qpas or hd, "final_logit_softcapping": a.softcap,
                "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False})
if a.gemma3:
    cfg["rope_local_base_freq"] = 10000.0
if a.mistral:
    cfg.update({"model_type": "mistral", "sliding_window": a.mistral})
if a.gemma2:
    cfg.update({"rope_theta": 10000.0, "attn_logit_softcapping": a.attn_softcap or 50.0,
                "final_logit_softcapping": a.softcap or 30.0})
if a.longrope and not a.phi3:
    ap.error("--longrope needs --phi3")
rng = np.random.default_rng(a.seed)
shapes = {"model.embed_tokens.weight": (a.vocab, a.dim), "model.norm.weight": (a.dim,)}
for l in range(a.layers):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (a.dim,), p + "post_attention_layernorm.weight": (a.dim,),
                   p + "self_attn.q_proj.weight": (hd * a.heads, a.dim), p + "self_attn.k_proj.weight": (hd * a.kv_heads, a.dim),
                   p + "self_attn.v_proj.weight": (hd * a.kv_heads, a.dim), p + "self_attn.o_proj.weight": (a.dim, hd * a.heads),
                   p + "mlp.gate_proj.weight": (a.hidden, a.dim), p + "mlp.up_proj.weight": (a.hidden, a.dim),
                   p + "mlp.down_proj.weight": (a.dim, a.hidden)})
    if a.qwen3 or a.gemma3:
        shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    if gemma:
        shapes.update({p + "pre_feedforward_layernorm.weight": (a.dim,), p + "post_feedforward_layernorm.weight": (a.dim,)})
if a.phi3:
    shapes["lm_head.weight"] = (a.vocab, a.dim)
header, blob, weights = {}, b"", {}
for name, shape in shapes.items():
    if gemma and name.endswith("norm.weight"):
        w = 0.1 * rng.standard_normal(shape)  # Gemma's RMSNorm multiplies by 1 + w
    elif name.endswith(("q_norm.weight", "k_norm.weight")):
        w = 1 + 0.3 * rng.standard_normal(shape)
    else:
        w = np.ones(shape) if name.endswith("norm.weight") else rng.standard_normal(shape) * a.scale
    weights[name] = w.astype("<f4")
if a.phi3:  # fuse as Phi-3 stores them
    for l in range(a.layers):
        p = f"model.layers.{l}."
        weights[p + "self_attn.qkv_proj.weight"] = np.concatenate([weights.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
        weights[p + "mlp.gate_up_proj.weight"] = np.concatenate([weights.pop(p + "mlp.gate_proj.weight"),
                                                                weights.pop(p + "mlp.up_proj.weight")])
if a.longrope:
    short_f = [float(x) for x in 1 + rng.random(hd // 2)]
    long_f = [float(x) for x in 1 + 3 * rng.random(hd // 2)]
    cfg.update({"max_position_embeddings": 8 * a.longrope, "original_max_position_embeddings": a.longrope,
                "rope_scaling": {"type": "longrope", "short_factor": short_f, "long_factor": long_f}})
stored = weights
if a.multimodal:  # Gemma3ForConditionalGeneration: the text model's fields under text_config
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": cfg,
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8}}
    stored = {a.multimodal + n[len("model."):] if n.startswith("model.") else n: w for n, w in weights.items()}
    stored["vision_tower.vision_model.embeddings.patch_embedding.weight"] = np.zeros((8, 3, 2, 2), "<f4")
(d / "config.json").write_text(json.dumps(cfg))
for name, w in stored.items():
    data = w.tobytes()
    header[name] = {"dtype": "F32", "shape": list(w.shape), "data_offsets": [len(blob), len(blob) + len(data)]}
    blob += data
text = json.dumps(header).encode()
(d / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + blob)
if a.gguf:
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
    import gguf_file as gguf  # noqa: E402
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for l in range(a.layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        for hf_name, g_name in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
                                ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                                ("self_attn.o_proj", "attn_output"), ("self_attn.q_norm", "attn_q_norm"),
                                ("self_attn.k_norm", "attn_k_norm"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
                                ("mlp.down_proj", "ffn_down"), ("self_attn.qkv_proj", "attn_qkv"), ("mlp.gate_up_proj", "ffn_up")):
            names[p + hf_name + ".weight"] = b + g_name + ".weight"
        if gemma:
            for hf_name, g_name in (("post_attention_layernorm", "post_attention_norm"), ("pre_feedforward_layernorm", "ffn_norm"),
                                    ("post_feedforward_layernorm", "post_ffw_norm")):
                names[p + hf_name + ".weight"] = b + g_name + ".weight"
    arch = "gemma3" if a.gemma3 else cfg["model_type"]  # gemma2: the same name
    kv = [("general.architecture", gguf.text(arch)), (f"{arch}.context_length", gguf.u32(cfg["max_position_embeddings"])),
          (f"{arch}.embedding_length", gguf.u32(a.dim)), (f"{arch}.block_count", gguf.u32(a.layers)),
          (f"{arch}.feed_forward_length", gguf.u32(a.hidden)), (f"{arch}.attention.head_count", gguf.u32(a.heads)),
          (f"{arch}.attention.head_count_kv", gguf.u32(a.kv_heads)), (f"{arch}.attention.key_length", gguf.u32(hd)),
          (f"{arch}.attention.value_length", gguf.u32(hd)), (f"{arch}.attention.layer_norm_rms_epsilon", gguf.f32(1e-5)),
          (f"{arch}.rope.freq_base", gguf.f32(cfg.get("rope_theta", 10000.0))),
          ]
    if a.byte_vocab:
        assert a.vocab == 258, "--byte-vocab needs --vocab 258"
        kv += [("tokenizer.ggml.model", gguf.text("gpt2")), ("tokenizer.ggml.pre", gguf.text("default")),
               ("tokenizer.ggml.tokens", gguf.strings(gguf.byte_level_tokens() + ["<s>", "</s>"])),
               ("tokenizer.ggml.token_type", gguf.int32s([1] * 256 + [3, 3])), ("tokenizer.ggml.merges", gguf.strings([])),
               ("tokenizer.ggml.bos_token_id", gguf.u32(256)), ("tokenizer.ggml.eos_token_id", gguf.u32(257)),
               ("tokenizer.ggml.add_bos_token", gguf.boolean(True))]
    elif a.spm_vocab:
        lists = json.load(open(a.spm_vocab, encoding="utf-8"))
        assert a.vocab == len(lists["tokens"]), "--spm-vocab needs --vocab equal to its token count"
        kv += [("tokenizer.ggml.model", gguf.text("llama")), ("tokenizer.ggml.tokens", gguf.strings(lists["tokens"])),
               ("tokenizer.ggml.scores", (9, struct.pack("<IQ", 6, a.vocab) + struct.pack(f"<{a.vocab}f", *lists["scores"]))),
               ("tokenizer.ggml.token_type", gguf.int32s(lists["token_type"])),
               ("tokenizer.ggml.bos_token_id", gguf.u32(lists["bos_token_id"])),
               ("tokenizer.ggml.unknown_token_id", gguf.u32(lists["unknown_token_id"])),
               ("tokenizer.ggml.add_space_prefix", gguf.boolean(lists["add_space_prefix"]))]
    else:
        kv += [("tokenizer.ggml.model", gguf.text("llama")), ("tokenizer.ggml.tokens", gguf.strings([f"<t{i}>" for i in range(a.vocab)])),
               ("tokenizer.ggml.scores", (9, struct.pack("<IQ", 6, a.vocab) + struct.pack(f"<{a.vocab}f", *([0.0] * a.vocab)))),
               ("tokenizer.ggml.token_type", gguf.int32s([1] * a.vocab))]
    if gemma:
        kv += [(f"{arch}.attention.sliding_window", gguf.u32(a.window)),
               (f"{arch}.attention.sliding_window_pattern", gguf.u32(pattern))]
        if cfg.get("final_logit_softcapping"):
            kv.append((f"{arch}.final_logit_softcapping", gguf.f32(cfg["final_logit_softcapping"])))
        if cfg.get("attn_logit_softcapping"):
            kv.append((f"{arch}.attn_logit_softcapping", gguf.f32(cfg["attn_logit_softcapping"])))
    out = []
    if a.longrope:
        import math
        kv += [(f"{arch}.rope.scaling.original_context_length", gguf.u32(a.longrope)),
               (f"{arch}.rope.scaling.attn_factor", gguf.f32(math.sqrt(1 + math.log(8) / math.log(a.longrope))))]
        for tname, f in (("rope_factors_long.weight", long_f), ("rope_factors_short.weight", short_f)):
            out.append((tname, 0, [len(f)], np.array(f, dtype="<f4").tobytes()))
    for name, w in weights.items():
        dims = [w.shape[0]] if w.ndim == 1 else [w.shape[1], w.shape[0]]
        if gemma and name.endswith("norm.weight"):
            w = (1 + w).astype("<f4")  # llama.cpp's converter stores Gemma's norms as 1 + w
        out.append((names[name], 0, dims, w.tobytes()))
    gguf.write(a.gguf, kv, out)
if a.tokens:
    path, n, length = a.tokens[0], int(a.tokens[1]), int(a.tokens[2])
    with open(path, "w") as f:
        for _ in range(n):
            f.write(" ".join(str(t) for t in rng.integers(1, a.vocab, length)) + "\n")
