# Source on the H200 device machine (see ../shared/device/README.md), from the repo root:
#   source .device-bundle/p2/install.sh && source benchmarks/device_env.sh
# Makes `import coda_agent` work without pip-installing the project there: a shim folder
# maps coda_agent -> this checkout (and coda_agent.kernels -> generated_kernels/), exactly
# as pyproject's package-dir mapping does. `coda` is then the CLI.
REPO=$(pwd)
SHIM=/tmp/coda-shim
rm -rf "$SHIM"; mkdir -p "$SHIM/coda_agent"
for f in cli.py agent verifier; do ln -s "$REPO/$f" "$SHIM/coda_agent/$f"; done
ln -s "$REPO/generated_kernels" "$SHIM/coda_agent/kernels"
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
export QUACK_CACHE_DIR=${QUACK_CACHE_DIR:-/tmp/quack-cache}
export PYTHONUNBUFFERED=1
coda() { python3 -m coda_agent.cli "$@"; }
python3 - <<'PY'
import torch, importlib.metadata as md
print("device:", torch.cuda.get_device_name(0), "cc", torch.cuda.get_device_capability(0),
      "torch", torch.__version__, "cuda", torch.version.cuda,
      "cutlass-dsl", md.version("nvidia-cutlass-dsl"), "quack", md.version("quack-kernels"))
PY
