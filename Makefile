# The two set-up commands of the README. Both create .venv and install what they need.
#   make demo   plan the demo model on the demo cluster and show the result
#   make test   lint, type-check and run the whole test suite (what CI runs)
VENV := .venv
STAMP := $(VENV)/.installed-stamp

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# the CPU build of torch: see docs/decisions.md (an open range pulls a CUDA build)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[executor,dev]'
	touch $(STAMP)

.PHONY: demo test typecheck
demo: $(STAMP)
	$(VENV)/bin/edgepipe demo --out out/demo

# mypy reads the packages under their installed names through links (pyproject.toml, [tool.mypy])
typecheck: $(STAMP)
	mkdir -p build/typecheck/edgepipe
	ln -sfn ../../../planner build/typecheck/edgepipe/planner
	ln -sfn ../../../executor build/typecheck/edgepipe/executor
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml \
		-p edgepipe.planner -p edgepipe.executor

test: $(STAMP) typecheck
	$(VENV)/bin/ruff check planner executor tests benchmarks
	# two pytest calls, both always run: every test but the `serial` ones on three workers
	# (the tests mostly wait: two kept ~1.5 of 2 cores busy), handed out one at a time so
	# that no worker ends with a queue of long tests; then the `serial` ones alone, from
	# the test files that say mark.serial (tests/conftest.py checks that every serial test's
	# does); the status is non-zero if either failed (docs/testing.md; docs/decisions.md)
	status=0; \
	$(VENV)/bin/python -m pytest -q -n 3 --maxschedchunk 1 -m "not serial" --durations=15 \
		|| status=$$?; \
	$(VENV)/bin/python -m pytest -q -m serial --durations=10 $$(grep -rl --include='test_*.py' 'mark\.serial' tests | sort) \
		|| status=$$?; \
	exit $$status
