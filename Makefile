# kdkit: `make demo` and `make test` set up $(VENV) on first use, then run.
#   make test VENV=      use the host's python3 as it is (no set-up): GPU hosts without internet
VENV ?= .venv
# SGLang's release whose Triton kernel source the triton_sglang backend loads (installed --no-deps:
# kdkit reads the kernel files, it never imports the SGLang server). SGLANG= skips it.
SGLANG ?= sglang==0.5.15.post1
SGLANG_LAYOUTS ?= 0.5.10 0.5.11 0.5.15.post1 0.5.16 0.5.23
PYTEST_ARGS ?=
# Second environment for the capture plugin's tests on SGLang's real code path (tests/sglang_env):
# the newest supported SGLang --no-deps, the pure-Python packages its attention backend imports,
# kdkit (its entry point; torch is already the CPU build); tests/sglang_env/standins.py stands in for torchvision and sgl_kernel.
# SGLANG_ENV= skips it (the default with VENV=: GPU hosts without internet).
SGLANG_NEWEST ?= 0.5.23
SGLANG_ENV ?= $(if $(strip $(VENV)),.venv-sglang,)
# Debian's chromium for the browser test (the `chromium` target below); none with VENV=
CHROMIUM ?= $(if $(strip $(VENV)),chromium,)
SGLANG_ENV_PKGS = triton numpy tabulate pytest orjson psutil pybase64 requests pillow starlette tqdm IPython \
	aiohttp dill einops gguf huggingface_hub msgspec openai==2.8.0 partial_json_parser pydantic regex \
	safetensors sentencepiece==0.2.1 pyzmq transformers==5.19.0 compressed-tensors==0.18.0 loguru \
	apache-tvm-ffi==0.1.11

ifeq ($(strip $(VENV)),)
PY := python3
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
DEMO_STAMP :=
TEST_STAMP :=
else
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.kdkit-demo
TEST_STAMP := $(VENV)/.kdkit-test
endif
KDKIT := $(if $(DEMO_STAMP),$(VENV)/bin/kdkit,$(PY) -m kdkit.cli)
say = @echo "kdkit: $(1)"
# Set-up refuses to start without the disk it needs (measured: .venv 2.8 GB, .venv-sglang 2.5 GB,
# plus pip's unpacking room), rather than die halfway in pip with ENOSPC. NEED_DISK= skips the check.
NEED_DISK ?= yes
VENV_GB ?= 4
SGLANG_ENV_GB ?= 3
need_disk = @if [ -n "$(NEED_DISK)" ]; then avail=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	if [ "$$avail" -lt $$(( $(1) * 1024 * 1024 )) ]; then \
	  echo "kdkit: $(2) needs about $(1) GB free here; df shows $$(( avail / 1024 )) MB. Free some (pip cache purge; rm -rf ~/.cache/kdkit/jit; old clones), or NEED_DISK= to try anyway" >&2; exit 1; fi; fi
comma := ,
SG_STAMP := $(if $(strip $(SGLANG_ENV)),$(SGLANG_ENV)/.kdkit-installed,)

.PHONY: demo test bundled lab clean

# one report, replaced on each run; backends that cannot run here are skipped with their reason
demo: $(DEMO_STAMP)
	$(KDKIT) replay data/captured_tensors/seed-shape.pt --backends all --allow-skip --report reports/demo.html --force

test: $(TEST_STAMP) $(SG_STAMP) $(if $(strip $(CHROMIUM)),chromium,)
	$(PY) -m pytest tests -q --durations=15 $(PYTEST_ARGS)
	if [ -n "$(SG_STAMP)" ]; then KDKIT_SGLANG_ENV=1 $(SGLANG_ENV)/bin/python -m pytest tests/sglang_env -q --durations=5 $(PYTEST_ARGS); fi

# tests/test_notebook_browser.py drives Debian's chromium (Playwright from the dev extra, no browser
# download). As root (CI) it is installed when missing; elsewhere, or when apt cannot, the test
# skips and says why. CHROMIUM= (the default with VENV=) skips this step.
.PHONY: chromium
chromium:
	@if [ -n "$(CHROMIUM)" ] && ! command -v $(CHROMIUM) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "kdkit: installing Debian's chromium for the browser test (apt-get, a minute or two)"; \
	    mkdir -p .cache; (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(CHROMIUM)) \
	      >.cache/apt-chromium.log 2>&1 || echo "kdkit: chromium could not be installed (.cache/apt-chromium.log): the browser test will skip"; \
	  else echo "kdkit: no chromium and not root: the browser test will skip (apt-get install chromium)"; fi; fi

# rebuilds data/captured_tensors; refuses to overwrite unless FORCE=1 (kdkit.bundled's own
# message names --force, its command-line form: the make form is said after it)
bundled: $(DEMO_STAMP)
	@$(PY) -m kdkit.bundled $(if $(FORCE),--force) || { echo "kdkit: to rebuild them here: make bundled FORCE=1" >&2; exit 1; }

