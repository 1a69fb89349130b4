#!/bin/bash
# Stages, on a machine that reaches PyPI, Ray for the device (the `ray` extra: the Ray parts
# of benchmarks/gpu_schedule.sh). The device's python is CPython 3.12 on x86_64 manylinux and
# holds Ray's other dependencies (attrs, click, filelock, msgpack, packaging, protobuf,
# pyyaml, requests); the jsonschema family is added. Ray's wheel (79 MB) is over one call's
# 64 MiB carry, so what a local cluster does not use is left out (the Java jars, RLlib, Data,
# Serve, Train, Tune, LLM, the dashboard's web build; `ray start`, `ray.init` and tasks with
# GPU resources work without them: tests/verifier/test_schedule_ray.py passed against such a
# copy) and the rest is packed with xz: about 21 MB in the git-ignored .device-bundle/ray/,
# carried along the environment bundle in one call.
# Usage, from anywhere: bash benchmarks/ray_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=.device-bundle/ray
rm -rf "$B" && mkdir -p "$B/dl" "$B/tree"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$B/dl" ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
  rpds-py==2026.9.1
RAY=$(ls "$B"/dl/ray-*.whl)
python3 -m zipfile -e "$RAY" "$B/tree"
(cd "$B/tree/ray" && rm -rf jars rllib data serve train tune llm dashboard/client/build \
  && find . -name '*.map' -delete)
tar cf - -C "$B/tree" . | xz -9 -T0 > "$B/ray-pruned.tar.xz"
rm -rf "$B/tree" "$RAY"
mv "$B"/dl/*.whl "$B/" && rmdir "$B/dl"
du -sh "$B"
