#!/usr/bin/env python3
"""Builds the deterministic calibration text for `oscarkv calibrate`.

The reference model was trained on Debian's Python/Git/PostgreSQL/Perl/CMake/SQLite docs; its
held-out val.txt must never be used for calibration. This script concatenates documentation that
ships on a Debian 12 machine (Perl's perldiag, Git's contrib docs, the common licenses, and the
Python 3.11 standard library sources, which are mostly docstrings) in sorted path order, each
file capped, until --bytes are collected. Same machine packages, same bytes.

usage: make_calib_text.py OUT [--bytes N]
"""
import argparse
import glob
import hashlib
import os
import sys

SOURCES = [
    "/usr/share/perl/5.36/pod/*.pod",
    "/usr/share/doc/git/**/*.txt",
    "/usr/share/common-licenses/*",
    "/usr/lib/python3.11/*.py",
]
PER_FILE_CAP = 48 * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=1 << 20)
    a = ap.parse_args()
    val = "/work/shared/refmodel/val.txt"
    val_bytes = open(val, "rb").read() if os.path.exists(val) else b""
    buf = bytearray()
    used = []
    for pattern in SOURCES:
        for path in sorted(glob.glob(pattern, recursive=True)):
            if len(buf) >= a.bytes or not os.path.isfile(path):
                continue
            data = open(path, "rb").read()[:PER_FILE_CAP]
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(data) < 512 or (val_bytes and data[:256] in val_bytes):
                continue  # tiny files, or anything that also appears in the held-out set
            buf += data + b"\n\n"
            used.append(path)
    buf = buf[: a.bytes]
    with open(a.out, "wb") as f:
        f.write(buf)
    print(f"{a.out}: {len(buf)} bytes from {len(used)} files, sha256 "
          f"{hashlib.sha256(buf).hexdigest()[:16]}", file=sys.stderr)


if __name__ == "__main__":
    main()
