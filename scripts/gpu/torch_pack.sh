#!/usr/bin/env bash
# Packs what scripts/gpu/torch_gpu.sh needs on the GPU machine (which has PyTorch and
# transformers but no gRPC/abseil development packages) into DEST (default
# .devcarry/i26-torch of the checkout that travels): the stripped kernels C ABI library
# (xz-compressed) with the abseil/xxhash runtime libraries it links, the python/ package source
# and tests, the reference model, and the scripts.
#   usage: scripts/gpu/torch_pack.sh [BUILD_DIR] [DEST]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
dest=${2:-/work/main/.devcarry/i26-torch}
lib=$build/kernels/cuda/capi/liboscarkv_cuda_c.so
[ -f "$lib" ] || { echo "missing $lib (cmake --build build --target oscarkv_cuda_c)"; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/refmodel"
strip -o "$dest/lib/liboscarkv_cuda_c.so" "$lib"
ldd "$lib" | awk '/=> \//{print $3}' | grep -E 'libabsl|libxxhash' | while read -r f; do
  cp -L "$f" "$dest/lib/"
done
xz -T2 -6 "$dest/lib/liboscarkv_cuda_c.so"
cp -r "$here/python" "$dest/python"
find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
cp "$here/scripts/gpu/torch_gpu.sh" "$dest/"
ref=${OSCARKV_REFMODEL:-$here/../../shared/refmodel}
[ -d "$ref" ] || ref=/work/shared/refmodel
cp "$ref"/config.json "$ref"/*.safetensors "$ref"/model.safetensors.index.json "$ref"/val.txt \
  "$dest/refmodel/"
du -sh "$dest"
