# reslm: two commands on a fresh machine.
#   make demo   venv + install + Shakespeare corpus + three families at a small budget + table + samples
#   make test   venv + install + the test suite (what CI runs)
# torch==2.13.0 is installed first, on its own: on a CPU-only machine that is the local CPU build, so
# the project's `torch>=2.1` requirement is already met and pip never pulls CUDA wheels.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# the fast suite runs in 2 pytest-xdist worker processes, one test file per worker at a time (module
# fixtures are built once; the DDP tests, which start their own processes, stay in one worker)
TEST_WORKERS ?= 2

.PHONY: setup setup-reservoirpy demo test test-slow bench clean

$(BIN)/reslm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,bpe,plot,hf,lab]'
	@touch $@

setup: $(BIN)/reslm

# the optional reservoirpy adapter and its tests (skipped without it): scipy is large, so not in setup
setup-reservoirpy: setup
	$(BIN)/python -m pip install --quiet -e '.[reservoirpy]'

demo: setup
	$(BIN)/reslm demo

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

bench: setup
	$(BIN)/reslm bench

clean:
	rm -rf $(VENV) *.egg-info
