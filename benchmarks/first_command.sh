#!/usr/bin/env bash
# Times the README's first command from a fresh clone of this repository: venv, torch,
# `pip install -e .`, `mmserve generate` (then generate once more, as a second run would).
# No pip cache; PYTHONDONTWRITEBYTECODE unset, as on a fresh machine. As root, run
# `echo -20 > /proc/self/autogroup` first, and interleave the modes:
#   bash benchmarks/first_command.sh no-compile /tmp/first-a
#   bash benchmarks/first_command.sh compile /tmp/first-b   # the command without --no-compile
set -euo pipefail
mode=${1:?usage: first_command.sh no-compile|compile DIR}
dir=${2:?usage: first_command.sh no-compile|compile DIR}
case "$mode" in
  no-compile) nc=--no-compile ;;
  compile) nc= ;;
  *) echo "first_command.sh: mode must be no-compile or compile, not $mode" >&2; exit 2 ;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dir" && git clone -q "$repo" "$dir" && cd "$dir"
unset PYTHONDONTWRITEBYTECODE
export PIP_NO_CACHE_DIR=1
now() { date +%s.%N; }
t0=$(now)
python3 -m venv .venv && . .venv/bin/activate
t1=$(now)
pip install -q $nc torch==2.13.0 'setuptools>=77'
t2=$(now)
pip install -q $nc --no-build-isolation -e .
t3=$(now)
generate() {
  mmserve generate --model tiny-llava --image examples/shapes.png --prompt "What is in this image?"
}
generate >generate.out 2>&1
t4=$(now)
generate >/dev/null 2>&1
t5=$(now)
python3 -c "print('$mode: venv %.1f torch %.1f pip-e %.1f generate %.1f | total %.1f s | generate again %.1f' % ($t1-$t0, $t2-$t1, $t3-$t2, $t4-$t3, $t4-$t0, $t5-$t4))"
