"""Status codes map one to one onto exception classes, and real failures raise them."""
import os
import subprocess
import sys

import numpy as np
import pytest

import oscarkv
from oscarkv import StatusCode, _native


def test_codes_match_the_c_abi():
    lib = _native.load()
    for code in StatusCode:
        assert lib.oscarkv_status_name(int(code)).decode() == code.name
        cls = oscarkv.error_class(int(code))
        if code != StatusCode.OK:
            assert cls.code == code and issubclass(cls, oscarkv.OscarkvError)
            e = cls("m")
            assert e.code == code and e.code_name == code.name and "m" in str(e)
    assert len({oscarkv.error_class(c) for c in range(1, 16)}) == 15
    assert lib.oscarkv_status_name(99) == b"UNKNOWN_CODE"
    assert issubclass(oscarkv.InvalidArgumentError, ValueError)
    assert issubclass(oscarkv.DeadlineExceededError, TimeoutError)
    assert issubclass(oscarkv.UnavailableError, ConnectionError)


def test_unknown_shape_is_invalid_argument():
    with pytest.raises(oscarkv.InvalidArgumentError) as e:
        oscarkv.CodecProfile.builtin("no-such-model")
    assert e.value.code == 3 and "no-such-model" in e.value.message


def test_no_daemon_is_unavailable():
    with pytest.raises((oscarkv.UnavailableError, oscarkv.DeadlineExceededError)) as e:
        oscarkv.connect("127.0.0.1:1", rpc_timeout_ms=2000)
    assert "127.0.0.1:1" in e.value.message


def test_bad_options():
    with pytest.raises(oscarkv.InvalidArgumentError):
        oscarkv.connect("127.0.0.1:1", data_path="carrier-pigeon")
    with pytest.raises(oscarkv.InvalidArgumentError):
        oscarkv.connect("127.0.0.1:1", no_such_option=1)


def test_daemon_errors(daemon):
    prof = oscarkv.CodecProfile.builtin("refmodel")
    x = np.random.default_rng(0).uniform(-1, 1, (8, 2, 64, 2, 128)).astype(np.float32)
    with oscarkv.connect(daemon.address) as c:
        codec = c.register_codec("refmodel")
        unregistered = oscarkv.Codec.local(
            oscarkv.CodecProfile(**{**prof.__dict__, "model_revision": "never-registered"}))
        with pytest.raises(oscarkv.NotFoundError):
            c.lookup(unregistered, codec.block_keys(range(64)))
        key = codec.block_keys(range(1000, 1064))[0]
        page = codec.build_page(oscarkv.PageKind.INT2, x)
        page[100] ^= 1
        with pytest.raises(oscarkv.DataLossError) as e:
            c.store(codec, [(key, oscarkv.PageKind.INT2, page)])
        assert e.value.result.failed == 1 and e.value.result.stored == 0
        assert e.value.result.page_codes == [StatusCode.DATA_LOSS]
        assert c.exists(codec, [key]) == [False]
        with pytest.raises(oscarkv.InvalidArgumentError):
            c.store(codec, [(key, oscarkv.PageKind.INT2, b"short")])
        with pytest.raises(oscarkv.InvalidArgumentError):
            c.load_into(codec, [key], [b"read-only bytes"])
        with pytest.raises(oscarkv.InvalidArgumentError):
            c.lookup(codec, [b"not16"])
    with pytest.raises(oscarkv.FailedPreconditionError, match="closed"):
        c.lookup(codec, [key])


def test_missing_library_says_how_to_point_at_it():
    env = dict(os.environ, OSCARKV_LIBRARY="/nonexistent/liboscarkv_c.so")
    r = subprocess.run([sys.executable, "-c", "import oscarkv; oscarkv.library_path()"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and "OSCARKV_LIBRARY" in r.stderr
