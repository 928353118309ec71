# Two entry points for a fresh machine:
#   make run    set up .venv and run the main job (treefold demo; treefold bench as well on a GPU)
#   make test   set up .venv and run the tests (kernels through the Triton interpreter on CPU)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# A machine without an NVIDIA driver gets the CPU build of torch (2.13.0 is on local disk);
# a GPU machine gets whatever torch the index offers for it.
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_SPEC := $(if $(HAVE_GPU),torch>=2.6,torch==2.13.0)
# The CPU tests run the kernels through Triton's interpreter, whose behaviour changes between
# releases (3.9's rejects masks the compiler accepts): on a CPU machine pin the release the kernels
# are measured with on the GPU. A GPU machine takes the Triton its torch build asks for.
TRITON_SPEC := $(if $(HAVE_GPU),,triton==3.6.0)

.PHONY: setup run test test-torch-2.11 clean

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" $(TRITON_SPEC)
	$(PY) -m pip install -q -e ".[test,bench]"
	touch $@

setup: $(VENV)/.ready

run: setup
	$(PY) -m treefold demo
	@if [ -n "$(HAVE_GPU)" ]; then $(PY) -m treefold bench --out out/bench --budget 540; fi

test: setup
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n 2 tests

# The GPU machines the kernels are measured on run torch 2.11, whose Dynamo and nn modules differ
# from 2.13's in ways the tests see (a constant's __class__ under torch.compile, LayerNorm's repr):
# the same tests with torch 2.11.0 (PyPI's build, which runs on the CPU) in a venv of its own.
VENV_2_11 := .venv-torch-2.11
PY_2_11   := $(VENV_2_11)/bin/python

$(VENV_2_11)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV_2_11)
	$(PY_2_11) -m pip install -q --upgrade pip
	$(PY_2_11) -m pip install -q torch==2.11.0 triton==3.6.0
	$(PY_2_11) -m pip install -q -e ".[test]"
	touch $@

test-torch-2.11: $(VENV_2_11)/.ready
	TRITON_INTERPRET=1 $(PY_2_11) -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV) $(VENV_2_11) out
