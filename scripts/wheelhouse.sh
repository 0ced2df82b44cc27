#!/usr/bin/env bash
# Build a wheelhouse for an air-gapped GPU host (x86-64, CPython 3.12 by default) that already has
# torch, triton, cupy, numpy and pytest, so the project's notebooks and GPU tests can run there.
#
#   scripts/wheelhouse.sh [OUT_DIR] [PYVER] [SETS]   # OUT_DIR defaults to .whl, PYVER to 3.12,
#                                                    # SETS to notebooks,flashinfer
# The sets: notebooks (papermill, plotly, ipywidgets... ~28 MB) and flashinfer (FlashInfer
# $FLASHINFER_VERSION for the bench's flashinfer_mla row, repacked by scripts/flashinfer_wheel.py
# to ~8 MB, and apache-tvm-ffi ~3 MB). Every set adds pytest-xdist (0.1 MB), which
# scripts/gpu_suite.sh uses to spread a part over the host's cores. SGLang's Triton kernels
# (0.3 MB) come with either. The repository (~28 MB) travels beside the wheelhouse and the GPU
# host takes 64 MiB in all: for the bench and the GPU tests build `flashinfer` alone
# (`scripts/wheelhouse.sh .whl 3.12 flashinfer`).
#
# On the GPU host, from the project root:
#   python3 -m pip install -q --no-index --find-links .whl -r .whl/requirements.txt
#   export KDKIT_SGLANG_SRC=$PWD/.whl/sglang-src      # SGLang's Triton kernels, unpacked (no import of sglang itself)
#   export FLASHINFER_CUDA_ARCH_LIST=9.0              # (H200) FlashInfer's JIT builds for sm_90 alone (~20 s)
# Extra packages: WHEELHOUSE_EXTRA="name==ver other" scripts/wheelhouse.sh
set -euo pipefail
out=${1:-.whl}
py=${2:-3.12}
sets=",${3:-notebooks,flashinfer},"
sglang=${SGLANG_VERSION:-0.5.15.post1}
flashinfer=${FLASHINFER_VERSION:-0.7.2.post1}
tvm_ffi=${TVM_FFI_VERSION:-0.1.15.post2}   # FlashInfer asks for >=0.1.11,<0.2; the version measured with it
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
pkgs="pytest-xdist ${WHEELHOUSE_EXTRA:-}"
[[ $sets == *,notebooks,* ]] && pkgs="tabulate papermill nbclient nbformat ipykernel nbconvert plotly ipywidgets anywidget jupytext $pkgs"
# already on the host image: keep them out so that pip resolves against what is installed there
skip='^(torch|triton|numpy|cupy|nvidia-|cuda-|sympy|networkx|filelock|fsspec|jinja2|markupsafe|setuptools|typing.extensions|mpmath|pyyaml|packaging|psutil|pygments|attrs|requests|urllib3|idna|certifi|charset.normalizer|tqdm|pytest$|pluggy|iniconfig|narwhals|six|python.dateutil)'
plat=()
for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform any)
: > "$out/requirements.txt"
if [ -n "${pkgs// /}" ]; then
  printf '%s\n' $pkgs > "$out/requirements.txt"
  python3 -m pip download -q --only-binary=:all: --python-version "$py" --implementation cp "${plat[@]}" \
    -d "$out/all" $pkgs
  for w in "$out"/all/*.whl; do
    name=$(basename "$w" | cut -d- -f1 | tr '_' '-' | tr 'A-Z' 'a-z')
    if [[ $name =~ $skip ]]; then rm -f "$w"; else mv "$w" "$out/"; fi
  done
  rm -rf "$out/all"
fi
if [[ $sets == *,flashinfer,* ]]; then
  # FlashInfer's wheel, repacked (its header says what stays), and the one dependency the host lacks
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "flashinfer-python==$flashinfer"
  rm -f "$out"/flashinfer_python-*.whl
  python3 "$here/flashinfer_wheel.py" "$tmp"/flashinfer_python-*.whl "$out" >/dev/null
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp "${plat[@]}" \
    -d "$out" "apache-tvm-ffi==$tvm_ffi"
  printf '%s\n' "flashinfer-python==$flashinfer" "apache-tvm-ffi==$tvm_ffi" >> "$out/requirements.txt"
  rm -rf "$tmp"
fi
# SGLang's Triton attention kernels: unpacked from the release wheel, never imported as a package
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$tmp" "sglang==$sglang"
rm -rf "$out/sglang-src" && mkdir -p "$out/sglang-src"
python3 - "$tmp" "$out/sglang-src" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/sglang-*.whl")[0]
keep = ("sglang/srt/layers/attention/triton_ops/", "sglang/kernels/ops/attention/")
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(keep) and n.endswith(".py"):
            z.extract(n, sys.argv[2])
PY
rm -rf "$tmp"
du -sh "$out" | sed 's/^/wheelhouse: /'
