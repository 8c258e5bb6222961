# Every target creates/updates the virtual environment at .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.twinserve-installed
ENGINE ?= v1
PORT ?= 8000

.PHONY: install model test test-fast serve bench bench-offline bench-quality bench-step bench-structured bench-lmeval soak clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: 2.13.0 is the CPU build on this machine's disk (no CUDA download).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

model: install
	$(VENV)/bin/twinserve fetch-model

test: install model
	$(PY) -m pytest -q -ra

test-fast: install
	$(PY) -m pytest -q -m "not slow"

serve: install model
	$(VENV)/bin/twinserve serve --engine $(ENGINE) --port $(PORT)

bench-offline: install model
	$(PY) -m compare.bench_offline

# Constrained (json_schema) vs unconstrained decoding at 16 concurrent requests, plus compile times.
bench-structured: install model
	$(PY) -m compare.bench_structured

# lm-evaluation-harness's local-completions model against twinserve (float32) vs its hf backend
# on a local multiple-choice task; log-likelihoods must agree within 1e-2. Installs lm-eval.
bench-lmeval: install model
	$(PY) -m pip install -q 'lm-eval[api]==0.4.13' 'torch==2.13.0' 'transformers>=5.0,<5.25'
	$(PY) -m compare.bench_lmeval --json bench-lmeval.json

# 10 minutes of mixed load with dropped clients and bad requests per engine; then nothing left behind.
soak: install model
	$(PY) -m compare.soak

# Perplexity and greedy agreement of every --quantization mode on the default model (minutes).
bench-quality: install model
	$(PY) -m compare.quality --json bench-quality.json

# Where a batch-1 decode step's time goes: engine phases, decode.c's stages, lm_head (a minute).
bench-step: install model
	$(PY) -m compare.step_profile --batch 1 --json bench-step.json

# A short v0-vs-v1 comparison (a few minutes); `twinserve compare --help` for the long one.
bench: install model
	$(VENV)/bin/twinserve compare --out bench-results --repeats 1 --concurrency 1 16 64 \
		--rate-num-prompts 16

clean:
	rm -rf $(VENV) .pytest_cache
