#!/usr/bin/env bash
# On the GPU machine: the oscarkv.torch GPU tests, the reference model's quality through
# transformers + oscarkv, and `python -m oscarkv.bench model`, from a folder packed by
# scripts/gpu/torch_pack.sh. Logs and JSON go to $OUT (or /tmp/oscarkv-torch-out).
#   usage: [BENCH_ARGS=...] [SKIP_SLOW=1] torch_gpu.sh [PACK_DIR] [STAGES]   STAGES: comma list of tests,quality,smoke,bench
set -uo pipefail
pack=$(cd "${1:-$(dirname "$0")}" && pwd)
stages=${2:-tests,quality,bench}
out=${OUT:-/tmp/oscarkv-torch-out}
mkdir -p "$out"
work=/tmp/oscarkv-torch
mkdir -p "$work"
xz -dc "$pack/lib/liboscarkv_cuda_c.so.xz" > "$work/liboscarkv_cuda_c.so"
cp "$pack"/lib/*.so* "$work/" 2>/dev/null
rm -f "$work/liboscarkv_cuda_c.so.xz"
export LD_LIBRARY_PATH=$work:${LD_LIBRARY_PATH:-}
export OSCARKV_CUDA_LIBRARY=$work/liboscarkv_cuda_c.so
export OSCARKV_REFMODEL=$pack/refmodel OSCARKV_TEST_OUT=$out PYTHONPATH=$pack/python PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=python3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "gpus", torch.cuda.device_count())'
rc=0
for s in ${stages//,/ }; do
  t0=$(date +%s)
  case $s in
    tests)
      # SKIP_SLOW=1: -m "not slow" (leaves out the refmodel quality test, ~60 s)
      sel=()
      [ "${SKIP_SLOW:-0}" = 1 ] && sel=(-m "not slow")
      timeout ${TEST_TIMEOUT:-200} $py -m pytest -q -p no:cacheprovider "$pack/python/tests/test_torch_ops.py" \
        "$pack/python/tests/test_torch_fold.py" "$pack/python/tests/test_torch_refmodel.py" \
        "$pack/python/tests/test_torch_bench_model.py" "${sel[@]}" \
        -rA 2>&1 | tee "$out/tests.log" | tail -25 ;;
    quality)
      timeout 300 $py -m oscarkv.bench quality --model "$pack/refmodel" --text "$pack/refmodel/val.txt" \
        --codec hadamard 2>&1 | tee "$out/quality.log" | tail -3 ;;
    smoke)
      timeout 90 $py -m oscarkv.bench model --layers 2 --contexts 4096 --max-batch 4,2 \
        --ttft 4096,512 2>&1 | tee "$out/smoke.log" | tail -20 ;;
    bench)
      # BENCH_ARGS: e.g. "--profile $OUT/profile --eager-too" (kernel tables, eager rows)
      timeout ${BENCH_TIMEOUT:-260} $py -m oscarkv.bench model --json "$out/bench_model.json" ${BENCH_ARGS:-} 2>&1 \
        | tee "$out/bench_model.log" | tail -30 ;;
  esac
  r=${PIPESTATUS[0]}
  echo "== stage $s rc=$r ($(( $(date +%s) - t0 )) s)"
  [ "$r" = 0 ] || rc=1
done
exit $rc
