# Source on the H200 device machine (benchmarks/README.md, "On a device machine"), from the repo root:
#   source .device-bundle/p2/install.sh && source benchmarks/device_env.sh
# Makes `import coda_agent` work without pip-installing the project there: a shim folder
# maps coda_agent -> this checkout (and coda_agent.kernels -> generated_kernels/), exactly
# as pyproject's package-dir mapping does. `coda` is then the CLI.
REPO=$(pwd)
SHIM=/tmp/coda-shim
rm -rf "$SHIM"; mkdir -p "$SHIM/coda_agent"
for f in __init__.py __main__.py cli.py commands agent verifier runtime; do ln -s "$REPO/$f" "$SHIM/coda_agent/$f"; done
ln -s "$REPO/generated_kernels" "$SHIM/coda_agent/kernels"
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
# Liger Kernel (the optional `liger` benchmark baseline): the wheel travels in the
# git-ignored .device-bundle/liger/ (carry it); a pure-Python wheel, so unzipping it is
# installing it. Unzipped once per machine; without the wheel the baseline reads n/a.
LIGER_WHL=$(ls "$REPO"/.device-bundle/liger/liger_kernel-*.whl 2>/dev/null | sort -V | tail -n 1)
if [ -n "$LIGER_WHL" ]; then
  LIGER_PY=/tmp/liger-py
  if [ ! -f "$LIGER_PY/.done" ] || [ "$(cat "$LIGER_PY/.done")" != "$(basename "$LIGER_WHL")" ]; then
    rm -rf "$LIGER_PY" && mkdir -p "$LIGER_PY" && python3 -m zipfile -e "$LIGER_WHL" "$LIGER_PY" \
      && basename "$LIGER_WHL" > "$LIGER_PY/.done"
  fi
  export PYTHONPATH="$LIGER_PY:$PYTHONPATH"
fi
# transformers 5.x (the `hf` extra: benchmarks/hf_train.py, the GPU tests of
# tests/kernels/test_hf_patch.py): its wheels and those of the dependencies the device
# lacks travel in the git-ignored .device-bundle/hf/ (benchmarks/hf_bundle.sh stages
# them; carry it), unzipped once per machine like Liger's, last on PYTHONPATH (the
# device's own packages win). Without them those scripts and tests say they need it.
if ls "$REPO"/.device-bundle/hf/*.whl >/dev/null 2>&1; then
  HF_PY=/tmp/hf-py
  HF_STAMP=$(ls "$REPO"/.device-bundle/hf/ | sort | md5sum | cut -c1-12)
  if [ ! -f "$HF_PY/.done" ] || [ "$(cat "$HF_PY/.done")" != "$HF_STAMP" ]; then
    rm -rf "$HF_PY" && mkdir -p "$HF_PY"
    HF_OK=1
    for w in "$REPO"/.device-bundle/hf/*.whl; do python3 -m zipfile -e "$w" "$HF_PY" || HF_OK=0; done
    [ "$HF_OK" = 1 ] && echo "$HF_STAMP" > "$HF_PY/.done"
  fi
  export PYTHONPATH="$PYTHONPATH:$HF_PY"
fi
export QUACK_CACHE_DIR=${QUACK_CACHE_DIR:-/tmp/quack-cache}
export PYTHONUNBUFFERED=1
coda() { python3 -m coda_agent.cli "$@"; }
python3 - <<'PY'
import torch, importlib.metadata as md
def ver(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"
print("device:", torch.cuda.get_device_name(0), "cc", torch.cuda.get_device_capability(0),
      "torch", torch.__version__, "cuda", torch.version.cuda,
      "cutlass-dsl", md.version("nvidia-cutlass-dsl"), "quack", md.version("quack-kernels"),
      "liger-kernel", ver("liger-kernel"), "transformers", ver("transformers"))
PY
