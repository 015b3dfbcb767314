#!/usr/bin/env python3
"""A second-language client: Python (grpcio) against a real oscarkvd on 127.0.0.1.

Checks that an engine written in Python, using only the proto and docs/FORMAT.md (via
tools/oscarkv_keys.py), interoperates with the C++ side: the daemon returns the codec id Python
computed, pages Python writes through Reserve/WritePages/Commit are found by the C++ `oscarkv
lookup` from the same token ids (same block keys), and come back byte-identical over ReadPages.

  python_client_test.py --oscarkvd PATH --oscarkv PATH --source-dir DIR
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile
import json

import grpc
import xxhash
from grpc_tools import protoc


def start_daemon(path):
    name = "oscarkv-py-%d" % os.getpid()
    proc = subprocess.Popen(
        [path, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--pool-mb", "32",
         "--shm-name", name, "--log-level", "warn"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # the one ready line
    if not line.startswith("oscarkvd ready "):
        proc.kill()
        raise SystemExit("no ready line from oscarkvd: %r" % line)
    fields = dict(f.split("=", 1) for f in line.split()[2:])
    return proc, fields["listen"]


def make_page(codec_id, seed, layers=8, kv_heads=2, head_dim=128, page_tokens=64):
    """A BF16 page (kind 2) per docs/FORMAT.md §1, payload from a simple byte pattern."""
    segment = page_tokens * head_dim * 2
    payload_bytes = layers * 2 * kv_heads * segment
    payload = bytes((i * 31 + seed * 7) & 0x7F for i in range(payload_bytes))
    head = struct.pack("<IHBB16sHHHHHHIQQ", 0x50564B4F, 1, 2, 1, codec_id, layers, kv_heads,
                       head_dim, 128, page_tokens, page_tokens, 0, payload_bytes, 0)
    assert len(head) == 56
    checksum = xxhash.xxh3_64_intdigest(head + payload, seed=0)
    return head + struct.pack("<Q", checksum) + payload


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--oscarkvd", required=True)
    ap.add_argument("--oscarkv", required=True)
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()

    sys.path.insert(0, os.path.join(args.source_dir, "tools"))
    import oscarkv_keys  # noqa: E402

    gen = tempfile.mkdtemp(prefix="oscarkv-py-")
    rc = protoc.main(["protoc", "-I" + os.path.join(args.source_dir, "proto"),
                      "--python_out=" + gen, "--grpc_python_out=" + gen,
                      os.path.join(args.source_dir, "proto/oscarkv/v1/oscarkv.proto")])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, gen)
    from oscarkv.v1 import oscarkv_pb2 as pb  # noqa: E402
    from oscarkv.v1 import oscarkv_pb2_grpc as pbg  # noqa: E402

    proc, addr = start_daemon(args.oscarkvd)
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    try:
        stub = pbg.KvCacheStub(grpc.insecure_channel(addr))
        hs = stub.Handshake(pb.HandshakeRequest(wire_version=1, client_name="python"), timeout=10)
        check(hs.max_batch > 0, "handshake max_batch")

        ref = oscarkv_keys.REFMODEL
        prof = pb.CodecProfile(**{k: v for k, v in ref.items()})
        reg = stub.RegisterCodec(pb.RegisterCodecRequest(profile=prof), timeout=10)
        codec = oscarkv_keys.codec_id(**ref)
        check(reg.codec_id == codec, "daemon's codec id == Python's")
        page0 = make_page(codec, 0)
        check(reg.bf16_page_bytes == len(page0), "BF16 page size")

        tokens = [(i * 7919) % 151936 for i in range(3 * 64 + 5)]
        keys = oscarkv_keys.block_keys(codec, "", tokens, 64)
        pages = [make_page(codec, i) for i in range(len(keys))]

        res = stub.Reserve(pb.ReserveRequest(
            codec_id=codec, items=[pb.ReserveItem(key=k, kind=pb.PAGE_KIND_BF16) for k in keys]),
            timeout=10)
        check(all(r.status.code == 0 for r in res.results), "reserve")

        def chunks():
            for k, p in zip(keys, pages):
                for off in range(0, len(p), 1 << 20):
                    yield pb.WriteChunk(reservation_id=res.reservation_id, key=k, offset=off,
                                        data=p[off:off + (1 << 20)])
        stub.WritePages(chunks(), timeout=30)
        com = stub.Commit(pb.CommitRequest(reservation_id=res.reservation_id, keys=keys),
                          timeout=10)
        check([r.code for r in com.results] == [0] * len(keys),
              "commit: %s" % [r.message for r in com.results])

        # The C++ tool computes the same keys from the same token ids.
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(" ".join(map(str, tokens)))
        out = subprocess.run([args.oscarkv, "lookup", "--json", "--shape", "refmodel",
                              "--tokens-file", f.name, "--addr", addr],
                             capture_output=True, text=True, timeout=60)
        os.unlink(f.name)
        check(out.returncode == 0, "oscarkv lookup exit: %s" % out.stderr)
        if out.returncode == 0:
            got = json.loads(out.stdout)
            check(got["matched"] == len(keys), "C++ lookup of Python-stored pages")
            check([b["key"] for b in got["blocks"]] == [k.hex() for k in keys],
                  "C++ block keys == Python block keys")

        look = stub.Lookup(pb.LookupRequest(codec_id=codec, keys=keys, pin=True), timeout=10)
        check(look.matched == len(keys) and look.lease_id != 0, "pinned lookup")
        got = {}
        for ch in stub.ReadPages(pb.ReadRequest(lease_id=look.lease_id, keys=keys), timeout=30):
            buf = got.setdefault(ch.key, bytearray(ch.page_bytes))
            buf[ch.offset:ch.offset + len(ch.data)] = ch.data
        check([bytes(got.get(k, b"")) for k in keys] == pages, "ReadPages bytes identical")
        stub.Release(pb.ReleaseRequest(lease_id=look.lease_id), timeout=10)

        try:
            stub.Lookup(pb.LookupRequest(codec_id=codec, keys=[b"short"]), timeout=10)
            check(False, "malformed key accepted")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "malformed key -> INVALID_ARGUMENT")
        st = stub.Stats(pb.StatsRequest(), timeout=10)
        check(st.pages == len(keys) and st.leases == 0, "stats after release")
    finally:
        proc.terminate()
        code = proc.wait(timeout=15)
    check(code == 0, "oscarkvd exit status %d after SIGTERM" % code)
    if failures:
        print("%d checks failed" % len(failures))
        return 1
    print("python client: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
