"""The tables and the plot of ``leyline-bench drift-agent``: per mode, the next action against the exact
prefill's, the rows it computed, and the teacher-forced KL and margin; per edit kind; the floor."""

from __future__ import annotations

from collections import Counter

from ..common import plots
from ..common.output import fmt, md_table
from ..common.stats import mean, percentile
from .agent_case import UNEDITED
from .real_modes import EXACT


def mode_summary(records: list[dict], mode: str) -> dict:
    runs = [r["modes"][mode] for r in records]
    forget_work = max(1, sum(r["forget_tokens"] for r in records))
    kl = [run["kl"] for run in runs if run["kl"] is not None]
    margins = [run["margin"] for run in runs if run["margin"] is not None]
    changed = [r["modes"][mode] for r in records if not r["modes"][UNEDITED]["same_action"]]
    recovered = [r["modes"][mode]["margin"] / r["modes"][EXACT]["margin"] for r in records
                 if r["modes"][mode]["margin"] is not None and r["modes"][EXACT]["margin"]]
    return {"edits": len(runs), "share": sum(run["recomputed"] for run in runs) / forget_work,
            "same_action": mean([run["same_action"] for run in runs]),
            "same_action_count": sum(run["same_action"] for run in runs),
            "same_word": mean([run["same_word"] for run in runs]),
            "same_turn": mean([run["same_turn"] for run in runs]),
            "has_action": mean([run["has_action"] for run in runs]),
            "kl_mean": mean(kl), "kl_p50": percentile(kl, 50), "kl_p90": percentile(kl, 90),
            "margin_edits": len(margins), "margin_p50": percentile(margins, 50),
            "margin_positive": mean([m > 0 for m in margins]), "margin_of_exact_p50": percentile(recovered, 50),
            "changed_edits": len(changed), "same_action_where_edit_changed_it": mean([c["same_action"] for c in changed]),
            "choices": dict(Counter(run["choice"] for run in runs if run["choice"]))}


def summarise(records: list[dict], modes: list[str]) -> dict:
    if not records:
        return {"edits": 0}
    arms = [EXACT, *modes, UNEDITED]
    kinds = sorted({r["kind"] for r in records})
    return {"edits": len(records), "sessions": len({r["session"] for r in records}),
            "histories": len({(r["session"], r["first_round"]) for r in records}),
            "edit_kinds": dict(Counter(r["kind"] for r in records)),
            "reference_has_action": mean([r["reference_action"] for r in records]),
            "reference_tools": dict(Counter(r["reference_tool"] or "none" for r in records)),
            "tail_p50": percentile([r["tail"] for r in records], 50),
            "turn_tokens_p50": percentile([r["turn_tokens"] for r in records], 50),
            "dependent_windows_p50": {m: percentile([_window(r, m) for r in records], 50)
                                      for m in modes if m.startswith("dependent-")},
            "seconds_per_edit": mean([r["seconds"] for r in records]),
            "modes": {m: mode_summary(records, m) for m in arms},
            "by_kind": {k: {m: mode_summary([r for r in records if r["kind"] == k], m) for m in arms} for k in kinds}}


def _window(record: dict, mode: str) -> int:
    """The rows ``mode`` (dependent-N) recomputed after the edit's replacement."""
    n, ends = int(mode.rsplit("-", 1)[1]), record["dependent_ends"] or []
    return (ends[n - 1] if len(ends) >= n else record["edited_tokens"]) - record["new_end"]


HEADERS = ["mode", "rows computed (share of forget's)", "same action", "same command word", "same turn (token for "
           "token)", "KL mean (nats/token)", "KL p90", "margin edits", "margin p50 (nats)", "margin > 0",
           "margin as a share of exact's, p50",
           "same action where the edit changed it"]


def _label(mode: str, floor: str | None) -> str:
    return {EXACT: "exact (the reference)", UNEDITED: "F: the unedited history"}.get(
        mode, f"{mode} (the floor)" if mode == floor else mode)


def _rows(modes: dict, floor: str | None) -> list[list]:
    return [[_label(m, floor), None if m in (EXACT, floor) else s["share"],
             f"{fmt(s['same_action'])} ({s['same_action_count']}/{s['edits']})", s["same_word"], s["same_turn"],
             s["kl_mean"], s["kl_p90"], s["margin_edits"], s["margin_p50"], s["margin_positive"],
             s["margin_of_exact_p50"],
             f"{fmt(s['same_action_where_edit_changed_it'])} (of {s['changed_edits']})"] for m, s in modes.items()]


