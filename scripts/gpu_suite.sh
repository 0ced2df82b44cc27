#!/usr/bin/env bash
# The GPU suite in parts of a few minutes each on an H200, so that a GPU host whose commands are
# cut at 10 minutes runs the whole suite in a handful of commands (docs/contributing.md, "The GPU
# suite in parts").
#
#   scripts/gpu_suite.sh PART...   run these parts in order; `all`: every part
#   scripts/gpu_suite.sh --list    each part and the test files it runs
#
# Parts: deep (the kernel's deep-tree, skip, mutant and gather tests), kernel (the rest of the
# kernel's file but the sweep), byok, notebooks, rest-a-l and rest-m-z (every other test file, by
# its first letter), sweep (KDKIT_SWEEP seeds, default 60, without the Triton comparison),
# sanitizer (compute-sanitizer's memcheck, racecheck and synccheck on kdkit.perf.gpu_selfcheck).
# The first part that needs the kernel's builds compiles them (a few minutes on a fresh machine).
#
# JOBS=N spreads each pytest part over N worker processes (pytest-xdist, in the GPU wheelhouse):
# the kernel's builds then compile on N cores and the tests share the one GPU. A part's timing
# tests take the least of their repetitions, so they hold under that load.
#
# It runs the python on PATH (PYTHON=... to choose; the GPU hosts reach no registry, so there is
# no venv to make), from the project root with PYTHONPATH set to it. Each part's whole output goes
# to $LOGS/PART.txt (LOGS: $OUT where set, else gpu-suite-logs); stdout gets its exit status, its
# time and its last lines. The exit status is the number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
LOGS=${LOGS:-${OUT:-gpu-suite-logs}}
PARTS="deep kernel byok notebooks rest-a-l rest-m-z sweep sanitizer"
DEEP="deep or skipped or mutants or skip_ or mask_decides or gather"
BYOK="tests/test_byok_cuda.py tests/test_byok_triton.py tests/test_cli_byok.py tests/test_registry.py tests/test_launch.py"
NOTEBOOKS="tests/test_notebooks.py tests/test_notebook_browser.py tests/test_develop.py"

others() {  # the test files that no named part runs, whose names start in [$1]
  local f
  for f in tests/test_[$1]*.py; do  # ($1 unquoted: a bracket range, a-l)
    case " tests/test_cuda_kernel.py $BYOK $NOTEBOOKS " in *" $f "*) ;; *) printf '%s ' "$f" ;; esac
  done
}

files() {  # a part's test files
  case $1 in
    deep | kernel | sweep) echo tests/test_cuda_kernel.py ;;
    byok) echo "$BYOK" ;;
    notebooks) echo "$NOTEBOOKS" ;;
    rest-a-l) others a-l ;;
    rest-m-z) others m-z ;;
    sanitizer) ;;
    *) return 1 ;;
  esac
}

pytest_part() {
  local jobs=()
  [ -z "${JOBS:-}" ] || jobs=(-n "$JOBS")
  "$PY" -m pytest -q -p no:cacheprovider -rfE --durations=5 "${jobs[@]}" "$@"
}

run_part() {
  # shellcheck disable=SC2046  # (files: one word per file)
  case $1 in
    deep) pytest_part tests/test_cuda_kernel.py -k "$DEEP" ;;
    kernel) pytest_part tests/test_cuda_kernel.py -k "not (test_sweep or $DEEP)" ;;
    sweep) KDKIT_SWEEP=${KDKIT_SWEEP:-60} KDKIT_SWEEP_TRITON=${KDKIT_SWEEP_TRITON:-0} \
             pytest_part tests/test_cuda_kernel.py -k test_sweep ;;
    sanitizer)
      local tool rc=0
      # --report-api-errors no: cuda-bindings asks the driver for every entry point it wraps
      # (cuGetProcAddress), the driver refuses those it lacks, and memcheck would count each refusal
      # as an error. kdkit checks each CUresult of its own calls (kernel.launch's LaunchError); the
      # device's accesses and barriers, what the tools are for, are reported as before.
      for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 "$PY" -m kdkit.perf.gpu_selfcheck || rc=1
      done
      return $rc ;;
    *) pytest_part $(files "$1") ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  for p in $PARTS; do echo "$p: $(files "$p")"; done
  exit 0
fi
if [ -n "${JOBS:-}" ]; then
  [[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "JOBS=$JOBS: give a number of worker processes (e.g. JOBS=8), or unset it" >&2; exit 2; }
  "$PY" -c "import xdist" 2>/dev/null || { echo "JOBS=$JOBS needs pytest-xdist ($PY -m pip install pytest-xdist; every scripts/wheelhouse.sh set has it)" >&2; exit 2; }
fi
[ $# -gt 0 ] || { echo "usage: scripts/gpu_suite.sh PART... | all | --list (parts: $PARTS)" >&2; exit 2; }
want=()
for p in "$@"; do
  if [ "$p" = all ]; then want+=($PARTS)
  elif files "$p" > /dev/null; then want+=("$p")
  else echo "no part '$p'; the parts: $PARTS (or all)" >&2; exit 2
  fi
done
mkdir -p "$LOGS"
failed=0
for p in "${want[@]}"; do
  t0=$(date +%s)
  run_part "$p" > "$LOGS/$p.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || failed=$((failed + 1))
  echo "== $p: rc $rc, $(( $(date +%s) - t0 )) s ($LOGS/$p.txt)"
  tail -n 4 "$LOGS/$p.txt"
done
exit $failed
