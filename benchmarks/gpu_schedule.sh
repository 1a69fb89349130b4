#!/bin/bash
# The scheduler's GPU checks (verifier/schedule/), one part per call, results under $OUT.
# Run from the repo root on a device machine whose environment is set up as
# benchmarks/README.md says ("On a device machine": the bundle, then device_env.sh).
#
#   bash benchmarks/gpu_schedule.sh tests       # the gpu tests: the free-memory race, verifications
#                                               # beside a churning neighbour, residual_rmsnorm's ragged N
#   bash benchmarks/gpu_schedule.sh verify      # 5 copies of the accepted swiglu_fwd side by side
#                                               # (--no-bench), expecting 5 x gpu-correct (exit 0)
#   bash benchmarks/gpu_schedule.sh throughput  # benchmarks/verify_throughput.py (full verification)
#   bash benchmarks/gpu_schedule.sh ray-stage   # carry .device-bundle/ray/1 (benchmarks/ray_bundle.sh)
#   bash benchmarks/gpu_schedule.sh ray         # carry .device-bundle/ray/2: install Ray, `ray start
#                                               # --head`, verify swiglu_fwd with --ray auto, `ray stop`
#   bash benchmarks/gpu_schedule.sh all         # tests, verify, throughput (about 10 min on an H100)
#
# Each part writes <part>.log (and its JSON) into $OUT and exits non-zero when its check fails.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-schedule}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PART=${1:-all}
rc=0

part_tests() {
  python -m pytest -q -rs -p no:cacheprovider tests/verifier/test_schedule_gpu.py \
    "tests/kernels/test_probe_regressions.py::test_residual_rmsnorm_keeps_nonfinite_rows_at_a_ragged_n_on_gpu" \
    -s 2>&1 | tee "$OUT/tests.log"
}

part_verify() {
  local d=/tmp/gpu-schedule-files
  rm -rf "$d" && mkdir -p "$d"
  local files=()
  for i in 1 2 3 4 5; do
    mkdir -p "$d/k$i" && cp generated_kernels/swiglu_fwd/kernel.py "$d/k$i/kernel.py"
    files+=("$d/k$i/kernel.py")
  done
  python -m coda_agent verify swiglu_fwd "${files[@]}" --no-bench --json "$OUT/verify_many.json" 2>&1 \
    | tee "$OUT/verify.log"
}

part_throughput() {
  python benchmarks/verify_throughput.py --out "$OUT/throughput" 2>&1 | tee "$OUT/throughput.log"
}

part_ray_stage() {
  mkdir -p /tmp/ray-parts && cp .device-bundle/ray/1/ray.part00 /tmp/ray-parts/ && ls -la /tmp/ray-parts
}

part_ray() {
  local name
  name=$(cat .device-bundle/ray/2/NAME)
  cat /tmp/ray-parts/ray.part00 .device-bundle/ray/2/ray.part01 > "/tmp/ray-parts/$name" || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ray-site \
    "/tmp/ray-parts/$name" .device-bundle/ray/2/*.whl || return 1
  export PYTHONPATH="/tmp/ray-site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/ray-site/bin:$PATH"
  ray start --head --num-gpus=1 --num-cpus=8 --include-dashboard=false 2>&1 | tail -3
  python -m coda_agent verify swiglu_fwd generated_kernels/swiglu_fwd/kernel.py --ray auto \
    --json "$OUT/ray_verify.json" 2>&1 | tee "$OUT/ray.log"
  local r=${PIPESTATUS[0]}
  ray stop --force >/dev/null 2>&1
  return "$r"
}

case "$PART" in
  tests) part_tests || rc=1 ;;
  verify) part_verify || rc=1 ;;
  throughput) part_throughput || rc=1 ;;
  ray-stage) part_ray_stage || rc=1 ;;
  ray) part_ray || rc=1 ;;
  all)
    part_tests || rc=1
    part_verify || rc=1
    part_throughput || rc=1
    ;;
  *) echo "unknown part $PART (tests, verify, throughput, ray-stage, ray, all)" >&2; exit 2 ;;
esac
exit $rc
