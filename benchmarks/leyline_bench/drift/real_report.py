"""The tables and the plot of ``leyline-bench drift-real``: per mode, per edit kind, per tail length, and the
removed-content questions."""

from __future__ import annotations

from collections import Counter

from ..common import plots
from ..common.output import fmt, md_table
from ..common.stats import mean, percentile
from . import llama_peer, vllm_peer

TAIL_BINS = ((0, 500), (500, 1000), (1000, 10 ** 9))


def _pool(records: list[dict], mode: str, key: str) -> list:
    return [v for r in records for v in r["modes"][mode][key]]


def _quantiles(values: list[float]) -> dict:
    return {"n": len(values), "min": min(values), "p10": percentile(values, 10), "p50": percentile(values, 50),
            "p90": percentile(values, 90), "max": max(values)} if values else {"n": 0}


def mode_summary(records: list[dict], mode: str) -> dict:
    runs = [r["modes"][mode] for r in records]
    jsd = _pool(records, mode, "next_jsd")
    signals = [run["signal"] for run in runs if run["signal"] is not None]
    forget_work = max(1, sum(r["forget_tokens"] for r in records))
    compared = sum(run["greedy_compared"] for run in runs)
    return {"edits": len(runs), "share": sum(run["recomputed"] for run in runs) / forget_work,
            "signal_rows_share": sum(run["signal_tokens"] for run in runs) / forget_work,
            "next_top1": mean(_pool(records, mode, "next_top1")), "next_jsd_p50": percentile(jsd, 50),
            "next_jsd_p90": percentile(jsd, 90), "next_jsd_max": max(jsd) if jsd else None,
            "probe_top1": mean([run["probe_top1"] for run in runs]),
            "greedy_prefix_mean": mean([run["greedy_same"] for run in runs]),
            "greedy_prefix_median": percentile([run["greedy_same"] for run in runs], 50),
            "greedy_identical": mean([run["greedy_same"] == run["greedy_compared"] for run in runs]),
            "greedy_agreeing_share": sum(run["greedy_same"] for run in runs) / max(1, compared),
            "choices": dict(Counter(run["choice"] for run in runs if run["choice"])),
            "signal_p50": percentile(signals, 50), "signal_p90": percentile(signals, 90)}


INFORMATIVE_NATS = 1.0  # F's log-probability gain over exact from which a question counts as informative


def removed_summary(records: list[dict], arms: list[str]) -> dict:
    """Per arm: the questions whose reply holds a removed value (of all, and of those F answers), and the
    log-probability its rows give the value beyond the exact arm's (which never saw it). *Informative*
    questions are those where F's rows raise it by at least ``INFORMATIVE_NATS``: there an arm *recalls*
    when its rows give at least half of F's gain."""
    qs = [r["question"] for r in records if r.get("question")]
    f_ok = [q for q in qs if q["answered"]["F"]]

    def gain(q, arm):
        return q["answer_logprob"][arm] - q["answer_logprob"]["exact"]

    informative = [q for q in qs if "answer_logprob" in q and gain(q, "F") >= INFORMATIVE_NATS]
    out = {"questions": len(qs), "f_answers": len(f_ok), "informative": len(informative),
           "kinds": dict(Counter(q["kind"] for q in qs)),
           "edit_kinds": dict(Counter(r["kind"] for r in records if r.get("question"))), "arms": {}}
    for arm in ["F", *arms]:
        hits = sum(q["answered"][arm] for q in qs)
        hits_f = sum(q["answered"][arm] for q in f_ok)
        gains = [gain(q, arm) for q in qs if "answer_logprob" in q]
        out["arms"][arm] = {"answered": hits, "share": hits / len(qs) if qs else None,
                            "answered_where_f_does": hits_f, "share_where_f_does": hits_f / len(f_ok) if f_ok else None,
                            "logprob_gain_median": percentile(gains, 50), "logprob_gain_p90": percentile(gains, 90),
                            "recalls": mean([gain(q, arm) >= 0.5 * gain(q, "F") for q in informative]),
                            "gain_fraction_median": percentile([gain(q, arm) / gain(q, "F") for q in informative], 50)}
    return out


