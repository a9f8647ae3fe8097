#!/usr/bin/env bash
# The GPU run in one command (docs/gpu.md). On the device machine: install the carried wheels
# (.whl/, from bundle.sh) and mmserve from this checkout against the machine's own torch, then
# run `mmserve bench gpu`, which writes gpu.json and gpu.md under $OUT. Arguments go to it;
# with --dry-run nothing is installed (the CPU dry run that CI runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
export OUT="${OUT:-bench_results/gpu}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT"
if [[ " $* " != *" --dry-run "* ]]; then
  start=$SECONDS
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || echo "run.sh: installing .whl/ failed"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # no CPU kernels: the run is on the GPU, and their build would spend device minutes
  MMSERVE_KERNEL_VARIANTS=none timeout "${MMSERVE_INSTALL_TIMEOUT:-240}" "$PY" -m pip install --no-deps \
    --no-build-isolation -e . >"$OUT/install.log" 2>&1 ||
    echo "run.sh: pip install -e . failed or timed out (install.log); running from the checkout"
  echo "run.sh: install took $((SECONDS - start)) s"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m mmserve.bench.cli gpu --out "$OUT" "$@" 2>&1 | tee "$OUT/run.log"