# the notebooks: the lab extra installed once, quietly (as the set-up below: SGLang's and torch's
# pins would print a page of conflicts), then JupyterLab on the repository (notebooks/ open in it).
# LAB_ARGS adds JupyterLab options, e.g. LAB_ARGS='--no-browser --ip=0.0.0.0 --port=8888'
LAB_ARGS ?=
LAB_STAMP := $(if $(DEMO_STAMP),$(VENV)/.kdkit-lab,)
lab: $(LAB_STAMP)
	$(call say,JupyterLab on $(CURDIR): open notebooks/replay.ipynb (Ctrl-C twice stops it))
	$(PY) -m jupyterlab --ServerApp.root_dir="$(CURDIR)" $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Set-up, redone when pyproject.toml or this file changes. torch first: `torch==2.13.0` takes the
# CPU build kept on local disk, so the extras below resolve against it instead of pulling a CUDA
# build. The demo gets what it runs (reports, Triton, SGLang's kernel source); the tests add the
# dev extra and the wheels that only the loader tests read. SGLang is installed without its
# dependencies (kdkit reads its kernel files only), so later installs pass --no-warn-conflicts
# rather than list the server's missing dependencies.
ifneq ($(DEMO_STAMP),)
$(DEMO_STAMP): pyproject.toml Makefile
	$(call need_disk,$(VENV_GB),creating $(VENV))
	$(call say,[1/4] creating $(VENV))
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(call say,[2/4] installing torch 2.13.0)
	$(PY) -m pip install -q torch==2.13.0
	$(call say,[3/4] installing kdkit with its reports and triton extras (a minute or two on a cold cache))
	$(PY) -m pip install -q -e '.[reports,triton]'
	$(call say,[4/4] installing SGLang's kernel source ($(or $(SGLANG),skipped: SGLANG=)) and$(comma) with a GPU$(comma) the gpu extra)
	if [ -n "$(SGLANG)" ]; then $(PY) -m pip install -q --no-deps '$(SGLANG)'; fi
	if nvidia-smi -L >/dev/null 2>&1; then $(PY) -m pip install -q --no-warn-conflicts -e '.[reports,triton,gpu]'; fi
	touch $@

# SGLANG_LAYOUTS covers both module layouts (<=0.5.15, >=0.5.16); a release that cannot be
# fetched skips its loader tests
$(TEST_STAMP): $(DEMO_STAMP)
	$(call say,[1/2] installing the dev extra (pytest$(comma) JupyterLab$(comma) papermill$(comma) NVRTC))
	$(PY) -m pip install -q --no-warn-conflicts -e '.[dev]'
# FlashInfer-Bench's schema classes for the FlashInfer Trace tests: --no-deps, because its wheel
# lists flashinfer-python and apache-tvm-ffi, which flashinfer_bench.data never imports (the dev
# extra brings what it does import: pydantic, safetensors, docstring-parser)
	$(PY) -m pip install -q --no-warn-conflicts --no-deps flashinfer-bench==0.1.2
	$(call say,[2/2] downloading SGLang $(SGLANG_LAYOUTS) wheels for the loader tests into .cache/wheels)
	for v in $(SGLANG_LAYOUTS); do $(PY) -m pip download -q --no-deps -d .cache/wheels "sglang==$$v" || true; done
	touch $@
endif

ifneq ($(LAB_STAMP),)
$(LAB_STAMP): $(DEMO_STAMP)
	$(call say,installing the lab extra (JupyterLab$(comma) widgets$(comma) papermill) quietly)
	$(PY) -m pip install -q --no-warn-conflicts -e '.[lab]'
	touch $@
endif

ifneq ($(SG_STAMP),)
$(SG_STAMP): pyproject.toml Makefile $(TEST_STAMP)
	$(call need_disk,$(SGLANG_ENV_GB),creating $(SGLANG_ENV))
	$(call say,[1/3] creating $(SGLANG_ENV) (SGLang $(SGLANG_NEWEST) for the capture plugin's tests) with torch 2.13.0)
	test -x $(SGLANG_ENV)/bin/python || python3 -m venv $(SGLANG_ENV)
	$(SGLANG_ENV)/bin/python -m pip install -q torch==2.13.0
	$(call say,[2/3] installing the pure-Python packages SGLang's attention backend imports (a few minutes on a cold cache))
	$(SGLANG_ENV)/bin/python -m pip install -q $(SGLANG_ENV_PKGS)
	$(call say,[3/3] installing SGLang $(SGLANG_NEWEST) without its dependencies, and kdkit)
	$(SGLANG_ENV)/bin/python -m pip install -q --no-deps --find-links .cache/wheels 'sglang==$(SGLANG_NEWEST)'
	$(SGLANG_ENV)/bin/python -m pip install -q -e .
	touch $@
endif

clean:
	rm -rf build *.egg-info .pytest_cache
	find kdkit tests -name __pycache__ -type d -prune -exec rm -rf {} +
