# Every target does its own set-up: a fresh machine needs only python3, pip and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Benchmarks and tests run with one BLAS/OpenMP thread for every library compared.
THREADS := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMEXPR_NUM_THREADS=1

.PHONY: demo test lint bench docs clean fuzz array-api

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# One stamp per extra, redone when pyproject.toml changes.
$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[$*]"
	touch $@

# PyTorch is an optional peer used by some tests and benchmarks. Only the
# local CPU build is accepted ("+cpu"); where it is not available the tests
# that compare with it say so, and nothing large is downloaded.
$(VENV)/.installed-torch: | $(BIN)/python
	-$(BIN)/python -m pip install -q "torch==2.13.0+cpu" || echo "note: PyTorch CPU build not available here"
	touch $@

# torchvision builds the architectures of bench/table_backends_models.py. The registry's wheel depends on a CUDA
# torch, so it is installed without dependencies next to the CPU torch (the benchmark stubs its
# `_meta_registrations` module, built for a newer torch); where it does not install, those rows say
# "torchvision not installed".
$(VENV)/.installed-torchvision: $(VENV)/.installed-torch | $(BIN)/python
	-$(BIN)/python -m pip install -q --no-deps "torchvision==0.29.1" pillow || echo "note: torchvision not available here; the architectures table leaves its models out"
	touch $@

# Graphviz's `dot` is a system package: installed where this user may (root with apt-get);
# elsewhere opgraph.draw says clearly that it is missing and the tests that render say why they skip.
$(VENV)/.installed-graphviz: | $(BIN)/python
	@command -v dot >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		apt-get update -qq >/dev/null && apt-get install -y -qq graphviz >/dev/null; } || \
		echo "note: Graphviz 'dot' is not installed; drawing to SVG/PNG is unavailable"
	touch $@

# A C compiler (`cc`) for backend="c" and opgraph codegen: a system package too, installed the same way;
# elsewhere the c engine says in one line that there is none and its tests say why they skip.
$(VENV)/.installed-cc: | $(BIN)/python
	@command -v cc >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		apt-get update -qq >/dev/null && apt-get install -y -qq gcc libc6-dev >/dev/null; } || \
		echo "note: no C compiler (cc); backend=\"c\" and opgraph codegen's compile checks are unavailable"
	touch $@

demo: $(VENV)/.installed-demo $(VENV)/.installed-graphviz
	$(THREADS) $(BIN)/python examples/demo.py

test: $(VENV)/.installed-test $(VENV)/.installed-torch $(VENV)/.installed-graphviz $(VENV)/.installed-cc
	$(BIN)/ruff check src tests bench examples tools
	$(BIN)/lint-imports
	$(BIN)/python tools/gen_ops_doc.py --check
	$(THREADS) $(BIN)/python -m pytest -n 2 -p no:cacheprovider

lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests bench examples tools

bench: $(VENV)/.installed-bench $(VENV)/.installed-torch $(VENV)/.installed-torchvision
	$(THREADS) $(BIN)/python bench/run.py

# Fuzzes the file loaders for longer than `make test` does: FUZZ_N mutated files per format (tools/fuzz.py;
# failing files go to fuzz-out/failures). atheris (the `fuzz` extra) adds coverage guidance where it installs;
# elsewhere the script says so and uses its own random mutator.
FUZZ_N ?= 100000
$(VENV)/.installed-fuzz: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[fuzz]" || echo "note: atheris does not install here; tools/fuzz.py uses its random mutator"
	touch $@

fuzz: $(VENV)/.installed-test $(VENV)/.installed-fuzz
	$(THREADS) $(BIN)/python tools/fuzz.py $(FUZZ_N) --out fuzz-out

# The Array API standard's own test suite against opgraph.numpy, from a clone of data-apis/array-api-tests (with
# its array-api submodule) kept outside this repository: make array-api ARRAY_API_TESTS=/path/to/array-api-tests
# (docs/array-api.md: the commit used and the counts). The xfails are NumPy's special cases, as array-api-strict's.
# A fresh Hypothesis database each run: examples saved by earlier runs would change what is drawn.
ARRAY_API_TESTS ?=
MAX_EXAMPLES ?= 100
array-api: $(VENV)/.installed-test
	@test -d "$(ARRAY_API_TESTS)/array_api_tests" || { \
		echo "set ARRAY_API_TESTS=/path/to/a/clone/of/data-apis/array-api-tests (with its array-api submodule)"; exit 2; }
	$(BIN)/python -m pip install -q ndindex
	cd "$(ARRAY_API_TESTS)" && $(THREADS) ARRAY_API_TESTS_MODULE=opgraph.numpy ARRAY_API_TESTS_VERSION=2025.12 \
		HYPOTHESIS_STORAGE_DIRECTORY="$$(mktemp -d)" \
		$(abspath $(BIN))/python -m pytest array_api_tests -p no:cacheprovider -n 2 -q \
		--max-examples $(MAX_EXAMPLES) --hypothesis-seed 0 --xfails-file $(abspath tools/array-api-xfails.txt)

docs: $(VENV)/.installed-test
	$(BIN)/python tools/gen_ops_doc.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis .ruff_cache .import_linter_cache
