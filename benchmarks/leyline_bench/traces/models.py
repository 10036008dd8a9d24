"""The models a replay runs on, each with the arms that can serve it and the prompt ids those arms see.

* ``qwen2.5-coder-0.5b``: the real Qwen2.5-Coder-0.5B-Instruct (``leyline_bench.weights``): vLLM
  serves the bf16 folder converted from the GGUF, llama.cpp the GGUF itself (Q4_K_M, mostly Q5_0
  rows) — the same weights, llama.cpp's quantized, vLLM's dequantized (fp32 compute on a CPU without AMX).
* ``qwen3-1.7b-shape``: a random checkpoint of Qwen3-1.7B's layers (``vllm.tiny_models.SHAPES``, 12 of
  28 layers, the bundled runtime's tokenizer); llama.cpp gets the same weights as an F32 GGUF
  written by :mod:`.gguf` (llama.cpp's own converter refuses this tokenizer).
* ``tiny-qwen3``: the tiny random Qwen3 of :mod:`..vllm.tiny_models` (``--quick``: nothing is downloaded),
  its F32 GGUF for llama.cpp.
* ``runtime``: the bundled runtime's default MLA model and tokenizer (``trace_arms.RuntimeArm``).

A model's ``ids(history)`` is its prompt with the generation prompt, as its servers tokenize it:
the plugin's ``ChatRenderer`` over the checkpoint's chat template for the vLLM and llama.cpp
arms, the runtime's own template for the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from leyline_sdk.protocol import Message

from .arms import ARMS, LlamaCppArm, RuntimeArm, VllmArm, runtime_long_context_model
from ..common.llama_server import absent_reason

REAL_QWEN = "qwen2.5-coder-0.5b-instruct"
MODELS = ("qwen2.5-coder-0.5b", "qwen3-1.7b-shape", "tiny-qwen3", "runtime")
VLLM_MODES = {"vllm_plain": None, "leyline_amortize": "amortize", "leyline_auto": "auto"}


@dataclass
class Model:
    label: str
    description: str
    ids: Callable[[list[Message]], list[int]]
    arm_factory: Callable[[str, Path], object]
    arms: list[str]
    skipped: dict[str, str] = field(default_factory=dict)  # arm -> why it does not run on this model

    def arm(self, name: str, workdir: Path):
        return self.arm_factory(name, workdir)


def load_model(label: str, workdir: Path, cap: int, wanted: list[str]) -> Model:
    if label == "qwen2.5-coder-0.5b":
        return _real_qwen(workdir, cap, wanted)
    if label in ("qwen3-1.7b-shape", "tiny-qwen3"):
        return _random_qwen3(label, workdir, cap, wanted)
    if label == "runtime":
        return _runtime(workdir, cap, wanted)
    raise ValueError(f"unknown model {label!r}; known: {', '.join(MODELS)}")


def _renderer(folder: Path):
    from leyline_vllm.api_server.template import ChatRenderer
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(folder))


def _serving(renderer, checkpoint: Path, gguf: Callable[[], Path], *, kv_gib: int, max_len: int):
    # fp32 weights from a bf16 (real) or fp32 (random) folder, the KV cache, ~1.5 GiB of the rest
    weights = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) / 2**30
    fp32 = weights * (2 if (checkpoint / "leyline-weights.json").is_file() else 1)

    def make(name: str, workdir: Path):
        if name in VLLM_MODES:
            return VllmArm(name, checkpoint, workdir, renderer, mode=VLLM_MODES[name], kv_gib=kv_gib,
                           max_model_len=max_len, memory_gib=fp32 + kv_gib + 1.5)
        if name == "llama_cpp":
            return LlamaCppArm(gguf(), workdir, renderer, ctx=max_len)
        raise ValueError(f"arm {name} does not serve this model")
    return make


def _split_arms(wanted: list[str], served: tuple[str, ...], reasons: dict[str, str]) -> tuple[list[str], dict]:
    arms = [a for a in wanted if a in served and a not in reasons]
    skipped = {a: reasons.get(a, "serves another model") for a in wanted if a not in arms}
    return arms, skipped


def _llama_reason() -> dict[str, str]:
    reason = absent_reason()
    return {"llama_cpp": reason} if reason else {}


def _real_qwen(workdir: Path, cap: int, wanted: list[str]) -> Model:
    from .. import weights

    folder = weights.hf_folder(REAL_QWEN)
    renderer = _renderer(folder)
    max_len = 2 * cap + 1024
    arms, skipped = _split_arms(wanted, tuple(VLLM_MODES) + ("llama_cpp",), _llama_reason())
    return Model("qwen2.5-coder-0.5b", f"{REAL_QWEN} (real weights: vLLM the bf16 folder in fp32, llama.cpp the "
                 "Q4_K_M GGUF it was converted from)", lambda h: renderer.ids(h, generation_prompt=True),
                 _serving(renderer, folder, lambda: weights.gguf_path(REAL_QWEN), kv_gib=1, max_len=max_len),
                 arms, skipped)


def _random_qwen3(label: str, workdir: Path, cap: int, wanted: list[str]) -> Model:
    from .gguf import write_qwen3_gguf
    from leyline_testkit.tiny_models import SHAPES, make_tiny_checkpoint

    shape = "qwen3-1.7b" if label == "qwen3-1.7b-shape" else "tiny"
    max_len = 2 * cap + 1024
    checkpoint = make_tiny_checkpoint(workdir / f"checkpoint-{label}", "qwen3", shape=shape,
                                      max_positions=max(4096, 2 * max_len))
    renderer = _renderer(checkpoint)
    arms, skipped = _split_arms(wanted, tuple(VLLM_MODES) + ("llama_cpp",), _llama_reason())
    what = ("random weights, Qwen3-1.7B's layers (12 of 28), the bundled runtime's tokenizer" if shape != "tiny"
            else "tiny random Qwen3 (hidden 256, 2 layers), the bundled runtime's tokenizer")
    return Model(label, what + "; llama.cpp the same weights as an F32 GGUF (trace_gguf)",
                 lambda h: renderer.ids(h, generation_prompt=True),
                 _serving(renderer, checkpoint, lambda: write_qwen3_gguf(checkpoint),
                          kv_gib=SHAPES[shape].kv_cache_gib if shape != "tiny" else 1, max_len=max_len),
                 arms, skipped)


def _runtime(workdir: Path, cap: int, wanted: list[str]) -> Model:
    from leyline_runtime.text.tokenizer import ChatTokenizer

    from leyline_testkit.tiny_models import runtime_tokenizer_file

    tok = ChatTokenizer.from_file(runtime_tokenizer_file())
    header = tok.role_ids["assistant"]  # the generation prompt: the assistant's role token

    def ids(history: list[Message]) -> list[int]:
        return [t for m in tok.encode_messages(history) for t in m] + [header]

    folder = runtime_long_context_model(workdir / "runtime-model", 8 * cap)
    arms, skipped = _split_arms(wanted, ("runtime",), {})
    return Model("runtime", "the bundled runtime's default model (MLA, 6 layers, its own 8192-token vocabulary), "
                 f"max_position_embeddings raised from 4096 to {8 * cap} for these histories",
                 ids, lambda name, wd: RuntimeArm(folder), arms, skipped)


def check_arms(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    return names
