"""The reference model (../shared/refmodel) generating through transformers on oscarkv's pages on
the GPU: greedy generation equals stock transformers while every key is still BF16, and the
bits per byte of `oscarkv eval`'s windows, decoded token by token through the paged INT2 cache,
are within 0.002 bpb (recall probe: 0.005) of `oscarkv eval` with the same codec
(tests/data/refmodel_eval_hadamard.json, measured with the CPU reference engine).

gpu marker; needs PyTorch, transformers, liboscarkv_cuda_c.so and the model (OSCARKV_REFMODEL or
../shared/refmodel beside the checkout)."""
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: oscarkv.torch needs it")
pytest.importorskip("transformers", reason="transformers is not installed")

from oscarkv import LibraryNotFoundError  # noqa: E402

try:
    from oscarkv.torch import _capi  # noqa: E402
    _capi.load()
except LibraryNotFoundError as e:
    pytest.skip("liboscarkv_cuda_c.so not found (needs a CUDA build): %s" % e,
                allow_module_level=True)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HERE = Path(__file__).resolve().parent
MODEL = Path(os.environ.get("OSCARKV_REFMODEL", HERE.parents[2] / "shared" / "refmodel"))


@pytest.fixture(scope="module")
def model_dir():
    if not (MODEL / "config.json").is_file():
        pytest.fail("reference model not found at %s (set OSCARKV_REFMODEL)" % MODEL)
    return str(MODEL)


def test_generation_equals_stock_transformers_within_the_bf16_windows(model_dir):
    from transformers import AutoModelForCausalLM

    from oscarkv.torch import KVCodec
    from oscarkv.transformers import OscarkvCache, install
    install()
    ok = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                              attn_implementation="oscarkv").cuda()
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                               attn_implementation="sdpa").cuda()
    text = (MODEL / "val.txt").read_bytes()[5000:5200]
    ids = torch.tensor([list(text)], device="cuda")
    codec = KVCodec.builtin("hadamard", ok.config.num_hidden_layers, ok.config.num_key_value_heads)
    cache = OscarkvCache.for_model(ok, codec, max_seqs=1, max_seq_tokens=512, max_step_tokens=256)
    # for_model folded R_V into every o_proj: the attention returns rotated outputs
    from oscarkv.torch.fold import folded_digest
    assert all(folded_digest(layer.self_attn) == cache.value_basis for layer in ok.model.layers)
    got = ok.generate(ids, past_key_values=cache, max_new_tokens=24, do_sample=False)
    want = ref.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(got[0, :216], want[0, :216]), (bytes(got[0, 200:].tolist()),
                                                       bytes(want[0, 200:].tolist()))


@pytest.mark.slow
def test_bits_per_byte_within_oscarkv_eval(model_dir):
    from oscarkv.bench.quality import evaluate
    want = json.loads((HERE / "data" / "refmodel_eval_hadamard.json").read_text())
    got = evaluate(model_dir, str(MODEL / "val.txt"), want["codec"], want["windows"],
                   seed=want["seed"], device="cuda")
    out = os.environ.get("OSCARKV_TEST_OUT")
    if out:
        Path(out, "refmodel_quality.json").write_text(json.dumps({"got": got, "want": want}))
    print("refmodel quality through transformers + oscarkv:", got, "oscarkv eval:", want)
    assert abs(got["bpb"] - want["bpb"]) <= 0.002, (got, want)
    assert abs(got["recall_bpb"] - want["recall_bpb"]) <= 0.005, (got, want)
