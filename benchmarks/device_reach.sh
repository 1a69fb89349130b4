# Issue 34's GPU work in one device call (after `source .device-bundle/p2/install.sh`):
#   bash benchmarks/device_reach.sh runs/<RUN> ...    # carry the run folders
# Resumes the given agent runs side by side (benchmarks/gpu_generate.sh, PARALLEL=1, each
# capped at GEN_S seconds), then runs the GPU tests of the reach kernels' numerics and
# training ops. Results under $OUT: generate-<spec>.log, generated.tgz, reach-tests.log.
set -u
source benchmarks/device_env.sh
PARALLEL=1 GEN_S=${GEN_S:-400} bash benchmarks/gpu_generate.sh "$@"
ls generated_kernels
timeout "${TEST_S:-120}" python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/verifier/test_numerics_fp8.py \
  tests/kernels/test_qknorm_ops.py tests/kernels/test_fp8_ops.py 2>&1 | tail -25 | tee "$OUT/reach-tests.log"
