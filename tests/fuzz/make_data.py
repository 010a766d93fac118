#!/usr/bin/env python3
"""Writes the fuzz harnesses' inputs: data/hf-tiny (a tiny random llama as a Hugging Face
directory, single-file and sharded) and the seed corpora corpus/<harness>/. Deterministic; run
again after a format change: tests/fuzz/make_data.py [AKV_ROOT]."""
import json
import shutil
import struct
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
FUZZ = ROOT / "tests" / "fuzz"
FIXTURES = ROOT / "data" / "fixtures"
rng = np.random.default_rng(20261130)

DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, CTX = 8, 16, 1, 2, 1, 16, 32
HD = DIM // HEADS


def tensors():
    t = {"model.embed_tokens.weight": (VOCAB, DIM), "model.norm.weight": (DIM,)}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        t.update({p + "input_layernorm.weight": (DIM,), p + "self_attn.q_proj.weight": (HEADS * HD, DIM),
                  p + "self_attn.k_proj.weight": (KV_HEADS * HD, DIM),
                  p + "self_attn.v_proj.weight": (KV_HEADS * HD, DIM),
                  p + "self_attn.o_proj.weight": (DIM, HEADS * HD),
                  p + "post_attention_layernorm.weight": (DIM,), p + "mlp.gate_proj.weight": (HIDDEN, DIM),
                  p + "mlp.down_proj.weight": (DIM, HIDDEN), p + "mlp.up_proj.weight": (HIDDEN, DIM)})
    return {k: (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in t.items()}


def safetensors(path, arrays, dtype="F32"):
    header, blob = {}, b""
    for name, a in arrays.items():
        data = a.astype(np.float16).tobytes() if dtype == "F16" else a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + blob)


def llama2c(path, arrays):
    """The same shapes as a llama2.c checkpoint (shared classifier: positive vocab)."""
    head = struct.pack("<7i", DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, CTX)
    parts = [arrays["model.embed_tokens.weight"]]
    for key in ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "post_attention_layernorm", "mlp.gate_proj", "mlp.down_proj", "mlp.up_proj"]:
        parts += [arrays[f"model.layers.{l}.{key}.weight"] for l in range(LAYERS)]
    parts += [arrays["model.norm.weight"], np.zeros(CTX * HD, np.float32)]
    path.write_bytes(head + b"".join(p.astype("<f4").tobytes() for p in parts))


def gguf(path, arrays, f16=False):
    """The tiny model as a GGUF v3 file (llama architecture; F32, or F16 matrices)."""
    def string(v):
        b = v.encode()
        return struct.pack("<Q", len(b)) + b
    kv = [("general.architecture", 8, string("llama")), ("llama.context_length", 4, struct.pack("<I", CTX)),
          ("llama.embedding_length", 4, struct.pack("<I", DIM)), ("llama.block_count", 4, struct.pack("<I", LAYERS)),
          ("llama.feed_forward_length", 4, struct.pack("<I", HIDDEN)),
          ("llama.attention.head_count", 4, struct.pack("<I", HEADS)),
          ("llama.attention.head_count_kv", 4, struct.pack("<I", KV_HEADS)),
          ("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
          ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
          ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, VOCAB) + b"".join(string(f"t{i}") for i in range(VOCAB)))]
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for l in range(LAYERS):
        for hf, gg in [("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                       ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
                       ("post_attention_layernorm", "ffn_norm"), ("mlp.gate_proj", "ffn_gate"),
                       ("mlp.down_proj", "ffn_down"), ("mlp.up_proj", "ffn_up")]:
            names[f"model.layers.{l}.{hf}.weight"] = f"blk.{l}.{gg}.weight"
    head = b"GGUF" + struct.pack("<IQQ", 3, len(names), len(kv))
    head += b"".join(string(k) + struct.pack("<I", t) + v for k, t, v in kv)
    infos, blob = b"", b""
    for hf, gg in names.items():
        a = arrays[hf]
        half = f16 and a.ndim == 2
        data = a.astype("<f2" if half else "<f4").tobytes()
        infos += string(gg) + struct.pack("<I", a.ndim) + b"".join(struct.pack("<Q", d) for d in reversed(a.shape))
        infos += struct.pack("<IQ", 1 if half else 0, len(blob))
        blob += data + b"\0" * (-len(data) % 32)
    out = head + infos
    out += b"\0" * (-len(out) % 32)
    path.write_bytes(out + blob)


def gguf_vocab(kind):
    """A GGUF v3 file holding only a tokenizer (its metadata arrays: tokens, scores, token types and,
    for gpt2, merges), no tensors."""
    def string(v):
        b = v.encode()
        return struct.pack("<Q", len(b)) + b
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(97, 123)] + ["he", "hel", "hello", "\u2581w", "or"]
    kv = [("general.architecture", 8, string("llama")), ("tokenizer.ggml.model", 8, string(kind)),
          ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(string(t) for t in tokens)),
          ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(tokens)) +
           b"".join(struct.pack("<i", 2 if i == 0 else 3 if i < 3 else 1) for i in range(len(tokens)))),
          ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1))]
    if kind == "llama":
        kv.append(("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(tokens)) +
                   b"".join(struct.pack("<f", -float(i)) for i in range(len(tokens)))))
    else:
        merges = ["h e", "he l", "hel lo", "o r"]
        kv += [("tokenizer.ggml.pre", 8, string("gpt-2")),
               ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, len(merges)) + b"".join(string(m) for m in merges))]
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(string(k) + struct.pack("<I", t) + v for k, t, v in kv)
    return out + b"\0" * (-len(out) % 32)


