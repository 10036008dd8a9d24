"""``leyline-bench drift-real``: amortize, repair, auto and forget on real weights and real agent edits.

A sibling of ``drift`` rather than a flag of it: ``drift`` replays long synthetic edit chains rendered
with the default model's tokenizer and scores the next turn only; this one takes single edits from real
sessions (:mod:`.real_edits`, the held-out split), renders them with each model's own chat template, adds
repair windows, greedy continuations and the removed-content questions (:mod:`.removed_content`), and
runs in the weights' own dtype. The two share the oracle (:mod:`.drift_oracle`: the model's transformers
implementation, its per-layer cache spliced as the connectors splice it).

Models: ``label=weights:NAME`` (a checkpoint of :mod:`..weights`, e.g.
``qwen0.5b=weights:qwen2.5-coder-0.5b-instruct``), ``label=FOLDER`` (a Hugging Face folder with its
tokenizer and chat template) or ``label=random-qwen2`` (a tiny seeded random Qwen2 with the default
model's tokenizer and a ChatML-like template: for smoke tests, nothing downloaded). ``--fp32-floor N``
plays the first N edits again in float32 with ``forget`` only: forget's distance from the reference
there is float32's noise floor, beside the run dtype's. ``--llama-cpp N`` runs the first N edits on
llama.cpp's cache reuse serving the checkpoint's GGUF (:mod:`.llama_peer`), the peer a user would pick;
``--vllm N`` runs the first N edits inside ``vllm serve`` with the plugin (:mod:`.vllm_peer`), scored
against vLLM's own prefill (``--vllm-repair W,..``: repair windows there too, one server each);
``--no-oracle`` leaves the transformers arms out (a peers-only run).
``--journal FILE`` writes every finished edit down (:mod:`.journal`), so a run cut short resumes.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from leyline_runtime.auto_rule import AutoConfig
from ..common.llama_server import LlamaServer, absent_reason
from .drift_oracle import rope_slot
from .journal import Journal, each_edit
from .llama_peer import peer_record, summarise as peer_summary
from . import vllm_peer
from ..common.output import write_results
from leyline_testkit.vllm_server import real_weights_dtype
from .real_case import history_rows, run_edit
from .real_edits import Renderer, add_edit_selection, select_edits
from .real_modes import mode_names
from .removed_content import question_for
from .real_report import markdown, plot, summarise
from ..sessions.load import load_sessions
from ..common.stats import mean

NAME = "drift_real"
# The quick model's template: one token per role, tool calls as JSON between the default tokenizer's markers.
QUICK_TEMPLATE = ("{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}{%- if m.tool_calls %}{%- for c in "
                  "m.tool_calls %}<|tool_call|>{{ c.function | tojson }}<|end_tool_call|>{%- endfor %}{%- endif %}"
                  "<|end|>{%- endfor %}{%- if add_generation_prompt %}<|assistant|>{%- endif %}")


def add_parser(sub) -> None:
    p = sub.add_parser("drift-real")
    add_edit_selection(p)
    p.add_argument("--repair-windows", default="16,32,64,128", help="repair's W values")
    p.add_argument("--greedy-tokens", type=int, default=32, help="greedy tokens compared after the next turn")
    p.add_argument("--answer-tokens", type=int, default=32, help="greedy tokens of a question's reply")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="the run's dtype")
    p.add_argument("--fp32-floor", type=int, default=0, help="edits played again in float32, forget only")
    p.add_argument("--drift-budget", type=float, default=None, help="auto's drift budget (default: the runtime's)")
    p.add_argument("--llama-cpp", type=int, default=0, metavar="N",
                   help="the first N edits also on llama.cpp's llama-server --cache-reuse serving the checkpoint's "
                        "GGUF (weights:NAME models; make llama-server builds it): tokens recomputed, greedy "
                        "agreement with its own exact prefill (default 0: not run)")
    p.add_argument("--vllm", type=int, default=0, metavar="N",
                   help="the first N edits also inside vLLM: vllm serve with the plugin on the checkpoint, amortize / "
                        "auto / forget against vLLM's own prefill of the edited history (run with .venv-vllm's "
                        "python; default 0: not run)")
    p.add_argument("--vllm-repair", default="", metavar="W,..",
                   help="repair windows also run inside vLLM on the same --vllm edits, each on its own vllm serve "
                        "whose auto always amortizes with a W-token exact window (default: none)")
    p.add_argument("--vllm-dtype", default=None, choices=("float32", "bfloat16"),
                   help="vllm serve's --dtype (default: bfloat16, float32 on a CPU without AVX512-BF16 or AMX)")
    p.add_argument("--no-oracle", action="store_true",
                   help="skip the transformers arms: only the peers (--llama-cpp, --vllm) run")
    p.add_argument("--journal", default=None,
                   help="JSON-lines file of finished edits: read on start (those edits are not played again) and "
                        "appended after each edit, so a run cut short resumes where it stopped")
    p.add_argument("--name", default=NAME, help=f"output files' name (default {NAME}: <out>/{NAME}.json, .md, .png)")
    p.set_defaults(run=run, quick_overrides={
        "models": "tiny-qwen2=random-qwen2", "sessions": 12, "edits": 4, "max_tokens": 3500, "turn_tokens": 600,
        "repair_windows": "16", "greedy_tokens": 6, "answer_tokens": 6, "dtype": "float32", "fp32_floor": 2})


def load(spec: str, dtype: torch.dtype, tokenizer_only: bool = False):
    """(model, tokenizer) for one ``--models`` entry (model None with ``tokenizer_only``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    if spec == "random-qwen2":
        from leyline_runtime.model.default import DEFAULT_MODEL_DIR
        from .drift import load_model

        tok = PreTrainedTokenizerFast(tokenizer_file=str(DEFAULT_MODEL_DIR / "tokenizer.json"), eos_token="<|end|>")
        tok.chat_template = QUICK_TEMPLATE
        return load_model(spec).to(dtype), tok
    if spec.startswith("weights:"):
        from .. import weights

        spec = str(weights.hf_folder(spec.removeprefix("weights:")))
    if tokenizer_only:
        return None, AutoTokenizer.from_pretrained(spec)
    return AutoModelForCausalLM.from_pretrained(spec, dtype=dtype).eval(), AutoTokenizer.from_pretrained(spec)


def _models(spec: str) -> list[tuple[str, str]]:
    return [(label.strip(), folder.strip()) for label, _, folder in (s.partition("=") for s in spec.split(","))]


def run(args, log=print) -> dict:
    cfg = AutoConfig() if args.drift_budget is None else replace(AutoConfig(), drift_budget=args.drift_budget)
    windows = [int(w) for w in args.repair_windows.split(",") if w]
    kinds = [k for k in args.kinds.split(",") if k]
    if args.vllm and args.vllm_dtype is None:
        args.vllm_dtype = real_weights_dtype()  # resolved once, so the settings record what was served
    sessions = load_sessions(args.split)[:args.sessions]
    models = {}
    for label, spec in _models(args.models):
        model, tok = load(spec, getattr(torch, args.dtype), tokenizer_only=args.no_oracle)
        render = Renderer(tok)
        edits = select_edits(render, sessions, kinds, args.edits, args.max_tokens, args.turn_tokens)
        journal = Journal(args.journal, label) if args.journal else None
        records = [] if args.no_oracle else play(model, render, edits, cfg, mode_names(windows), args,
                                                 journal=journal, log=lambda s, at=label: log(f"{at} {s}"))
        seconds = sum(r["seconds"] for r in records)  # also over a resumed run's journal
        floor = []
        if args.fp32_floor and not args.no_oracle:
            del model
            model = load(spec, torch.float32)[0]
            floor = play(model, render, edits[:args.fp32_floor], cfg, ["forget"], args, ask=False,
                         log=lambda s, at=label: log(f"{at} fp32 floor {s}"))
        models[label] = {"spec": spec, "dtype": args.dtype, **_shape(model), "seconds": seconds,
                         "summary": summarise(records, mode_names(windows), cfg),
                         "fp32_floor": summarise(floor, ["forget"], cfg) if floor else None,
                         "records": records, "floor_records": floor}
        del model
        peer = None
        if args.llama_cpp:
            peer_journal = Journal(args.journal, f"{label}/llama_cpp") if args.journal else None
            peer = play_peer(spec, render, edits[:args.llama_cpp], args, peer_journal,
                             log=lambda s, at=label: log(f"{at} {s}"))
            models[label]["llama_cpp"] = ({"skipped": peer} if isinstance(peer, str)
                                          else peer_summary(peer, records, args.greedy_tokens))
        models[label]["peer_records"] = peer if isinstance(peer, list) else None
        inside = None
        if args.vllm:
            inside_journal = Journal(args.journal, f"{label}/vllm") if args.journal else None
            inside, described = play_vllm(spec, render, edits[:args.vllm], args, inside_journal,
                                          log=lambda s, at=label: log(f"{at} vllm {s}"))
            models[label]["vllm"] = ({"skipped": inside} if isinstance(inside, str)
                                     else vllm_peer.summarise(inside, described, args.greedy_tokens))
        models[label]["vllm_records"] = inside if isinstance(inside, list) else None
    samples = {label: {"records": m.pop("records"), "fp32_floor": m.pop("floor_records"),
                       "llama_cpp": m.pop("peer_records"), "vllm": m.pop("vllm_records")}
               for label, m in models.items()}
    settings = {k: v for k, v in vars(args).items() if k not in ("run", "quick_overrides")} | {"auto": cfg.__dict__}
    result = {"benchmark": args.name, "settings": settings, "models": models}
    payload = write_results(args.out, args.name, result, "leyline-bench drift-real", markdown(models, args),
                            samples=samples)
    plot(f"{args.out}/{args.name}.png", models)
    return payload


def play(model, render: Renderer, edits, cfg, modes: list[str], args, ask: bool = True, journal: Journal | None = None,
         log=print) -> list[dict]:
    """Every edit under every mode; the unedited history's rows are prefilled once per history."""
    slot, cached = rope_slot(model), {}

    def measure(edit):
        key = (edit.history.session, edit.history.first_round)
        if key not in cached:
            cached.clear()
            cached[key] = history_rows(model, edit.history.tokens)
        return run_edit(model, render, edit, cached[key], slot, cfg, modes, args.greedy_tokens, args.answer_tokens,
                        ask=ask)

    def describe(n, edit, record):
        q = record.get("question")
        return (f"depth {record['depth']:.2f} tail {record['tail']} ({record['seconds']:.0f} s): " + ", ".join(
                f"{m} top-1 {mean(r['next_top1']):.3f} greedy {r['greedy_same']}/{r['greedy_compared']}"
                for m, r in record["modes"].items() if m != "exact")
                + (f"; question {q['kind']} answered by {','.join(m for m, a in q['answered'].items() if a)}"
                   if q else ""))
    return each_edit(edits, measure, journal, describe, log)


def play_peer(spec: str, render: Renderer, edits, args, journal: Journal | None, log=print) -> list[dict] | str:
    """The edits on llama.cpp serving the checkpoint's GGUF (:mod:`.llama_peer`); a string: why it did not run."""
    if not spec.startswith("weights:"):
        return "llama.cpp needs a GGUF: only weights:NAME checkpoints have one"
    if reason := absent_reason():
        return reason
    from .. import weights

    gguf = weights.gguf_path(spec.split(":", 1)[1])
    ctx = args.max_tokens + args.turn_tokens + args.greedy_tokens + 256
    with tempfile.TemporaryDirectory() as workdir, LlamaServer(gguf, Path(workdir), ctx=ctx) as server:
        return each_edit(edits, lambda edit: peer_record(server, render, edit, args.greedy_tokens), journal,
                         lambda n, edit, r: (f"llama.cpp recomputed {r['recomputed']} of forget's "
                                             f"{r['forget_tokens']}, greedy {r['greedy_same']}/{r['greedy_compared']}"
                                             f" ({r['seconds']:.0f} s)"), log)


def play_vllm(spec: str, render: Renderer, edits, args, journal: Journal | None,
              log=print) -> tuple[list[dict] | str, dict | None]:
    """The edits inside ``vllm serve`` with the plugin (:mod:`.vllm_peer`); a string: why it did not run."""
    if not spec.startswith("weights:"):
        return "the vLLM arm serves a checkpoint of leyline_bench.weights (weights:NAME)", None
    try:
        import vllm  # noqa: F401  (only .venv-vllm has it)
    except ImportError:
        return "vllm is not installed in this python (run drift-real with .venv-vllm's python)", None
    from .. import weights

    folder = weights.hf_folder(spec.split(":", 1)[1])

    def ask(edit):
        return question_for(edit.removed, render.text(edit.messages))

    records, described = _serve_vllm(folder, edits, args, journal, ask, log)
    described["repair_servers"] = {}
    for window in [int(w) for w in args.vllm_repair.split(",") if w]:
        arm = vllm_peer.repair_arm(window)
        arm_journal = Journal(journal.path, f"{journal.label}/{arm}") if journal else None
        more, described["repair_servers"][arm] = _serve_vllm(
            folder, edits, args, arm_journal, ask, lambda s, at=arm: log(f"{at}: {s}"), arms={arm: "auto"},
            auto_config=vllm_peer.repair_config(window), main=False)
        vllm_peer.merge(records, more)
    return records, described


def _serve_vllm(folder: Path, edits, args, journal: Journal | None, ask, log, **arms) -> tuple[list[dict], dict]:
    """The edits on one ``vllm serve`` with the plugin, under its arms (:class:`.vllm_peer.VllmPeer`)."""
    ctx = args.max_tokens + 2 * args.turn_tokens + args.greedy_tokens + 512  # the plugin's rendering runs longer
    with tempfile.TemporaryDirectory() as workdir, vllm_peer.VllmPeer(
            folder, Path(workdir), dtype=args.vllm_dtype, max_model_len=ctx, greedy_tokens=args.greedy_tokens,
            answer_tokens=args.answer_tokens, **arms) as peer:
        described = peer.describe()
        log(f"serving: {described['splice']}")
        records = each_edit(edits, lambda e: peer.record(e, ask(e)), journal, _describe_vllm, log)
    return records, described


def _describe_vllm(n, edit, r) -> str:
    floor = r["modes"].get("floor")
    return (", ".join(f"{m} rows {r['modes'][m]['own']} (here {r['modes'][m]['recomputed']}) of {r['forget_tokens']} "
                      f"greedy {r['modes'][m]['greedy_same']}/{r['modes'][m]['greedy_compared']}"
                      + (f" ({r['modes'][m]['choice']})" if r["modes"][m]["choice"] else "")
                      for m in r["modes"] if m != "floor")
            + (f"; floor {floor['greedy_same']}/{floor['greedy_compared']}" if floor else "")
            + f" ({r['seconds']:.0f} s)")


def _shape(model) -> dict:
    if model is None:
        return {}
    c = model.config
    return {"architecture": c.model_type, "layers": c.num_hidden_layers, "hidden": c.hidden_size,
            "query_heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
            "params": sum(p.numel() for p in model.parameters())}