def summarise(records: list[dict], modes: list[str], cfg) -> dict:
    if not records:
        return {"edits": 0}
    forget = [r["modes"]["forget"] for r in records]
    checks = {"forget_vs_exact_max_jsd": max(max(run["next_jsd"]) for run in forget),
              "forget_vs_exact_top1": mean(_pool(records, "forget", "next_top1")),
              "forget_greedy_identical": mean([run["greedy_same"] == run["greedy_compared"] for run in forget])}
    errors = [r["layer0_rotary_max_rel_err"] for r in records if "layer0_rotary_max_rel_err" in r]
    if errors:
        checks["layer0_rotary_max_rel_err"] = max(errors)
    sizes = {key: _quantiles([r[key] for r in records]) for key in
             ("history_tokens", "edited_tokens", "depth", "tail", "turn_tokens", "forget_tokens")}
    sizes["removed_tokens"] = _quantiles([r["old_end"] - r["start"] for r in records])
    kinds = sorted({r["kind"] for r in records})
    return {"edits": len(records), "histories": len({(r["session"], r["first_round"]) for r in records}),
            "sessions": len({r["session"] for r in records}), "edit_kinds": dict(Counter(r["kind"] for r in records)),
            "sizes": sizes, "checks": checks, "seconds_per_edit": mean([r["seconds"] for r in records]),
            "modes": {m: mode_summary(records, m) for m in modes},
            "by_kind": {k: {m: mode_summary([r for r in records if r["kind"] == k], m) for m in modes} for k in kinds},
            "by_tail": {f"{a}-{b}" if b < 10 ** 9 else f">={a}": {m: mode_summary(rs, m) for m in modes}
                        for a, b in TAIL_BINS if (rs := [r for r in records if a <= r["tail"] < b])},
            "removed": removed_summary(records, ["exact", *modes]) if any(r.get("question") for r in records) else None}


def _mode_rows(modes: dict) -> list[list]:
    return [[m, s["share"], s["next_top1"], s["next_jsd_p50"], s["next_jsd_p90"], s["probe_top1"],
             f"{fmt(s['greedy_prefix_mean'])} ({fmt(s['greedy_prefix_median'])})", s["greedy_agreeing_share"],
             s["greedy_identical"]] for m, s in modes.items()]


MODE_HEADERS = ["mode", "rows computed (share of forget's)", "next-turn top-1", "next-turn JSD p50", "JSD p90",
                "probe top-1", "greedy agreeing prefix, mean (median)", "agreeing share", "greedy identical"]


def _grouped(groups: dict, key: str, label: str) -> str:
    modes = list(next(iter(groups.values())))
    rows = [[g, next(iter(ms.values()))["edits"], *[ms[m][key] for m in modes]] for g, ms in groups.items()]
    return md_table([label, "edits", *modes], rows)


def _sizes_line(s: dict) -> str:
    def q(key, scale=1.0):
        d = s["sizes"][key]
        return "–" if not d["n"] else " / ".join(fmt(d[k] * scale) for k in ("min", "p10", "p50", "p90", "max"))
    return (f"{s['edits']} edits ({', '.join(f'{k} {v}' for k, v in sorted(s['edit_kinds'].items()))}) from "
            f"{s['histories']} histories of {s['sessions']} sessions. Min / p10 / median / p90 / max: history "
            f"{q('history_tokens')} tokens; edit start at {q('depth', 100.0)} % of the history; tokens after the edit "
            f"{q('tail')}; tokens the edit removed {q('removed_tokens')}; next turn {q('turn_tokens')}.")


def _removed_table(r: dict) -> str:
    rows = [[arm, a["answered"], a["share"], a["answered_where_f_does"], a["share_where_f_does"],
             a["logprob_gain_median"], a["logprob_gain_p90"], a["gain_fraction_median"], a["recalls"]]
            for arm, a in r["arms"].items()]
    return md_table(["arm", "replies holding a removed value", "share of questions",
                     f"of the {r['f_answers']} F answers", "share there", "log-prob gain over exact, median (nats)",
                     "p90", f"share of F's gain, median (the {r['informative']} informative)",
                     "recalls (>= half of F's gain)"], rows)


