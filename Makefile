# moebench — `make sweep` and `make test` install everything they need from scratch into .venv:
# `make sweep` then runs the main job (count-block; SWEEP=NAME ARGS="..." for another), `make test`
# the test suite plus the CPU smoke sweeps (Triton interpreter). Without a GPU it installs the CPU
# build of torch first, so the unpinned `torch` requirement never pulls a multi-GB CUDA build; on a
# GPU machine whose python3 has a CUDA torch and triton it reuses them (scripts/venv_mode.py).

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
SMOKE   ?= $(VENV)/smoke-results
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_CPU ?= torch==2.13.0
# The GPU image's triton: the kernel tests also run under its interpreter (moebench.tritonpatch)
TRITON_OLD ?= triton==3.6.0
OLD     ?= $(VENV)-triton-old
SWEEP   ?= count-block

.PHONY: install sweep test unit compat smoke smoke-runs smoke-start h200 h200-layer clean

# scripts/venv_mode.py decides (and says why): `system` on a GPU machine whose $(PY) already has a
# CUDA torch and triton at pyproject's minimums (a venv over them, also when $(PY) is itself a venv:
# no second CUDA torch), `cuda` on a GPU machine without them (pip installs torch), `cpu` without a
# GPU (the CPU torch, pinned in the same pip call). `make install` (and `make sweep`) installs what
# moebench needs to run; `make unit` / `make test` add the test tools, in the same single pip call
# when .venv is new. The pip flags of the mode are kept in $(VENV)/.pip-flags for a later install.
# INSTALL_COMPILE=--no-compile (what `make test` passes) leaves the byte-compiling of torch's and
# triton's ~1.7 GB to the first import of each module: the tests import a small part of it.
INSTALL_COMPILE ?=
define make_venv
set -e; set -- $$($(PY) scripts/venv_mode.py --gpu "$(HAS_GPU)"); \
[ -n "$$1" ] || { echo "make: scripts/venv_mode.py failed under $(PY)" >&2; exit 1; }; \
if [ "$$1" = system ]; then $(PY) scripts/venv_mode.py --make-venv $(VENV); else $(PY) -m venv $(VENV); fi; \
torch=; if [ "$$1" = cpu ]; then torch=$(TORCH_CPU); fi; \
echo "$$2" > $(VENV)/.pip-flags; \
$(BIN)/python -m pip install -q $(INSTALL_COMPILE) $$2 $$torch -e '.$(1)'
endef

$(BIN)/.installed: pyproject.toml scripts/venv_mode.py
	$(call make_venv,)
	touch $@

# over an up-to-date .venv the test tools alone; otherwise .venv made with them
$(BIN)/.test-installed: pyproject.toml scripts/venv_mode.py
	if [ $(BIN)/.installed -nt pyproject.toml ] && [ $(BIN)/.installed -nt scripts/venv_mode.py ]; then \
	  $(BIN)/python -m pip install -q $(INSTALL_COMPILE) $$(cat $(VENV)/.pip-flags) -e '.[test]'; \
	else $(call make_venv,[test]); touch $(BIN)/.installed; fi
	touch $@

install: $(BIN)/.installed

# the README's first command: results in out/<device>/$(SWEEP).{csv,json,md}
sweep: install
	$(BIN)/moebench sweep $(SWEEP) $(ARGS)

unit: $(BIN)/.test-installed
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto

# the older triton alone, with this machine's pip: it needs no .venv, so it installs beside it
$(OLD)/.installed:
	$(PY) -m pip install -q $(INSTALL_COMPILE) --no-deps --target $(OLD) $(TRITON_OLD)
	touch $@

# the kernels and the interpreter patches under triton 3.6, in one process (`make test` runs it beside
# the smoke runs): the kernel tests are short, and a second worker would only import everything again
COMPAT_TESTS := tests/families/test_count.py tests/families/test_act.py tests/families/test_combine.py \
                tests/core/test_interpret.py tests/test_tritonpatch.py
compat: $(BIN)/.test-installed $(OLD)/.installed
	PYTHONPATH=$(OLD) $(BIN)/python -m pytest -q -p no:cacheprovider $(COMPAT_TESTS)

# every family and every sweep's variants through the installed console command, each run a target
# of its own (a single-threaded interpreter run), so `-j2` packs them, and `make test`'s compat run,
# onto both cores as each ends (the unit suite also runs count-block, act-grid and `verify
# count-block` in process)
SMOKE_RUNS := sweep/count-block sweep/count-variants sweep/layer sweep/act-variants verify/act-grid sweep/combine-lds

smoke: install
	$(MAKE) --no-print-directory -j2 smoke-runs

smoke-runs: $(addprefix smoke/,$(SMOKE_RUNS))
	test -f $(SMOKE)/host/combine-lds-quick.json  # one layout for every family: OUT/<device>/NAME.*

smoke-start: install
	rm -rf $(SMOKE)
	$(BIN)/moebench validate sweeps/*.yaml

smoke/%: smoke-start
	$(BIN)/moebench $(subst /, ,$*) --quick --out $(SMOKE)

# The two installs side by side (pip unpacks on one core), then the unit suite on both cores, then
# the triton 3.6 tests and the smoke runs, two at a time. Imports write their .pyc files here, whatever
# PYTHONDONTWRITEBYTECODE says outside: each module is compiled once, not in every test process.
test: export PYTHONDONTWRITEBYTECODE :=
test:
	$(MAKE) --no-print-directory -j2 INSTALL_COMPILE=--no-compile $(BIN)/.test-installed $(OLD)/.installed
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory -j2 compat smoke-runs

# GPU only, a benchmark, not a test: every result under results/h200/ (TIMER.md included) from one
# device session; copy $(OUT)/A/h200/* into results/h200/ afterwards.
h200:
	bash scripts/h200.sh $(or $(OUT),h200-run)

# GPU only: the layer step (issue 17), ~3-4 minutes; copy $(OUT)/h200/layer* into results/h200/.
h200-layer:
	bash scripts/h200-layer.sh $(or $(OUT),h200-layer-run)

clean:
	rm -rf $(VENV) $(OLD) build *.egg-info .pytest_cache
