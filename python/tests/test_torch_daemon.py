"""A prefix hit through a real oscarkvd: the second request for a prompt loads the first request's
pages from the daemon into a PagedKVCache (unchanged bytes, no recompute) and generates exactly
what a run without the daemon generates with the same split (the cached blocks computed first,
then the rest of the prompt), with the same codec. Runs the ops' CPU path (the kernels' CPU
references); needs PyTorch, transformers, liboscarkv_cuda_c.so and the reference model."""
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: oscarkv.torch needs it")
pytest.importorskip("transformers", reason="transformers is not installed")

import oscarkv  # noqa: E402
from oscarkv import LibraryNotFoundError  # noqa: E402

try:
    from oscarkv.torch import _capi  # noqa: E402
    _capi.load()
except LibraryNotFoundError as e:
    pytest.skip("liboscarkv_cuda_c.so not found (needs a CUDA build): %s" % e,
                allow_module_level=True)

MODEL = Path(os.environ.get("OSCARKV_REFMODEL",
                            Path(__file__).resolve().parents[3] / "shared" / "refmodel"))


@pytest.mark.slow
def test_generation_after_a_prefix_hit_equals_the_one_without_the_daemon(daemon):
    if not (MODEL / "config.json").is_file():
        pytest.fail("reference model not found at %s (set OSCARKV_REFMODEL)" % MODEL)
    from transformers import AutoModelForCausalLM

    from oscarkv.torch import KVCodec
    from oscarkv.transformers import OscarkvCache, generate, install
    install()
    model = AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32,
                                                 attn_implementation="oscarkv")
    cfg = model.config
    codec = KVCodec.builtin("hadamard", cfg.num_hidden_layers, cfg.num_key_value_heads,
                            model_id="refmodel")
    client = oscarkv.connect(daemon.address)
    reg = client.register_codec(codec.client_profile())
    text = (MODEL / "val.txt").read_bytes()[20000:20150]
    ids = torch.tensor([list(text)])  # 150 tokens: 2 full pages + 22 tokens
    kw = dict(max_new_tokens=6, do_sample=False)

    first = OscarkvCache.for_model(model, codec, max_seq_tokens=512, max_step_tokens=256,
                                   client=client, client_codec=reg)
    out1 = generate(model, ids, first, **kw)
    assert first.prefix_hit_tokens == 0
    assert client.exists(reg, reg.block_keys(list(text))) == [True, True]

    second = OscarkvCache.for_model(model, codec, max_seq_tokens=512, max_step_tokens=256,
                                    client=client, client_codec=reg)
    out2 = generate(model, ids, second, **kw)
    assert second.prefix_hit_tokens == 128

    alone = OscarkvCache.for_model(model, codec, max_seq_tokens=512, max_step_tokens=256)
    with torch.no_grad():
        model(ids[:, :128], past_key_values=alone, use_cache=True)
    out3 = model.generate(ids, past_key_values=alone, **kw)
    assert torch.equal(out2, out3), (bytes(out2[0, 150:].tolist()), bytes(out3[0, 150:].tolist()))
    # the loaded pages are the stored bytes
    assert second.paged.export_page(second.paged.pages[0][1]) == \
        bytes(client.load(reg, reg.block_keys(list(text))[:2])[1])
    assert out1.shape == out2.shape
    client.close()