def main():
    hf = FUZZ / "data" / "hf-tiny"
    if hf.exists():
        shutil.rmtree(hf)
    hf.mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": DIM, "intermediate_size": HIDDEN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
              "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": True, "hidden_act": "silu"}
    (hf / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    arrays = tensors()
    safetensors(hf / "model.safetensors", arrays)
    names = list(arrays)
    half = len(names) // 2
    safetensors(hf / "a.safetensors", {n: arrays[n] for n in names[:half]})
    safetensors(hf / "b.safetensors", {n: arrays[n] for n in names[half:]})
    index = {"metadata": {}, "weight_map": {n: "a.safetensors" if i < half else "b.safetensors"
                                            for i, n in enumerate(names)}}

    corpus = FUZZ / "corpus"
    if corpus.exists():
        shutil.rmtree(corpus)
    seeds = {}
    seeds["method_spec"] = [b"kivi", b"kivi-4", b"k4v2:residual=64:group=16", b"uniform:bits=8",
                            b"adakv:budget=0.2:quant=kivi", b"snapkv:budget=0.5:window=8",
                            b"streamingllm:budget=0.3:sinks=4", b"tiered:preset=balanced",
                            b"joint:budget=0.25:quant=kivi", b"h2o:budget=0.4", b"none"]
    with h5py.File(FIXTURES / "cache-v1-evict.h5", "r") as f:
        evict = f.attrs["params"]
    with h5py.File(FIXTURES / "cache-v2-tiered.h5", "r") as f:
        tiered = f.attrs["params"]
    seeds["params_json"] = [s.encode() if isinstance(s, str) else bytes(s) for s in (evict, tiered)]
    seeds["token_file"] = [b"1 2 3 4\n5,6,7\n\n8 9\n", b"0\n", b"2147483647 -1\n"]
    seeds["budgets"] = [(FIXTURES / "budgets.json").read_bytes(), (FIXTURES / "budgets-joint.json").read_bytes()]
    seeds["calibration"] = [(FIXTURES / "calibration.json").read_bytes()]
    seeds["hf_config"] = [(hf / "config.json").read_bytes(),
                          json.dumps(dict(config, model_type="qwen2", use_sliding_window=False)).encode(),
                          json.dumps(dict(config, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 16},
                                          partial_rotary_factor=0.5)).encode(),
                          json.dumps(dict(config, rope_scaling={"type": "dynamic", "factor": 2.0})).encode()]
    seeds["safetensors"] = [(hf / "model.safetensors").read_bytes()]
    f16 = hf / "f16.safetensors"
    safetensors(f16, arrays, "F16")
    seeds["safetensors"].append(f16.read_bytes())
    f16.unlink()
    seeds["safetensors_index"] = [json.dumps(index).encode()]
    bin_path = hf / "tiny.bin"
    llama2c(bin_path, arrays)
    seeds["llama2c"] = [bin_path.read_bytes()]
    bin_path.unlink()
    gguf_path = hf / "tiny.gguf"
    seeds["gguf"] = []
    for half in (False, True):
        gguf(gguf_path, arrays, half)
        seeds["gguf"].append(gguf_path.read_bytes())
    gguf_path.unlink()
    seeds["gguf"] += [gguf_vocab("llama"), gguf_vocab("gpt2")]
    seeds["dump"] = [bytes(range(64)), b"\xff" * 64]
    seeds["cache"] = [bytes(range(64)), b"\x01\x02" * 32, b"\x02" * 64]
    # fuzz_cache.cpp picks the template by the last byte: 196-199 are the four later fixtures.
    seeds["cache"] += [bytes(range(63)) + bytes([196 + i]) for i in range(4)]
    for name, items in seeds.items():
        d = corpus / name
        d.mkdir(parents=True)
        for i, s in enumerate(items):
            (d / f"seed-{i}").write_bytes(s)
    (hf / "model.safetensors.index.json").write_bytes(seeds["safetensors_index"][0])


if __name__ == "__main__":
    main()