def model_markdown(label: str, m: dict) -> str:
    s = m["summary"]
    if not s["edits"]:
        return (f"## {label}\n\nThe transformers arms: not run (`--no-oracle`) or no edits.\n\n"
                + llama_peer.markdown(m.get("llama_cpp")) + vllm_peer.markdown(m.get("vllm")))
    auto = s["modes"].get("auto", {})
    c = s["checks"]
    text = (f"## {label} ({m['architecture']}, {m['layers']} layers, {m['query_heads']}/{m['kv_heads']} heads, "
            f"{m['params'] / 1e6:.0f}M parameters, {m['dtype']})\n\n{_sizes_line(s)} Wall time {m['seconds']:.0f} s "
            f"({fmt(s['seconds_per_edit'])} s per edit).\n\n" + md_table(MODE_HEADERS, _mode_rows(s["modes"])) + "\n\n")
    if auto:
        text += (f"auto chose {', '.join(f'{k} {v}' for k, v in sorted(auto['choices'].items()))}; its drift signal "
                 f"(layer-1 change x (layers - 1)) median {fmt(auto['signal_p50'])}, p90 {fmt(auto['signal_p90'])} "
                 f"(forget above 8); its signal rows are {fmt(auto['signal_rows_share'])} of forget's (layers 0-1 "
                 "only).\n\n")
    text += (f"Checks: forget against the exact prefill: max JSD {fmt(c['forget_vs_exact_max_jsd'])}, top-1 "
             f"{fmt(c['forget_vs_exact_top1'])}, greedy identical {fmt(c['forget_greedy_identical'])} (the noise "
             f"floor of {m['dtype']}); amortize's rotated layer-0 keys against the exact ones: max error "
             f"{fmt(c.get('layer0_rotary_max_rel_err'))} of their largest value.\n\n")
    floor = m.get("fp32_floor")
    if floor and floor.get("edits"):
        f = floor["modes"]["forget"]
        text += (f"float32 floor (the first {floor['edits']} edits again in float32, forget only): next-turn top-1 "
                 f"{fmt(f['next_top1'])}, JSD p90 {fmt(f['next_jsd_p90'])}, max {fmt(f['next_jsd_max'])}, greedy "
                 f"identical {fmt(f['greedy_identical'])}.\n\n")
    text += "Next-turn top-1 by edit kind:\n\n" + _grouped(s["by_kind"], "next_top1", "kind") + "\n\n"
    text += "Greedy continuation identical by edit kind:\n\n" + _grouped(s["by_kind"], "greedy_identical", "kind")
    text += "\n\nNext-turn top-1 by tokens after the edit:\n\n" + _grouped(s["by_tail"], "next_top1", "tail tokens")
    text += ("\n\nGreedy continuation identical by tokens after the edit:\n\n"
             + _grouped(s["by_tail"], "greedy_identical", "tail tokens") + "\n\n")
    r = s.get("removed")
    if r:
        text += (f"Removed content: {r['questions']} questions (value kinds: "
                 f"{', '.join(f'{k} {v}' for k, v in sorted(r['kinds'].items()))}; edit kinds: "
                 f"{', '.join(f'{k} {v}' for k, v in sorted(r['edit_kinds'].items()))}), each asked right after the "
                 "edit; F: the unedited history. *log-prob gain*: the log-probability the arm's rows give the "
                 "removed value (teacher-forced after the question) minus the exact arm's; *informative*: questions "
                 f"where F's gain is at least {INFORMATIVE_NATS:g} nat.\n\n" + _removed_table(r) + "\n\n")
    return text + llama_peer.markdown(m.get("llama_cpp")) + vllm_peer.markdown(m.get("vllm"))


def markdown(models: dict, args) -> str:
    text = ("Single edits taken from real mini-swe-agent sessions (the held-out split unless the command says "
            "otherwise), every mode's rows built on the model's transformers implementation and scored against "
            "an exact prefill of the edited history (*exact*). *rows computed*: rows recomputed through every "
            "layer, as a share of forget's; *next turn*: the session's next round and an assistant header, "
            "teacher-forced, every position; *probe*: the header's position; *greedy*: the exact arm's "
            f"{args.greedy_tokens} greedy tokens after the header, compared token by token up to its first "
            "difference (*identical*: all of them). JSD in nats.\n\n")
    body = "\n".join(model_markdown(label, m) for label, m in models.items())
    return text + body + f"\n![drift-real]({args.name}.png)\n"


def plot(path: str, models: dict) -> None:
    groups, series = [], {"next-turn probe top-1": [], "greedy continuation identical": [],
                          "removed value answered (of questions F answers)": []}
    for label, m in models.items():
        s = m["summary"]
        for mode, ms in s.get("modes", {}).items():
            groups.append(f"{label} {mode}")
            series["next-turn probe top-1"].append(ms["probe_top1"])
            series["greedy continuation identical"].append(ms["greedy_identical"])
            removed = (s.get("removed") or {}).get("arms", {}).get(mode, {})
            series["removed value answered (of questions F answers)"].append(removed.get("share_where_f_does"))
        inside = m.get("vllm") or {}
        for mode, a in (inside.get("arms") or {}).items():
            groups.append(f"{label} {mode} (vLLM)")
            series["next-turn probe top-1"].append(None)  # not measured inside vLLM
            series["greedy continuation identical"].append(a["greedy_identical"])
            hits, asked = inside["removed"]["answered_where_f_does"].get(mode), inside["removed"]["f_answers"]
            series["removed value answered (of questions F answers)"].append(
                hits / asked if asked and hits is not None else None)  # the floor is asked no question
    plots.grouped_bars(path, "single real edits against an exact prefill, per mode", groups, series, "share")
