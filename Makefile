PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo lint clean floors

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install lint
	$(BIN)/python -m pytest -n 2 --doctest-modules panamera tests

demo: install
	$(BIN)/panamera demo

# Every dependency at the lowest version pyproject.toml allows, on the oldest Python it allows, in
# build/floors-venv: a smoke subset from outside the clone and two test files (about 1.5 min; .ci/run).
floors:
	$(PY) scripts/check_floors.py

clean:
	rm -rf $(VENV) build *.egg-info

# Rerun the paper's experiments (modeled for an H100; timed too where CuPy sees a GPU) and refresh
# the committed bench/results/: results.json, summary.md and the PNG charts that bench/README.md shows.
.PHONY: bench schedules
bench: install
	$(BIN)/panamera bench --suite all --gpu h100 --out bench/results --plot

# Refill the schedule database panamera/schedules/ (package data: one JSON per workload and GPU) that
# pn.compile consults.
schedules: install
	rm -rf panamera/schedules
	$(BIN)/panamera schedules --out panamera/schedules --gpu h100 --gpu a100

# On a machine with an NVIDIA GPU, in one command: tests/test_cuda.py, compute-sanitizer on every
# kernel template, the measured bench and the ONNX examples, into bench/gpu-check-<date>-<device>/.
# Needs no package registry when wheels/ is there (scripts/fetch_wheels.sh); README "On a GPU".
.PHONY: gpu-check
gpu-check:
	$(PY) scripts/gpu_check.py
