#!/usr/bin/env bash
# Wheels for the capture plugin's GPU tests (tests/sglang_env, marked gpu) on an air-gapped GPU
# host (x86-64, CPython 3.12 by default) that already has torch, triton, cupy, numpy and pytest.
#
#   scripts/gpu_wheels.sh [OUT_DIR] [PYVER]        # OUT_DIR defaults to .whl-sglang, PYVER to 3.12
#
# It also writes OUT_DIR.tar.xz (GPU_WHEELS_ARCHIVE=0 skips it): carry that with the repository
# (OUT_DIR itself does not fit beside the repository in the 64 MiB carried). On the GPU host, from
# the repository root:
#   tar xJf .whl-sglang.tar.xz
#   python3 -m pip install -q --no-deps --no-index --find-links .whl-sglang -r .whl-sglang/requirements.txt
#   python3 -m pip install -q --no-deps --no-build-isolation -e .     # kdkit's sglang.srt.plugins entry point
#   KDKIT_SGLANG_ENV=1 python3 -m pytest tests/sglang_env -m gpu -q
#
# What it holds: SGLang itself (--no-deps, repacked without the parts the attention backend never
# imports: multimodal_gen/, test/, benchmark/, srt/models/, the Rust server extensions),
# transformers repacked with only the model folders SGLang's configs import, and the distributions of SGLang's
# import closure as read off a CPU run of tests/sglang_env (the versions that run there), each
# installed with --no-deps: the full dependency trees of transformers, IPython and
# huggingface_hub would not fit the 64 MiB carried to the GPU host. The GPU-only binaries
# (sgl_kernel, torchvision) are stood in for by tests/sglang_env/standins.py.
set -euo pipefail
out=${1:-.whl-sglang}
py=${2:-3.12}
sglang=${SGLANG_VERSION:-0.5.23}
pkgs="aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-types==0.8.0 anyio==4.16.0
apache-tvm-ffi==0.1.11 click==8.5.1 compressed-tensors==0.18.0 dill==0.4.1 distro==1.9.0 einops==0.8.2
frozenlist==1.8.0 gguf==0.19.0 h11==0.16.0 httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2
huggingface_hub==2.4.0 ipython==9.18.1 loguru==0.7.3 msgspec==0.23.0 multidict==7.2.1 openai==2.8.0
orjson==3.13.0 partial-json-parser==0.2.1.1.post7 pillow==13.0.0 propcache==0.5.4 pybase64==1.5.1
pydantic==2.14.4 pydantic_core==2.50.5 pyzmq==27.3.0 regex==2026.11.19 rich==15.0.0 safetensors==0.8.0
sentencepiece==0.2.1 sniffio==1.3.1 starlette==1.10.0 tokenizers==0.23.3 traitlets==5.16.1
transformers==5.19.0 truststore==0.10.5 typing-inspection==0.4.5 yarl==1.25.1
markdown-it-py mdurl ipython-pygments-lexers tabulate"
mkdir -p "$out"
plat=()
for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp "${plat[@]}" \
  -d "$out" $pkgs
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp "${plat[@]}" \
  -d "$tmp" "sglang==$sglang"
mv "$out"/transformers-*.whl "$tmp"/
python3 - "$tmp" "$out" <<'PY'
"""Repack two wheels without what the plugin tests never import (RECORD rewritten to match)."""
import glob, os, sys, zipfile

# transformers: the model folders SGLang's import closure reaches (its configs), read off the run
MODELS = {"auto", "deepseek_v3", "encoder_decoder", "falcon_mamba", "gemma", "gemma4", "glm_ocr", "gpt2",
          "gpt_oss", "lfm2", "lfm2_moe", "lfm2_vl", "llama", "mamba", "mamba2", "mellum", "qwen2",
          "qwen2_5_vl", "qwen3", "qwen3_5", "qwen3_moe", "siglip", "t5", "whisper"}
SGLANG_DROP = ("sglang/multimodal_gen/", "sglang/test/", "sglang/benchmark/", "sglang/srt/models/",
               "sglang/srt/rust_extensions/")


def sglang_keep(name):
    return not name.startswith(SGLANG_DROP) and not name.endswith(".so")  # .so: the Rust server parts


def transformers_keep(name):
    parts = name.split("/")
    return not (len(parts) > 3 and parts[:2] == ["transformers", "models"] and parts[2] not in MODELS)


def repack(src, dst, keep):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if not keep(info.filename):
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(ln + b"\n" for ln in data.split(b"\n")
                                if ln and keep(ln.decode().split(",")[0]))
            zout.writestr(info, data)


for pattern, keep in (("sglang-*.whl", sglang_keep), ("transformers-*.whl", transformers_keep)):
    src = glob.glob(os.path.join(sys.argv[1], pattern))[0]
    repack(src, os.path.join(sys.argv[2], os.path.basename(src)), keep)
PY
rm -rf "$tmp"
printf '%s\n' $pkgs "sglang==$sglang" > "$out/requirements.txt"
du -sh "$out" | sed 's/^/gpu wheels: /'
# The directory (~40 MiB) and the repository (~25 MiB) together exceed the 64 MiB that travels to
# the GPU host; the same wheels stored uncompressed and xz'ed as one archive are ~27 MB. Carry
# "$out.tar.xz" instead and unpack it there first: tar xJf .whl-sglang.tar.xz
if [ "${GPU_WHEELS_ARCHIVE:-1}" != 0 ]; then
  stage=$(mktemp -d)
  mkdir -p "$stage/$(basename "$out")"
  python3 - "$out" "$stage/$(basename "$out")" <<'PY'
"""Copy a wheel directory with every wheel re-zipped stored (xz then compresses the contents)."""
import glob, os, shutil, sys, zipfile
for w in glob.glob(os.path.join(sys.argv[1], "*")):
    dst = os.path.join(sys.argv[2], os.path.basename(w))
    if not w.endswith(".whl"):
        shutil.copy(w, dst)
        continue
    with zipfile.ZipFile(w) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename), compress_type=zipfile.ZIP_STORED)
PY
  tar -C "$stage" -cf - "$(basename "$out")" | xz -T0 -8 > "$out.tar.xz.part" && mv "$out.tar.xz.part" "$out.tar.xz"
  rm -rf "$stage"
  du -sh "$out.tar.xz" | sed 's/^/gpu wheels archive: /'
fi
