#!/usr/bin/env python3
"""Independent Python implementation of oscarkv codec ids and block keys (docs/FORMAT.md §2-3).

Used to produce the golden vectors in the C++ tests and as a reference for engines written in
other languages. Standard library only.

  python3 tools/oscarkv_keys.py            # prints the golden vectors
"""
import hashlib
import struct


def codec_canonical_bytes(model_id, model_revision, num_layers, num_kv_heads, tp_rank, tp_size,
                          head_dim, page_tokens, group_size, scale_dtype, sink_tokens,
                          recent_tokens, rotation_digest=bytes(32)):
    out = b"OSCARKV-CODEC-V1"
    for s in (model_id, model_revision):
        b = s.encode("utf-8")
        out += struct.pack("<I", len(b)) + b
    out += struct.pack("<10I", num_layers, num_kv_heads, tp_rank, tp_size, head_dim, page_tokens,
                       group_size, scale_dtype, sink_tokens, recent_tokens)
    assert len(rotation_digest) == 32
    return out + rotation_digest


def codec_id(**profile):
    return hashlib.sha256(codec_canonical_bytes(**profile)).digest()[:16]


def block_keys(codec, salt, tokens, page_tokens):
    keys, prev = [], bytes(16)
    salt_b = salt.encode("utf-8") if isinstance(salt, str) else salt
    for b in range(len(tokens) // page_tokens):
        block = tokens[b * page_tokens:(b + 1) * page_tokens]
        h = hashlib.sha256()
        h.update(codec)
        h.update(struct.pack("<I", len(salt_b)))
        h.update(salt_b)
        h.update(prev)
        h.update(struct.pack("<%dI" % len(block), *block))
        prev = h.digest()[:16]
        keys.append(prev)
    return keys


QWEN3_8B = dict(model_id="Qwen/Qwen3-8B", model_revision="main", num_layers=36, num_kv_heads=8,
                tp_rank=0, tp_size=1, head_dim=128, page_tokens=64, group_size=128, scale_dtype=1,
                sink_tokens=64, recent_tokens=256)
REFMODEL = dict(QWEN3_8B, model_id="oscarkv/refmodel", model_revision="v1", num_layers=8,
                num_kv_heads=2)

if __name__ == "__main__":
    q = codec_id(**QWEN3_8B)
    print("codec_id qwen3-8b  ", q.hex())
    print("codec_id refmodel  ", codec_id(**REFMODEL).hex())
    print("codec_id qwen3-8b rotation_digest=0x01*32 ",
          codec_id(**dict(QWEN3_8B, rotation_digest=bytes([1] * 32))).hex())
    tokens = list(range(128)) + [7]
    for salt in ("", "tenant-a"):
        for i, k in enumerate(block_keys(q, salt, tokens, 64)):
            print("block_key qwen3-8b salt=%r tokens=0..127 block %d  %s" % (salt, i, k.hex()))
    big = [0xFFFFFFFF - i for i in range(16)]
    print("block_key qwen3-8b salt='' tokens=0xffffffff-i (16) page 16  ",
          block_keys(q, "", big, 16)[0].hex())
