# The speed work on the device machine, in phases that each fit one device call
# (after `source .device-bundle/p2/install.sh`):
#   bash benchmarks/device_speed.sh tune KERNEL...   # GPU launcher tests, host time, coda-agent tune
#   bash benchmarks/device_speed.sh layer            # layer before/after, time to first step
# Results under $OUT; the tuning table stays in /tmp/coda-tuning.json for the next phase.
set -u
source benchmarks/device_env.sh
export CODA_KERNEL_CACHE=/tmp/coda-kernel-cache
phase=$1; shift
case "$phase" in
tune)
  python3 -m pytest -q -m gpu tests/runtime/test_launch_gpu.py -x -p no:cacheprovider 2>&1 | tail -15
  python3 benchmarks/host_time.py --out "$OUT/host_time.json" 2>&1 | tail -8
  start=$(date +%s)
  timeout "${TUNE_S:-420}" python3 -m coda_agent.cli tune "$@" --space quick -j 16 --out "$OUT/tuning.md" 2>&1 | tail -40
  echo "tune wall=$(( $(date +%s) - start ))s"
  cp generated_kernels/tuning.json "$OUT/tuning.json" && cp generated_kernels/tuning.json /tmp/coda-tuning.json
  tar czf "$OUT/tune-raw.tgz" -C "$OUT" tuning 2>/dev/null; rm -rf "$OUT/tuning"
  ;;
layer)
  [ -f /tmp/coda-tuning.json ] && cp /tmp/coda-tuning.json generated_kernels/tuning.json
  for shape in "$@"; do
    CODA_LAUNCH=mod CODA_ROUTE=fused python3 benchmarks/llama_layer.py --time-only --rounds 2 --profile 1 \
      --shape "$shape" --out "$OUT/before-$shape" 2>&1 | tail -22
    python3 benchmarks/llama_layer.py --time-only --rounds 2 --profile 1 --shape "$shape" \
      --out "$OUT/after-$shape" 2>&1 | tail -22
  done
  ;;
esac
