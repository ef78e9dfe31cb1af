# Two commands matter: `make demo` and `make test`. Both (re)use the project-local .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
FAIRSEQ_PKG ?= fairseq-fixed==0.12.3.1
STAMP := $(VENV)/.installed

.PHONY: install install-offline wheelhouse demo test smoke bench gpu-check clean-venv

install: $(STAMP)

# Order matters: torch first (an unpinned torch pulls a multi-GB CUDA build), then our runtime
# dependencies (requirements.txt, which pyproject.toml declares; fairseq's are among them and the
# fork's build needs cython and numpy), then the fairseq fork without its dependencies (it pins
# torchaudio), then us (editable) with the extras `test` and `analysis`.
$(STAMP): pyproject.toml requirements.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -c "import fairseq" 2>/dev/null || $(PY) -m pip install --no-deps --no-build-isolation $(FAIRSEQ_PKG)
	$(PY) -m pip install -q --no-build-isolation -e ".[test,analysis]"
	$(PY) -c "import torch, fairseq, man_fairseq; print('torch', torch.__version__, 'fairseq', fairseq.__version__)"
	@perl -MXML::Parser -MDB_File -e 1 2>/dev/null || echo "note: ROUGE-1.5.5 (CNN/DM and Gigaword scores) needs Perl's XML::Parser: apt-get install libxml-parser-perl"
	touch $(STAMP)

# Offline install, for a GPU node with its own torch and no package registry (docs/install.md,
# "Offline install"). `make wheelhouse` (where pip reaches PyPI) puts into
# WHEELHOUSE every requirement beside torch as wheels for WHEELHOUSE_PYTHON (and within the caps of
# torch WHEELHOUSE_TORCH, the node's), the fairseq fork's
# sdist (built on the node, against the node's torch) and this checkout's source;
# `make install-offline` on the node installs from it alone (pip --no-index) into a venv that sees
# the node's torch (--system-site-packages, or VENV= an environment that has it).
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_PYTHON ?= 3.12
WHEELHOUSE_GLIBC ?= 2.28
WHEELHOUSE_TORCH ?= 2.11.0
wheelhouse: install
	$(PY) scripts/wheelhouse.py build --dest $(WHEELHOUSE) --python-version $(WHEELHOUSE_PYTHON) \
		--glibc $(WHEELHOUSE_GLIBC) --torch $(WHEELHOUSE_TORCH) --fairseq $(FAIRSEQ_PKG)

install-offline:
	$(PYTHON) scripts/wheelhouse.py install --wheelhouse $(WHEELHOUSE) --venv $(VENV) --python $(PYTHON) \
		--fairseq $(FAIRSEQ_PKG)
	@perl -MXML::Parser -MDB_File -e 1 2>/dev/null || echo "note: ROUGE-1.5.5 (CNN/DM and Gigaword scores) needs Perl's XML::Parser: apt-get install libxml-parser-perl"
	touch $(STAMP)

demo: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) scripts/demo.py $(DEMO_ARGS)

# -rs prints every skip reason; no bytecode and no .pytest_cache in the tree (tests write only
# under their tmp_path).
# One pytest worker per core (pytest-xdist; a test file stays on one worker, so its fixtures are
# built once), one thread each. TEST_WORKERS=0 runs everything in one process. Files are handed
# out in collection order, where conftest.py puts the slowest first (--no-loadscope-reorder: xdist
# would otherwise order them by number of tests).
TEST_WORKERS ?= 2
test: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -p no:cacheprovider \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests $(PYTEST_ARGS)

# The recipes end to end on CPU: small de-en data-bin, a few updates of a config, evaluate.sh,
# results_table.py (man_recipes/checks/smoke.py; writes under runs/smoke/).
smoke: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m man_recipes.checks.smoke $(SMOKE_ARGS)

# Random sentences at the papers' base width, each family's paper config against the Transformer's
# (scripts/speed.sh synthetic): a short run, 20 updates of 1,024 tokens a family; more for decisions.
BENCH_ARGS ?= --threads 2 --repeats 1 --updates 20 --log-interval 5 --decode-sentences 16 -- --update-freq 1 --max-tokens 1024
bench: install
	PYTHON=$(CURDIR)/$(PY) scripts/speed.sh synthetic $(BENCH_ARGS)

# On a machine with a GPU: tests/gpu, a short benchmark and (with data-bin/multi30k.de-en) a few
# hundred --bf16 updates per family; one Markdown report to attach to a bug report.
gpu-check: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m lab.gpu_check $(GPU_CHECK_ARGS)

clean-venv:
	rm -rf $(VENV)
