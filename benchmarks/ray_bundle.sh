#!/bin/bash
# Stages, on a machine that reaches PyPI, Ray for the device (the `ray` extra: `--ray auto`
# runs of benchmarks/gpu_schedule.sh). The device's python is CPython 3.12 on x86_64
# manylinux and holds Ray's other dependencies (attrs, click, filelock, msgpack, packaging,
# protobuf, pyyaml, requests); the jsonschema family is added. Ray's wheel (79 MB) is over
# one call's 64 MiB carry, so it travels split in two git-ignored folders,
# .device-bundle/ray/1 and .device-bundle/ray/2, one per call: the first call copies its
# part to /tmp/ray-parts, the second joins them and installs (gpu_schedule.sh ray-stage,
# then gpu_schedule.sh ray, on the same warm machine).
# Usage, from anywhere: bash benchmarks/ray_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=.device-bundle/ray
rm -rf "$B" && mkdir -p "$B/1" "$B/2" "$B/dl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$B/dl" ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
  rpds-py==2026.9.1
RAY=$(ls "$B"/dl/ray-*.whl)
split -n 2 -d "$RAY" "$B/ray.part"
mv "$B/ray.part00" "$B/1/" && mv "$B/ray.part01" "$B/2/"
basename "$RAY" > "$B/2/NAME"
mv "$B"/dl/*.whl "$B/2/" 2>/dev/null || true
rm -f "$B/2/$(basename "$RAY")" && rmdir "$B/dl"
du -sh "$B/1" "$B/2"
