# Run on the device machine (after `source .device-bundle/p2/install.sh && source benchmarks/device_env.sh`):
#   bash benchmarks/gpu_generate.sh runs/<RUN> [runs/<RUN> ...]
#   FORCE=1 bash benchmarks/gpu_generate.sh runs/<RUN>      # replace an accepted kernel (regeneration)
#   PARALLEL=1 GEN_S=420 bash benchmarks/gpu_generate.sh runs/<A> runs/<B>   # side by side, each capped
# Resumes each agent run (its answered attempt goes through every verifier stage, GPU
# included; an accepted kernel lands in generated_kernels/<spec>/), then packs the run
# folders (without the saved .pt tensors) and the accepted kernel folders into one
# $OUT/generated.tgz: the device tool returns a bounded number of files, so one archive.
# Side by side (PARALLEL=1) the runs share the GPU the way the scheduler's leases allow:
# correctness runs together, every timing alone (a host-wide flock per GPU).
set -u
source benchmarks/device_env.sh >/dev/null
spec_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['spec'])" "$1/run.json"; }
gen() {  # gen RUN: resume one run, log to $OUT/generate-<spec>.log
  local run=$1 spec start
  spec=$(spec_of "$run"); start=$(date +%s)
  { echo "=== $spec ($run) ==="
    timeout "${GEN_S:-0}" python3 -m coda_agent.cli generate "$spec" --resume "$run" ${FORCE:+--force} 2>&1 | tail -25
    echo "exit=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"; } > "$OUT/generate-$spec.log"
  cat "$OUT/generate-$spec.log"
}
pack() {  # the run folders and whatever was accepted, re-packed so a time limit keeps what is done
  local items=() run spec
  for run in "$@"; do
    spec=$(spec_of "$run"); items+=("$run")
    [ -d "generated_kernels/$spec" ] && items+=("generated_kernels/$spec")
  done
  tar czf "$OUT/generated.tgz" --exclude='*.pt' "${items[@]}"
}
done_runs=()
for run in "$@"; do
  if [ -n "${PARALLEL:-}" ]; then gen "$run" & else gen "$run"; done_runs+=("$run"); pack "${done_runs[@]}"; fi
done
[ -n "${PARALLEL:-}" ] && { wait; pack "$@"; }
exit 0