def model_markdown(label: str, m: dict, floor: str | None) -> str:
    s = m["summary"]
    if not s["edits"]:
        return f"## {label}\n\nNo edits measured.\n\n"
    auto = s["modes"].get("auto", {}).get("choices")
    text = (f"## {label} ({m['architecture']}, {m['layers']} layers, {m['params'] / 1e6:.0f}M parameters, "
            f"{m['dtype']})\n\n{s['edits']} edits ({', '.join(f'{k} {v}' for k, v in sorted(s['edit_kinds'].items()))})"
            f" from {s['histories']} histories of {s['sessions']} sessions; median {fmt(s['tail_p50'])} tokens after "
            f"the edit; the exact prefill's next turn a median {fmt(s['turn_tokens_p50'])} tokens, with a complete "
            f"action in {fmt(s['reference_has_action'])} of the edits (tools: "
            f"{', '.join(f'{k} {v}' for k, v in sorted(s['reference_tools'].items()))}). Wall time "
            f"{m['seconds']:.0f} s ({fmt(s['seconds_per_edit'])} s per edit).\n\n"
            + md_table(HEADERS, _rows(s["modes"], floor)) + "\n\n")
    if s["reference_has_action"] < 1:
        text += ("Where the exact prefill's turn ends no action within the token cap, *same action* and *same command "
                 "word* compare the whole generated prose, token run for token run (whitespace collapsed): a stricter "
                 "test than the action's, which a larger cap would reach.\n\n")
    if s["dependent_windows_p50"]:
        text += ("Median rows a dependent repair recomputed after the replacement: "
                 + ", ".join(f"{k} {fmt(v)}" for k, v in s["dependent_windows_p50"].items()) + ".\n\n")
    if auto:
        text += f"auto chose {', '.join(f'{k} {v}' for k, v in sorted(auto.items()))}.\n\n"
    kinds = s["by_kind"]
    modes = [m for m in s["modes"] if m != EXACT]
    rows = [[k, ms[EXACT]["edits"], *[ms[m]["same_action"] for m in modes]] for k, ms in kinds.items()]
    return text + "Same action by edit kind:\n\n" + md_table(["kind", "edits", *map(str, modes)], rows) + "\n\n"


def markdown(models: dict, args, floor: str | None) -> str:
    text = ("Single edits taken from real mini-swe-agent sessions (the held-out split unless the command says "
            "otherwise), every mode's rows built on the model's transformers implementation (the bundled-runtime "
            "oracle, no vLLM), then the next assistant turn generated greedily after the edited history, up to the "
            f"end of its first action (at most {args.action_tokens} tokens). *same action*: the same tool and "
            "arguments as the exact prefill's turn, whitespace collapsed; *same command word*: the same tool and "
            "program (past `cd DIR &&`); *same turn*: every token the same. *KL*: KL(exact || mode) per position, "
            "teacher-forced on the exact prefill's turn, mean over the turn, then over edits. *margin*: the "
            "log-likelihood the mode's rows give the exact prefill's turn minus the one they give the unedited "
            "history's turn, on the edits where those two turns differ (*margin edits*); > 0: the mode prefers "
            "what the edit leads to; *as a share of exact's*: the mode's margin over the exact prefill's own, per edit "
            "(1: the rows prefer the edited history's turn as much as an exact prefill does). *F*: the turn the unedited history generates (what the agent would do had the "
            "edit never happened); *where the edit changed it*: the edits where F's action is not the exact "
            "prefill's. *rows computed*: rows recomputed through every layer, as a share of forget's (auto's layer-1 "
            "signal rows not counted). *dependent-N*: recompute from the edit through the end of the N-th "
            "assistant turn after it, rotate the rest; *tail-K*: amortize, then the last K rows recomputed; "
            f"*{floor or 'chunked-C'}*: a second exact prefill, in chunks — the floor.\n\n")
    body = "\n".join(model_markdown(label, m, floor) for label, m in models.items())
    return text + body + f"\n![drift-agent]({args.name}.png)\n"


def plot(path: str, models: dict, floor: str | None) -> None:
    groups, series = [], {"same action": [], "same command word": [], "rows computed (share of forget's)": []}
    for label, m in models.items():
        for mode, ms in m["summary"].get("modes", {}).items():
            if mode == EXACT:
                continue
            groups.append(f"{label} {_label(mode, floor)}")
            series["same action"].append(ms["same_action"])
            series["same command word"].append(ms["same_word"])
            series["rows computed (share of forget's)"].append(None if mode == floor else ms["share"])
    plots.grouped_bars(path, "the next action after a real edit, against an exact prefill's", groups, series, "share")
