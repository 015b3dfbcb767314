"""Fixtures: a real oscarkvd on 127.0.0.1 (port 0, its own shared-memory pool) per test module.

The daemon binary is OSCARKVD (ctest sets it) or the source tree's build/service/oscarkvd. A
missing binary fails the tests that need it (never a silent skip).
"""
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))


def oscarkvd_path() -> str:
    p = os.environ.get("OSCARKVD") or str(REPO / "build" / "service" / "oscarkvd")
    if not Path(p).is_file():
        pytest.fail("oscarkvd not found at %s: build it (cmake --build build --target oscarkvd) "
                    "or set OSCARKVD=/path/to/oscarkvd" % p)
    return p


class Daemon:
    def __init__(self, extra=()):
        name = "oscarkv-pytest-%d-%d" % (os.getpid(), time.monotonic_ns() % 10**12)
        self.proc = subprocess.Popen(
            [oscarkvd_path(), "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--pool-mb",
             "64", "--shm-name", name, "--log-level", "warn", *extra],
            stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("oscarkvd ready "):
            self.stop()
            pytest.fail("no ready line from oscarkvd within 30 s: %r" % line)
        fields = dict(f.split("=", 1) for f in line.split()[2:])
        self.address = fields["listen"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    d.stop()
