#!/usr/bin/env bash
# Build a wheelhouse for an air-gapped GPU host (x86-64, CPython 3.12 by default) that already has
# torch, triton, cupy, numpy and pytest, so the project's notebooks and GPU tests can run there.
#
#   scripts/wheelhouse.sh [OUT_DIR] [PYVER]        # OUT_DIR defaults to .whl, PYVER to 3.12
#
# On the GPU host, from the project root:
#   python3 -m pip install -q --no-index --find-links .whl -r .whl/requirements.txt
#   export KDKIT_SGLANG_SRC=$PWD/.whl/sglang-src      # SGLang's Triton kernels, unpacked (no import of sglang itself)
# Extra packages: WHEELHOUSE_EXTRA="name==ver other" scripts/wheelhouse.sh
set -euo pipefail
out=${1:-.whl}
py=${2:-3.12}
sglang=${SGLANG_VERSION:-0.5.15.post1}
mkdir -p "$out"
pkgs="tabulate papermill nbclient nbformat ipykernel nbconvert plotly ipywidgets anywidget jupytext ${WHEELHOUSE_EXTRA:-}"
# already on the host image: keep them out so that pip resolves against what is installed there
skip='^(torch|triton|numpy|cupy|nvidia-|cuda-|sympy|networkx|filelock|fsspec|jinja2|markupsafe|setuptools|typing.extensions|mpmath|pyyaml|packaging|psutil|pygments|attrs|requests|urllib3|idna|certifi|charset.normalizer|tqdm|pytest|pluggy|iniconfig|narwhals|six|python.dateutil)'
plat=()
for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform any)
printf '%s\n' $pkgs > "$out/requirements.txt"
python3 -m pip download -q --only-binary=:all: --python-version "$py" --implementation cp "${plat[@]}" \
  -d "$out/all" $pkgs
for w in "$out"/all/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | tr '_' '-' | tr 'A-Z' 'a-z')
  if [[ $name =~ $skip ]]; then rm -f "$w"; else mv "$w" "$out/"; fi
done
rm -rf "$out/all"
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
