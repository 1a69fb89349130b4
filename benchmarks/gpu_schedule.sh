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
#   bash benchmarks/gpu_schedule.sh ray         # carry .device-bundle/ray (benchmarks/ray_bundle.sh):
#                                               # install Ray, `ray start --head`, verify swiglu_fwd
#                                               # with --ray auto, `ray stop`
#   bash benchmarks/gpu_schedule.sh quick       # carry .device-bundle/ray; one call on one GPU, about
#                                               # 6-7 min: the gpu tests, then one batch (the accepted
#                                               # swiglu_fwd and 2 wrong variants, correctness only)
#                                               # verified one at a time, by the scheduler, and by the
#                                               # scheduler on a one-GPU Ray cluster; packs quick.tgz
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

ray_up() {
  # Ray from .device-bundle/ray (benchmarks/ray_bundle.sh), once per machine, then a one-node
  # cluster with this machine's GPUs. RAY_AUTH_MODE=disabled: the cluster and this script's
  # clients agree without a token file.
  local site=/tmp/ray-site
  if [ ! -f "$site/.done" ]; then
    rm -rf "$site" && mkdir -p "$site"
    tar xJf .device-bundle/ray/ray-pruned.tar.xz -C "$site" || return 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
      .device-bundle/ray/*.whl || return 1
    touch "$site/.done"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" RAY_AUTH_MODE=disabled
  python3 -m ray.scripts.scripts start --head --num-gpus="$(nvidia-smi -L | wc -l)" --num-cpus=8 \
    --include-dashboard=false 2>&1 | tail -3
}

ray_down() {
  python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
}

part_ray() {
  ray_up || return 1
  python -m coda_agent verify swiglu_fwd generated_kernels/swiglu_fwd/kernel.py --ray auto \
    --json "$OUT/ray_verify.json" 2>&1 | tee "$OUT/ray.log"
  local r=${PIPESTATUS[0]}
  ray_down
  return "$r"
}

part_quick() {
  local r=0
  timeout 200 python -m pytest -q -rs -p no:cacheprovider tests/verifier/test_schedule_gpu.py \
    "tests/kernels/test_probe_regressions.py::test_residual_rmsnorm_keeps_nonfinite_rows_at_a_ragged_n_on_gpu" \
    -s > "$OUT/tests.log" 2>&1 || r=1
  tail -5 "$OUT/tests.log"
  ray_up > "$OUT/ray_start.log" 2>&1 || { r=1; cat "$OUT/ray_start.log"; }
  timeout 330 python benchmarks/verify_throughput.py --out "$OUT/throughput" --kernels swiglu_fwd \
    --copies 1 --wrong 2 --no-bench --gpus 1 --ray auto > "$OUT/throughput.log" 2>&1 || r=1
  ray_down
  tail -12 "$OUT/throughput.log"
  rm -rf "$OUT/throughput/candidates"
  tar czf "$OUT/quick.tgz" -C "$OUT" tests.log ray_start.log throughput.log throughput
  return "$r"
}

case "$PART" in
  tests) part_tests || rc=1 ;;
  verify) part_verify || rc=1 ;;
  throughput) part_throughput || rc=1 ;;
  ray) part_ray || rc=1 ;;
  quick) part_quick || rc=1 ;;
  all)
    part_tests || rc=1
    part_verify || rc=1
    part_throughput || rc=1
    ;;
  *) echo "unknown part $PART (tests, verify, throughput, ray, quick, all)" >&2; exit 2 ;;
esac
exit $rc
