# Two commands do everything on a fresh machine:
#   make demo   - set up, then run the demo on the shipped toy zoo
#   make test   - set up, then ruff, mypy and the default test suite
#
# Torch is installed only when the venv has none.  The default is the CPU wheel
# that this machine carries; GPU users override it, e.g.
#   make test TORCH_SPEC="torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124"
# or point VENV at an environment that already has a CUDA torch.
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= dev,train,ray,accelerate,lmeval
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.ga-installed
PYTEST_ARGS ?=
# The default suite runs its test files on up to 4 worker processes (pytest-xdist; one file stays on one worker,
# so a module's fixtures are built once).  Each test runs one torch thread, so a worker per core is the speed-up.
PARALLEL   ?= -n auto --maxprocesses 4 --dist loadfile

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-all bench lint clean mypy-src

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null && echo "torch already present: $$($(PY) -c 'import torch; print(torch.__version__)')" \
	  || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# mypy cannot read setuptools' package-dir mapping (adapters/ installs as gather_aggregate.adapters) nor the
# editable install's import hook, so without this its `gather_aggregate.adapters.*` imports are silently Any.
# build/mypy-src is the installed layout as links (pyproject's mypy_path reads it): the package's entries, and
# adapters/ at gather_aggregate/adapters.
mypy-src:
	@rm -rf build/mypy-src && mkdir -p build/mypy-src/gather_aggregate
	@ln -s $(CURDIR)/gather_aggregate/* build/mypy-src/gather_aggregate/
	@ln -s $(CURDIR)/adapters build/mypy-src/gather_aggregate/adapters

demo: setup
	$(VENV)/bin/gather-aggregate demo --out ga_out/demo

# Lint and type-check first: a broken contract (HookedModel, Task) fails here, not in a user's notebook.
# Only the tests need a browser: the first line installs Debian's chromium for the HTML-report browser test
# (the demo never needs one) and says so when it does.
test: setup
	@bash scripts/ensure_system_deps.sh
	@$(MAKE) --no-print-directory mypy-src
	$(PY) -m ruff check gather_aggregate adapters tests benchmarks
	$(PY) -m mypy
	$(PY) -m pytest -q $(PARALLEL) $(PYTEST_ARGS)

# Everything, slow tests and notebooks included (not in CI's time budget).
test-all: setup
	@bash scripts/ensure_system_deps.sh
	$(PY) -m pytest -q -m "" $(PARALLEL) $(PYTEST_ARGS)

bench: setup
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

lint: setup
	@$(MAKE) --no-print-directory mypy-src
	$(PY) -m ruff check gather_aggregate adapters tests benchmarks
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build dist *.egg-info ga_out
