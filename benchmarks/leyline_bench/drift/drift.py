"""``leyline-bench drift``: does amortize drift the same on GQA as on MLA? transformers as the oracle.

Each model (a folder transformers loads: a ``leyline-train --arch llama`` or ``--arch mla`` run, the
embedded default model) plays ``amortize``, ``forget`` and ``auto`` over the same agent-like 20-edit
sessions (:mod:`..fidelity.edit_sessions`, the fidelity bench's ``--policies`` sessions) in
:mod:`.drift_oracle`; per model: recompute share (of forget's), next-turn JSD and top-1 against a
fresh prefill, the first edit of each session alone (a single edit), ``auto``'s choices and its
recompute share, and the exactness checks (forget vs fresh, layer-0 rotary rows vs fresh).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from leyline_runtime.config import AutoConfig
from leyline_runtime.model.default import DEFAULT_MODEL_DIR
from leyline_runtime.text.tokenizer import ChatTokenizer
from ..common import plots
from .drift_oracle import POLICIES, rope_slot, run_session
from ..fidelity.edit_sessions import build_session
from ..common.output import md_table, write_results
from ..common.stats import mean, percentile


def add_parser(sub) -> None:
    p = sub.add_parser("drift")
    p.add_argument("--models", default="mla-default=default",
                   help="comma list of label=folder (a model folder transformers loads; 'default': the embedded "
                        "default model; 'random-llama': a seeded random Llama of the default model's size; "
                        "'random-qwen2': a tiny seeded random Qwen2)")
    p.add_argument("--sessions", type=int, default=3, help="agent-like sessions per model")
    p.add_argument("--session-seed", type=int, default=2, help="first session seed (the fidelity bench's default)")
    p.add_argument("--edits", type=int, default=20, help="edit batches per session")
    p.add_argument("--session-tokens", type=int, default=900, help="history length before the first edit")
    p.add_argument("--drift-budget", type=float, default=None, help="auto's drift budget (default: the runtime's)")
    p.set_defaults(run=run, quick_overrides={"models": "mla-default=default,random-llama=random-llama",
                                             "sessions": 1, "edits": 2, "session_tokens": 500})


def load_model(folder: str):
    """A transformers causal LM for ``folder`` (fp32, eval)."""
    if folder == "random-qwen2":
        return random_qwen2(ChatTokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json").vocab_size)
    if folder == "random-llama":
        from leyline_training.architectures import new_model

        return new_model("llama", ChatTokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json").vocab_size,
                         DEFAULT_MODEL_DIR / "tokenizer.json", seed=0).hf.eval()
    from transformers import AutoModelForCausalLM

    path = DEFAULT_MODEL_DIR if folder == "default" else Path(folder)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def random_qwen2(vocab_size: int, seed: int = 0):
    """A seeded random Qwen2 (4 layers, 4 query / 2 KV heads of 32, rope theta 1e6), fp32. Its q/k/v biases are
    drawn too: transformers initialises them to zero, and a zero bias would not test that the cached key
    includes it before the rotation."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return model


def _models(spec: str) -> list[tuple[str, str]]:
    out = []
    for item in spec.split(","):
        label, _, folder = item.partition("=")
        out.append((label.strip(), (folder or label).strip()))
    return out


def run(args, log=print) -> dict:
    cfg = AutoConfig() if args.drift_budget is None else replace(AutoConfig(), drift_budget=args.drift_budget)
    tok = ChatTokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json")
    sessions = [build_session(tok, seed, edits=args.edits, start_tokens=args.session_tokens)
                for seed in range(args.session_seed, args.session_seed + args.sessions)]
    models = {}
    for label, folder in _models(args.models):
        model = load_model(folder)
        slot = rope_slot(model)
        records = []
        for s in sessions:
            records.append(run_session(model, tok, s, slot, cfg))
            log(f"drift {label} {s.name}: " + ", ".join(
                f"{p} share {r['share']:.3f} top-1 {mean(r['next_top1']):.3f}" for p, r in records[-1]["runs"].items()))
        models[label] = {"folder": folder, "architecture": model.config.model_type, **_shape(model),
                         "summary": summarise(records), "sessions": records}
    samples = {label: m.pop("sessions") for label, m in models.items()}
    result = {"benchmark": "drift", "settings": {
        "models": args.models, "sessions": args.sessions, "session_seed": args.session_seed, "edits": args.edits,
        "session_tokens": args.session_tokens, "auto": cfg.__dict__}, "models": models,
        "notes": ["Oracle: each model's transformers implementation, its per-layer cache edited as the connectors "
                  "do (rotary dims of every cached key rotated by delta with leyline_kernels).",
                  "JSD in nats against a fresh prefill of the edited history + the next turn."]}
    payload = write_results(args.out, "drift", result, "leyline-bench drift", _markdown(models), samples=samples)
    _plot(args.out, models)
    return payload


