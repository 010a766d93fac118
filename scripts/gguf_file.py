"""Writing GGUF v3 files from Python (scripts/make_retrieval_model, scripts/dev/make_bench_gguf,
tests/cli/tiny_hf.py).

Metadata values are (GGUF type id, packed bytes) pairs built with the helpers below; tensors are
(name, GGUF type id, dims with the fastest-varying first, raw bytes). Tensor data and the header
are aligned to 32 bytes (general.alignment's default). The file is written under NAME.tmp and
renamed when complete.
"""
import os
import struct

ALIGNMENT = 32


def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def u32(x):
    return 4, struct.pack("<I", x)


def f32(x):
    return 6, struct.pack("<f", x)


def boolean(x):
    return 7, struct.pack("<?", x)


def text(s):
    return 8, string(s)


def strings(xs):
    return 9, struct.pack("<IQ", 8, len(xs)) + b"".join(string(x) for x in xs)


def int32s(xs):
    return 9, struct.pack("<IQ", 5, len(xs)) + struct.pack(f"<{len(xs)}i", *xs)


def byte_level_tokens():
    """GPT-2's byte-to-character map: byte b is the token of id b in a byte-level vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write(path, kv, tensors):
    """kv: [(key, (type id, bytes))]; tensors: [(name, type id, dims, data)]."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    head += b"".join(string(k) + struct.pack("<I", t) + v for k, (t, v) in kv)
    infos, blobs, offset = b"", [], 0
    for name, type_id, dims, data in tensors:
        infos += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", type_id, offset)
        pad = -len(data) % ALIGNMENT
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    out = head + infos
    out += b"\0" * (-len(out) % ALIGNMENT)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(out)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)
