"""Codec ids and block keys: FORMAT.md's golden vectors, the table in the doc itself, and an
independent pure-Python implementation (tools/oscarkv_keys.py) on random inputs."""
import random
import re

import numpy as np
import pytest

import oscarkv
import oscarkv_keys  # tools/, put on sys.path by conftest
from conftest import REPO

GOLDEN = {
    "codec qwen3-8b": "4be25704bf3761cb7196d7029b0c67ed",
    "codec refmodel": "c5bc90c8c91954515b762ed6bedbf267",
    "codec qwen3-8b rot 0x01": "b0f7827f2a02f7c99e053faac7c79e14",
    "block 0": "5d55a8bf9ffbceec922d5a1b7acc1d7f",
    "block 1": "10cb911c588a67c541fd440aa76e9779",
    "block 0 tenant-a": "db9f58cfc2462c86ab995409005f7b67",
    "block 1 tenant-a": "7049ff28b9393592eaa46b861479f5dc",
    "block 0 big page16": "6f8cd0cc9f5a28312be094f960017f57",
}


def computed():
    q = oscarkv.CodecProfile.builtin("qwen3-8b")
    r = oscarkv.CodecProfile.builtin("refmodel")
    qc = oscarkv.Codec.local(q)
    q16 = oscarkv.Codec.local(oscarkv.CodecProfile(**{**q.__dict__, "page_tokens": 16}))
    # page_tokens enters the codec id; the FORMAT.md vector keys the qwen3-8b id at page 16
    q16 = oscarkv.Codec(q16.profile, qc.id, q16.int2_page_bytes, q16.bf16_page_bytes)
    tokens = list(range(128)) + [7]
    k = qc.block_keys(tokens)
    kt = qc.block_keys(tokens, "tenant-a")
    big = q16.block_keys([0xFFFFFFFF - i for i in range(16)])
    return {
        "codec qwen3-8b": q.codec_id.hex(),
        "codec refmodel": r.codec_id.hex(),
        "codec qwen3-8b rot 0x01": oscarkv.CodecProfile(
            **{**q.__dict__, "rotation_digest": bytes([1] * 32)}).codec_id.hex(),
        "block 0": k[0].hex(), "block 1": k[1].hex(),
        "block 0 tenant-a": kt[0].hex(), "block 1 tenant-a": kt[1].hex(),
        "block 0 big page16": big[0].hex(),
    }


def test_golden_vectors():
    assert computed() == GOLDEN


def test_format_md_table_lists_exactly_these_values():
    text = (REPO / "docs" / "FORMAT.md").read_text()
    section = text[text.index("### 3.1 Golden vectors"):text.index("## 4.")]
    in_doc = re.findall(r"`([0-9a-f]{32})`", section)
    assert sorted(in_doc) == sorted(GOLDEN.values())


def test_trailing_partial_block_has_no_key():
    codec = oscarkv.Codec.local("refmodel")
    assert codec.block_keys(range(63)) == []
    assert len(codec.block_keys(range(64 * 3 + 5))) == 3


@pytest.mark.parametrize("seed", range(5))
def test_equals_independent_python_implementation(seed):
    rng = random.Random(seed)
    page_tokens = rng.choice([16, 32, 64, 128])
    prof = oscarkv.CodecProfile("m/%d" % seed, "rev", num_layers=rng.randint(1, 40),
                                num_kv_heads=rng.choice([1, 2, 8]), page_tokens=page_tokens,
                                rotation_digest=bytes(rng.randrange(256) for _ in range(32)))
    ref_id = oscarkv_keys.codec_id(**{k: v for k, v in prof.__dict__.items()})
    assert prof.codec_id == ref_id
    tokens = [rng.randrange(2**32) for _ in range(page_tokens * rng.randint(1, 6) + 3)]
    salt = "".join(rng.choice("abcé") for _ in range(rng.randint(0, 9)))
    codec = oscarkv.Codec.local(prof)
    want = oscarkv_keys.block_keys(ref_id, salt, tokens, page_tokens)
    assert codec.block_keys(tokens, salt) == want
    # numpy arrays (uint32, int64) and array-likes give the same keys
    assert codec.block_keys(np.array(tokens, dtype=np.uint32), salt) == want
    assert codec.block_keys(np.array(tokens, dtype=np.int64), salt.encode()) == want


def test_bad_tokens_are_invalid_argument():
    codec = oscarkv.Codec.local("refmodel")
    with pytest.raises(oscarkv.InvalidArgumentError):
        codec.block_keys([-1] * 64)
    with pytest.raises(oscarkv.InvalidArgumentError):
        codec.block_keys(np.full(64, 2**33, dtype=np.int64))
