# Run on the H200 (after `source .device-bundle/p2/install.sh && source benchmarks/device_env.sh`):
#   bash benchmarks/gpu_generate.sh runs/<RUN> [runs/<RUN> ...]
#   FORCE=1 bash benchmarks/gpu_generate.sh runs/<RUN>   # replace an accepted kernel (regeneration)
# Resumes each agent run (its answered attempt goes through every verifier stage, GPU
# included; an accepted kernel lands in generated_kernels/<spec>/), then packs the run
# folders (without the saved .pt tensors) and the accepted kernel folders into one
# $OUT/generated.tgz: the device tool returns a bounded number of files, so one archive.
set -u
source benchmarks/device_env.sh >/dev/null
items=()
for run in "$@"; do
  spec=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['spec'])" "$run/run.json")
  echo "=== $spec ($run) ==="
  # (a kept CPU-stage pass is verified again by the loop itself, GPU stages included)
  start=$(date +%s)
  python3 -m coda_agent.cli generate "$spec" --resume "$run" ${FORCE:+--force} 2>&1 | tail -25
  echo "exit=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"
  items+=("$run")
  [ -d "generated_kernels/$spec" ] && items+=("generated_kernels/$spec")
  # re-packed after every run, so a time limit still returns the runs already done
  tar czf "$OUT/generated.tgz" --exclude='*.pt' "${items[@]}"
done
