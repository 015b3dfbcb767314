"""Build hook: with OSCARKV_LIBRARY=/path/to/liboscarkv_c.so (or OSCARKV_BUILD_DIR=/path/to/build)
set at install time, the library is copied into the installed package (oscarkv/_lib/), so the
installed package finds it without any environment variable. Without them nothing is copied
and the library is found at run time (see oscarkv/_native.py)."""
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        self.bundle_client()
        self.bundle_kernels()

    def bundle_client(self):
        src = os.environ.get("OSCARKV_LIBRARY")
        if not src and os.environ.get("OSCARKV_BUILD_DIR"):
            src = str(Path(os.environ["OSCARKV_BUILD_DIR"]) / "client" / "liboscarkv_c.so")
        dst = Path(self.build_lib) / "oscarkv" / "_lib"
        if not src:
            # A library bundled by an earlier in-tree build must not ship silently (stale).
            shutil.rmtree(dst, ignore_errors=True)
            return
        if not Path(src).is_file():
            raise SystemExit("oscarkv: %s does not exist (build it: cmake --build build "
                             "--target oscarkv_c)" % src)
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / "liboscarkv_c.so")
        print("oscarkv: bundled %s" % src)

    def bundle_kernels(self):
        # liboscarkv_cuda_c.so (the kernels' C ABI for oscarkv.torch), when the build has CUDA.
        src = os.environ.get("OSCARKV_CUDA_LIBRARY")
        if not src and os.environ.get("OSCARKV_BUILD_DIR"):
            src = str(Path(os.environ["OSCARKV_BUILD_DIR"]) / "kernels" / "cuda" / "capi" /
                      "liboscarkv_cuda_c.so")
        if src and Path(src).is_file():
            dst = Path(self.build_lib) / "oscarkv" / "_lib"
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / "liboscarkv_cuda_c.so")
            print("oscarkv: bundled %s" % src)


setup(cmdclass={"build_py": BuildPyWithLibrary})
