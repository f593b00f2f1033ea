#!/usr/bin/env python3
"""Seeds for the `gguf` and `safetensors` fuzz targets, cut from the real test model (issue 14,
item 4). Writes into fuzz/corpus/{gguf,safetensors}/ (committed; rerun only to remake them):

  gguf/seed-prefix-4k      the first 4 KiB of the test model's GGUF (a truncated file)
  gguf/seed-small          the test model's own metadata (every key; the tokenizer's token,
                           type and merge arrays cut to the first 512 tokens and the merges among
                           them; vocab_size 512; the chat template) and three of its tensors,
                           shrunk (rows cut) with their real bytes: F32, Q4_1 and Q8_0
  gguf/seed-no-tensors     the same metadata, no tensors
  safetensors/seed-hf-header   the HF fixture's model.safetensors header, no data
  safetensors/seed-small       that header's first three tensors, rows cut, real bytes

  python3 fuzz/seeds/make.py [GGUF] [HF_DIR]   # defaults: ~/.cache/samewise/models/...

(`scripts/fuzz.sh` minimises the corpora afterwards, which renames every kept input to its
SHA-1: the seeds live on under those names.)
"""
import json
import os
import struct
import sys

HOME = os.path.expanduser("~/.cache/samewise/models")
GGUF = sys.argv[1] if len(sys.argv) > 1 else f"{HOME}/SmolLM2-135M-Instruct.Q4_1.gguf"
HF = sys.argv[2] if len(sys.argv) > 2 else f"{HOME}/smollm2-hf"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")
VOCAB = 512
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# ggml type id -> (block size, bytes per block)
BLOCKS = {0: (1, 4), 3: (32, 20), 8: (32, 34)}


class Reader:
    def __init__(self, data):
        self.d, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        v = self.d[self.pos:self.pos + n]
        self.pos += n
        return v

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        v = self.d[self.pos:self.pos + SIZES[t]]
        self.pos += SIZES[t]
        return v


def w_str(b):
    return struct.pack("<Q", len(b)) + b


def w_value(t, v):
    if t == 8:
        return w_str(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(w_value(et, x) for x in items)
    return v


def gguf_seeds():
    data = open(GGUF, "rb").read()
    r = Reader(data)
    assert r.take("<I") == 0x46554747
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        k = r.string()
        t = r.take("<I")
        kvs.append((k, t, r.value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        tensors.append((name, dims, r.take("<I"), r.take("<Q")))
    data_start = (r.pos + 31) // 32 * 32
    tokens = [t for t in dict((k, v) for k, _, v in kvs)[b"tokenizer.ggml.tokens"][1][:VOCAB]]
    kept = set(tokens)
    meta = []
    for k, t, v in kvs:
        if k == b"tokenizer.ggml.merges":
            v = (v[0], [m for m in v[1] if all(p in kept for p in m.split(b" ")) and m.replace(b" ", b"") in kept])
        elif t == 9 and k.startswith(b"tokenizer.ggml."):
            v = (v[0], v[1][:VOCAB])
        elif k == b"llama.vocab_size":
            v = struct.pack("<I", VOCAB)
        meta.append((k, t, v))
    # three tensors, rows cut, with their real bytes
    picks = {b"blk.0.attn_norm.weight": None, b"blk.0.ffn_down.weight": 2, b"token_embd.weight": 4}
    infos, blobs, off = [], [], 0
    for name, dims, ty, toff in tensors:
        if name not in picks:
            continue
        rows = picks[name]
        dims = dims if rows is None else [dims[0], rows]
        bs, bb = BLOCKS[ty]
        n = dims[0] // bs * bb * (1 if rows is None else rows)
        blobs.append(data[data_start + toff:data_start + toff + n] + b"\0" * ((-n) % 32))
        infos.append((name, dims, ty, off))
        off += n + (-n) % 32

    def build(with_tensors):
        ti = infos if with_tensors else []
        out = struct.pack("<IIQQ", 0x46554747, version, len(ti), len(meta))
        out += b"".join(w_str(k) + struct.pack("<I", t) + w_value(t, v) for k, t, v in meta)
        for name, dims, ty, o in ti:
            out += w_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", ty, o)
        if with_tensors:
            out += b"\0" * ((-len(out)) % 32) + b"".join(blobs)
        return out

    write("gguf", "seed-prefix-4k", data[:4096])
    write("gguf", "seed-small", build(True))
    write("gguf", "seed-no-tensors", build(False))


def safetensors_seeds():
    path = os.path.join(HF, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = f.read(n)
        base = 8 + n
        meta = json.loads(header)
        write("safetensors", "seed-hf-header", struct.pack("<Q", n) + header)
        names = sorted((k for k in meta if k != "__metadata__"), key=lambda k: meta[k]["data_offsets"][0])[:3]
        small, blobs, off = {}, [], 0
        width = {"F32": 4, "F16": 2, "BF16": 2}
        for k in names:
            e = meta[k]
            shape = e["shape"] if len(e["shape"]) == 1 else [2] + e["shape"][1:]
            size = width[e["dtype"]]
            for d in shape:
                size *= d
            f.seek(base + e["data_offsets"][0])
            blobs.append(f.read(size))
            small[k] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [off, off + size]}
            off += size
    h = json.dumps(small, separators=(",", ":")).encode()
    write("safetensors", "seed-small", struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    print(f"{target}/{name}: {len(data)} bytes")


gguf_seeds()
safetensors_seeds()
