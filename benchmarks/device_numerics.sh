# Run on the H200 (after `source .device-bundle/p2/install.sh`): the verifier's numerics
# and coverage on the real kernels, in one call, every part under its own timeout so a
# slow part never costs the others their results.
#   bash benchmarks/device_numerics.sh [PARTS]    PARTS: any of probe cal reverify (default: all)
#   CAL_SPECS="swiglu_fwd gemm_rope" bash benchmarks/device_numerics.sh cal   # calibrate only these specs
# Writes $OUT/numerics.tgz (every JSON and table) and prints each part's table.
set -u
source benchmarks/device_env.sh >/dev/null
parts=${*:-probe cal reverify}
mkdir -p "$OUT/n"
pack() { tar czf "$OUT/numerics.tgz" -C "$OUT" n; }
for p in $parts; do
  start=$(date +%s)
  case $p in
    probe) timeout ${PROBE_S:-150} python3 benchmarks/probes/op_domain_edges.py --json "$OUT/n/library_probe.json" ;;
    cal) spec_args=(); for sp in ${CAL_SPECS:-}; do spec_args+=(--spec "$sp"); done
         timeout ${CAL_S:-240} python3 benchmarks/probes/numerics_rule_calibration.py --device cuda --secrets ${CAL_SECRETS:-2} --sample 262144 \
           "${spec_args[@]}" --json "$OUT/n/calibration.jsonl" > "$OUT/n/calibration.md" 2> "$OUT/n/calibration.err"
         cat "$OUT/n/calibration.md"; [ -s "$OUT/n/calibration.md" ] || python3 benchmarks/probes/numerics_rule_calibration.py --summarize "$OUT/n/calibration.jsonl" ;;
    reverify) timeout ${REVERIFY_S:-360} python3 benchmarks/reverify.py --out "$OUT/n/reverify" --jobs 4 ;;
  esac
  echo "=== $p: exit $? in $(( $(date +%s) - start )) s ==="
  pack
done
