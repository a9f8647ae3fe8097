#!/usr/bin/env bash
# Prepare the wheels the GPU run carries (docs/gpu.md): benchmarks/gpu/wheels.txt for CPython
# 3.12 on x86-64 Linux into .whl/ (git-ignored), then check that the bundle stays well under the
# 64 MiB a device call carries (the working tree counts too): at most $MMSERVE_BUNDLE_MIB MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
LIMIT_MIB="${MMSERVE_BUNDLE_MIB:-48}"
rm -rf .whl
mkdir .whl
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl -r benchmarks/gpu/wheels.txt
bytes=$(du -sb .whl | cut -f1)
count=$(find .whl -type f -name '*.whl' | wc -l)
echo "bundle: $count wheels, $bytes bytes ($((bytes / 1048576)) MiB; at most $LIMIT_MIB MiB)"
if ((bytes > LIMIT_MIB * 1048576)); then
  echo "bundle.sh: .whl/ is over $LIMIT_MIB MiB: drop a package or make its import lazy" >&2
  exit 1
fi
