"""connect(..., tls_ca=, tls_cert=, tls_key=) against a real oscarkvd with mTLS (--tls-cert,
--tls-key, --tls-client-ca), with a throwaway CA and certificates made by the openssl tool at
test time: the CA's client is served (store, lookup, load over TLS); no certificate, another
CA's certificate, plaintext and a missing file are refused. With tenants (a config naming the
certificates' CNs): connect(..., shared_namespace=) shares pages between the namespace's members
only; a non-member is refused at connect."""
import shutil
import subprocess

import numpy as np
import pytest

import oscarkv
from oscarkv import PageKind

from conftest import Daemon

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "openssl %s: %s" % (" ".join(args), r.stderr)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl tool is needed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("pki")
    (d / "san.cnf").write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    for ca in ("ca", "other"):
        _openssl("req", "-x509", *EC, "-days", "2", "-subj", "/CN=%s-ca" % ca, "-keyout",
                 "%s.key" % ca, "-out", "%s.pem" % ca, cwd=d)
    leaves = [("server", "ca", "/CN=127.0.0.1", ["-extfile", "san.cnf"]),
              ("client", "ca", "/CN=tenant-client", []),
              ("stranger", "other", "/CN=tenant-stranger", []),
              ("tenant-a", "ca", "/CN=tenant-a", []), ("tenant-b", "ca", "/CN=tenant-b", []),
              ("outsider", "ca", "/CN=outsider", [])]
    for serial, (name, ca, subj, ext) in enumerate(leaves, start=2):
        _openssl("req", *EC, "-subj", subj, "-keyout", "%s.key" % name, "-out", "%s.csr" % name,
                 cwd=d)
        _openssl("x509", "-req", "-in", "%s.csr" % name, "-CA", "%s.pem" % ca, "-CAkey",
                 "%s.key" % ca, "-set_serial", str(serial), "-days", "2", *ext, "-out",
                 "%s.pem" % name, cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_daemon(pki):
    d = Daemon(extra=["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
                      "--tls-client-ca", str(pki / "ca.pem")])
    yield d
    d.stop()


def tls_kw(pki, client="client"):
    kw = {"tls_ca": str(pki / "ca.pem"), "rpc_timeout_ms": 5000}
    if client:
        kw.update(tls_cert=str(pki / ("%s.pem" % client)), tls_key=str(pki / ("%s.key" % client)))
    return kw


@pytest.mark.parametrize("data_path", ["auto", "grpc"])
def test_mutual_tls_round_trip(tls_daemon, pki, data_path):
    with oscarkv.connect(tls_daemon.address, data_path=data_path, **tls_kw(pki)) as c:
        codec = c.register_codec("refmodel")
        p = codec.profile
        rng = np.random.default_rng(11 if data_path == "auto" else 12)
        tokens = rng.integers(0, 151936, size=p.page_tokens, dtype=np.uint32)
        keys = codec.block_keys(tokens)
        x = rng.uniform(-2, 2, (p.num_layers, 2, p.page_tokens, p.num_kv_heads, p.head_dim))
        page = codec.build_page(PageKind.INT2, x.astype(np.float32))
        r = c.store(codec, [(keys[0], PageKind.INT2, page)])
        assert r.stored == 1
        assert c.lookup(codec, keys) == 1
        got = c.load(codec, keys)
        assert len(got) == 1 and bytes(got[0]) == bytes(page)


def test_refused_without_the_cas_certificate(tls_daemon, pki):
    with pytest.raises(oscarkv.UnavailableError):
        oscarkv.connect(tls_daemon.address, **tls_kw(pki, client=None))
    with pytest.raises(oscarkv.UnavailableError):
        oscarkv.connect(tls_daemon.address, **tls_kw(pki, client="stranger"))
    with pytest.raises(oscarkv.OscarkvError):
        oscarkv.connect(tls_daemon.address, rpc_timeout_ms=5000)  # plaintext
    kw = tls_kw(pki)
    kw["tls_key"] = str(pki / "missing.key")
    with pytest.raises(oscarkv.NotFoundError):
        oscarkv.connect(tls_daemon.address, **kw)
    kw = {"tls_cert": str(pki / "client.pem"), "tls_key": str(pki / "client.key")}
    with pytest.raises(oscarkv.InvalidArgumentError, match="tls_ca_file"):
        oscarkv.connect(tls_daemon.address, **kw)  # a certificate but no CA to check the daemon


@pytest.fixture(scope="module")
def tenants_daemon(pki):
    cfg = pki / "tenants.yaml"
    cfg.write_text("tls:\n  cert: %s\n  key: %s\n  client_ca: %s\n"
                   "tenants:\n  - name: tenant-a\n  - name: tenant-b\n  - name: outsider\n"
                   "shared_namespaces:\n  - {name: common, tenants: [tenant-a, tenant-b]}\n"
                   % (pki / "server.pem", pki / "server.key", pki / "ca.pem"))
    d = Daemon(extra=["--config", str(cfg)])
    yield d
    d.stop()


def test_shared_namespace_is_shared_by_its_members_only(tenants_daemon, pki):
    addr = tenants_daemon.address
    with oscarkv.connect(addr, shared_namespace="common", **tls_kw(pki, "tenant-a")) as a, \
            oscarkv.connect(addr, shared_namespace="common", **tls_kw(pki, "tenant-b")) as b, \
            oscarkv.connect(addr, **tls_kw(pki, "tenant-b")) as own:
        codec = a.register_codec("refmodel")
        p = codec.profile
        rng = np.random.default_rng(21)
        tokens = rng.integers(0, 151936, size=p.page_tokens, dtype=np.uint32)
        keys = codec.block_keys(tokens)
        x = rng.uniform(-2, 2, (p.num_layers, 2, p.page_tokens, p.num_kv_heads, p.head_dim))
        page = codec.build_page(PageKind.INT2, x.astype(np.float32))
        assert a.store(codec, [(keys[0], PageKind.INT2, page)]).stored == 1
        codec_b = b.register_codec("refmodel")
        assert b.lookup(codec_b, keys) == 1
        got = b.load(codec_b, keys)
        assert len(got) == 1 and bytes(got[0]) == bytes(page)
        # tenant-b outside the namespace: its own keys do not see the page.
        assert own.lookup(own.register_codec("refmodel"), keys) == 0
    with pytest.raises(oscarkv.PermissionDeniedError, match="not a member"):
        oscarkv.connect(addr, shared_namespace="common", **tls_kw(pki, "outsider"))
    with pytest.raises(oscarkv.PermissionDeniedError):
        oscarkv.connect(addr, shared_namespace="no-such-ns", **tls_kw(pki, "tenant-a"))
    with pytest.raises(oscarkv.InvalidArgumentError, match="shared_namespace"):
        oscarkv.connect(addr, shared_namespace="common", lookup_path="local",
                        **tls_kw(pki, "tenant-a"))
