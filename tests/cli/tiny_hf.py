"""Writes a small random Hugging Face llama (config.json + model.safetensors, f32) for CLI tests.

  tiny_hf.py DIR --dim D --hidden H --vocab V --heads Q --kv-heads K --layers L [--seed S] [--tokens FILE N LEN]

head_dim = D / Q. Norm weights are 1, the rest normal * 0.2 (or --scale). --tokens also writes N
random token sequences of LEN ids in [1, V) to FILE.
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
a = ap.parse_args()
d = Path(a.dir)
d.mkdir(parents=True)
hd = a.dim // a.heads
cfg = {"model_type": "llama", "hidden_size": a.dim, "intermediate_size": a.hidden, "num_hidden_layers": a.layers,
       "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "vocab_size": a.vocab,
       "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
(d / "config.json").write_text(json.dumps(cfg))
rng = np.random.default_rng(a.seed)
shapes = {"model.embed_tokens.weight": (a.vocab, a.dim), "model.norm.weight": (a.dim,)}
for l in range(a.layers):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (a.dim,), p + "post_attention_layernorm.weight": (a.dim,),
                   p + "self_attn.q_proj.weight": (a.dim, a.dim), p + "self_attn.k_proj.weight": (hd * a.kv_heads, a.dim),
                   p + "self_attn.v_proj.weight": (hd * a.kv_heads, a.dim), p + "self_attn.o_proj.weight": (a.dim, a.dim),
                   p + "mlp.gate_proj.weight": (a.hidden, a.dim), p + "mlp.up_proj.weight": (a.hidden, a.dim),
                   p + "mlp.down_proj.weight": (a.dim, a.hidden)})
header, blob = {}, b""
for name, shape in shapes.items():
    w = np.ones(shape) if name.endswith("norm.weight") else rng.standard_normal(shape) * a.scale
    data = w.astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
    blob += data
text = json.dumps(header).encode()
(d / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + blob)
if a.tokens:
    path, n, length = a.tokens[0], int(a.tokens[1]), int(a.tokens[2])
    with open(path, "w") as f:
        for _ in range(n):
            f.write(" ".join(str(t) for t in rng.integers(1, a.vocab, length)) + "\n")
