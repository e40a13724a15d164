# The two commands of the README's quick start. Both do all set-up first.
.PHONY: setup demo test test-fast lint

VENV := .venv/bin

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/tunelab run examples/qe-si.yaml --dir runs/demo
	$(VENV)/tunelab report runs/demo
	@echo "make demo: tunelab is $(VENV)/tunelab; '. $(VENV)/activate' puts it on your PATH" >&2

test: setup
	$(VENV)/python -m pytest -q

test-fast: setup
	$(VENV)/python -m pytest -q -m "not slow"

lint: setup
	$(VENV)/ruff check src tests benchmarks
	$(VENV)/mypy src/tunelab
	$(VENV)/lint-imports
