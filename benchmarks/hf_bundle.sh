#!/bin/bash
# Stages, on a machine that reaches PyPI, the wheels the device needs for the `hf` extra:
# transformers 5.x with the dependencies the device lacks -> .device-bundle/hf/, and
# liger-kernel (hf_train.py's comparison) -> .device-bundle/liger/. Both folders are
# git-ignored: carry them to the device, where benchmarks/device_env.sh unzips them.
# The device's python is CPython 3.12 on x86_64 manylinux; torch's own dependencies
# (filelock, fsspec, typing-extensions, jinja2), numpy and pydantic are there already.
# Usage, from anywhere: bash benchmarks/hf_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HF=.device-bundle/hf
LIGER=.device-bundle/liger
rm -rf "$HF" && mkdir -p "$HF" "$LIGER"
python3 -m pip download -q 'transformers>=5,<6' --python-version 3.12 --implementation cp --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$HF"
rm -f "$HF"/numpy-* "$HF"/pydantic* "$HF"/annotated_types-* "$HF"/typing_inspection-* \
  "$HF"/typing_extensions-* "$HF"/filelock-* "$HF"/fsspec-*
python3 -m pip download -q 'liger-kernel>=0.8.5,<0.9' --no-deps -d "$LIGER"
du -sh "$HF" "$LIGER"