def _shape(model) -> dict:
    c = model.config
    return {"layers": c.num_hidden_layers, "hidden": c.hidden_size, "query_heads": c.num_attention_heads,
            "kv_heads": getattr(c, "num_key_value_heads", None),
            "params": sum(p.numel() for p in model.parameters())}


def summarise(records: list[dict]) -> dict:
    out = {"forget_vs_fresh_max_jsd": max(r["forget_vs_fresh_max_jsd"] for r in records),
           "layer0_rotary_max_rel_err": max(r["layer0_rotary_max_rel_err"] for r in records)}
    forget_work = sum(r["forget_tokens"] for r in records)
    for p in POLICIES:
        runs = [r["runs"][p] for r in records]

        def pooled(key):
            return [v for run in runs for v in run[key]]

        choices: dict[str, int] = {}
        for run in runs:
            for k, v in run["choices"].items():
                choices[k] = choices.get(k, 0) + v
        out[p] = {"share": sum(run["recomputed"] for run in runs) / forget_work,
                  "share_with_signal": sum(run["share_with_signal"] * r["forget_tokens"]
                                           for run, r in zip(runs, records)) / forget_work,
                  "next_jsd_median": percentile(pooled("next_jsd"), 50), "next_jsd_p90": percentile(pooled("next_jsd"), 90),
                  "next_top1": mean(pooled("next_top1")), "probe_jsd_p90": percentile(pooled("probe_jsd"), 90),
                  "probe_top1": mean(pooled("probe_top1")), "single_jsd_p90": percentile(pooled("first_jsd"), 90),
                  "single_top1": mean(pooled("first_top1")), "choices": choices,
                  "signal_median": percentile(pooled("signals"), 50), "signal_p90": percentile(pooled("signals"), 90)}
    return out


def _markdown(models: dict) -> str:
    text = ("Per model: the same agent-like sessions; *share*: rows recomputed as a share of forget's (+ auto's "
            "layer-1 signal as token equivalents); *next*: every position of the turn appended after each edit; "
            "*probe*: its assistant-header position; *single edit*: the turn after each session's first edit.\n\n")
    rows = []
    for label, m in models.items():
        s = m["summary"]
        for p in POLICIES:
            a = s[p]
            rows.append([label, m["architecture"], f"{m['query_heads']}/{m['kv_heads']}", p, a["share"],
                         a["share_with_signal"], a["next_jsd_median"], a["next_jsd_p90"], a["next_top1"],
                         a["probe_jsd_p90"], a["probe_top1"], a["single_jsd_p90"], a["single_top1"],
                         ", ".join(f"{k} {v}" for k, v in sorted(a["choices"].items())) or "–",
                         a["signal_median"]])
    text += md_table(["model", "architecture", "q/kv heads", "policy", "share", "+ signal", "next JSD median",
                      "next JSD p90", "next top-1", "probe JSD p90", "probe top-1", "single-edit JSD p90",
                      "single-edit top-1", "auto choices", "auto drift signal (median)"], rows)
    text += "\n\nExactness checks (per model): " + "; ".join(
        f"{label}: forget vs fresh max JSD {m['summary']['forget_vs_fresh_max_jsd']:.1e}, layer-0 rotary rows "
        f"after amortize vs fresh max relative error {m['summary']['layer0_rotary_max_rel_err']:.1e}"
        for label, m in models.items()) + ".\n"
    return text + "\n![drift](drift.png)\n"


def _plot(out, models: dict) -> None:
    labels = list(models)
    series = {f"{p} next JSD p90": [models[m]["summary"][p]["next_jsd_p90"] or None for m in labels]
              for p in ("amortize", "auto")}
    plots.grouped_bars(f"{out}/drift.png", "next-turn JSD p90 against a fresh prefill, by model", labels, series,
                       "JSD (nats, log)", log=True)
