# kdkit: `make demo` and `make test` set up $(VENV) on first use, then run.
#   make test VENV=      use the host's python3 as it is (no set-up): GPU hosts without internet
VENV ?= .venv
# SGLang's release whose Triton kernel source the triton_sglang backend loads (installed --no-deps:
# kdkit reads the kernel files, it never imports the SGLang server). SGLANG= skips it.
SGLANG ?= sglang==0.5.15.post1
SGLANG_LAYOUTS ?= 0.5.10 0.5.15.post1 0.5.16 0.5.23
PYTEST_ARGS ?=

ifeq ($(strip $(VENV)),)
PY := python3
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
STAMP :=
else
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kdkit-installed
endif
KDKIT := $(if $(STAMP),$(VENV)/bin/kdkit,$(PY) -m kdkit.cli)

.PHONY: demo test bundled clean

demo: $(STAMP)
	mkdir -p reports
	$(KDKIT) replay data/captured_tensors/seed-shape.pt --backends all --report reports/demo.html

test: $(STAMP)
	$(PY) -m pytest tests -q --durations=15 $(PYTEST_ARGS)

# rebuilds data/captured_tensors; refuses to overwrite unless FORCE=1
bundled: $(STAMP)
	$(PY) -m kdkit.bundled $(if $(FORCE),--force)

# Set-up, re-run when pyproject.toml changes. torch first: `torch==2.13.0` takes the CPU build kept
# on local disk, so the extras below resolve against it instead of pulling a CUDA build.
ifneq ($(STAMP),)
$(STAMP): pyproject.toml Makefile
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	if [ -n "$(SGLANG)" ]; then $(PY) -m pip install -q --no-deps '$(SGLANG)'; fi
	# wheels of other releases, only read by the loader tests (both module layouts: <=0.5.15, >=0.5.16)
	for v in $(SGLANG_LAYOUTS); do $(PY) -m pip download -q --no-deps -d .cache/wheels "sglang==$$v" || true; done
	if nvidia-smi -L >/dev/null 2>&1; then $(PY) -m pip install -q -e '.[dev,gpu]'; fi
	touch $@
endif

clean:
	rm -rf build *.egg-info .pytest_cache
	find kdkit tests -name __pycache__ -type d -prune -exec rm -rf {} +
