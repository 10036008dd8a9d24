"""``leyline-bench drift-real``'s harness on a tiny random Qwen2 (q/k/v biases drawn, nothing downloaded): forget's
rows are a fresh prefill's, amortize's layer-0 rows are a fresh prefill's in their rotary dims (unrotated they are
not) while its upper layers drift, repair recomputes exactly its window; the real-session edits and the
removed-content questions are what they say; the quick run reports every mode."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from leyline_bench.cli import main
from leyline_bench.drift.drift import load_model
from leyline_bench.drift.drift_oracle import diff, moved, prefill, rope_slot, take
from leyline_bench.drift.drift_real import load
from leyline_bench.drift.real_edits import PLACEHOLDER, SUMMARY_CHARS, Renderer, candidates, histories, template_message
from leyline_bench.drift.real_modes import EXACT, agreeing_prefix, answer_logprob, continue_all, edited_rows
from leyline_bench.drift.removed_content import answers, question_for
from leyline_bench.sessions.load import load_sessions
from leyline_runtime.auto_rule import AutoConfig

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def qwen():
    return load_model("random-qwen2")


@pytest.fixture(scope="module")
def edited(qwen):
    """History a + x + b edited to a + y + b (b long enough for auto to measure), under every mode."""
    g = torch.Generator().manual_seed(3)
    a, x, b = (torch.randint(10, 8000, (n,), generator=g).tolist() for n in (50, 30, 220))
    old, new = a + x + b, a + [7, 7, 7] + b
    e = diff(old, new)
    _, rows = prefill(qwen, old, 0, [])
    modes = edited_rows(qwen, rows, new, e, rope_slot(qwen), AutoConfig(), ["amortize", "repair-16", "auto", "forget"])
    return rows, new, e, modes


def _gap(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


def test_forget_rows_are_a_fresh_prefill(edited):
    _, new, e, modes = edited
    for (k, v), (rk, rv) in zip(modes["forget"].rows, modes[EXACT].rows):
        assert _gap(k, rk) < 1e-5 and _gap(v, rv) < 1e-5
    assert modes["forget"].recomputed == len(new) - e.start


def test_amortize_is_exact_at_layer0_only_and_unrotated_rows_are_not(qwen, edited):
    old_rows, new, e, modes = edited
    tail = slice(e.new_end, len(new))
    (k0, v0), (rk0, rv0) = modes["amortize"].rows[0], modes[EXACT].rows[0]
    assert _gap(k0[:, tail], rk0[:, tail]) < 1e-4 and _gap(v0[:, tail], rv0[:, tail]) < 1e-5
    unrotated = take(old_rows, e.old_end, e.old_end + len(new) - e.new_end)[0][0]
    assert _gap(unrotated, rk0[:, tail]) > 0.05
    wrong_way = moved(take(old_rows, e.old_end, e.old_end + len(new) - e.new_end), -e.delta, rope_slot(qwen))[0][0]
    assert _gap(wrong_way, rk0[:, tail]) > 0.05
    top, ref_top = modes["amortize"].rows[-1][0], modes[EXACT].rows[-1][0]
    assert _gap(top[:, tail], ref_top[:, tail]) > 1e-3  # stale above layer 0: the drift the bench measures
    assert modes["amortize"].recomputed == e.new_end - e.start


def test_repair_recomputes_its_window_exactly_and_nothing_after(edited):
    _, _, e, modes = edited
    window, after = slice(e.new_end, e.new_end + 16), slice(e.new_end + 16, None)
    for (k, _), (rk, _) in zip(modes["repair-16"].rows, modes[EXACT].rows):
        assert _gap(k[:, window], rk[:, window]) < 1e-5
    assert _gap(modes["repair-16"].rows[-1][0][:, after], modes[EXACT].rows[-1][0][:, after]) > 1e-3
    assert modes["repair-16"].recomputed == modes["amortize"].recomputed + 16


def test_auto_decides_on_a_measured_signal(edited):
    auto = edited[3]["auto"]
    assert auto.choice in ("amortize", "forget") and auto.signal is not None and auto.signal > 0
    assert auto.signal_tokens == AutoConfig().signal_window


def test_a_batched_arm_continues_as_it_would_alone(qwen, edited):
    _, _, _, modes = edited
    prompt = [11, 12, 13, 14]
    alone, _ = continue_all(qwen, [modes[EXACT].rows], prompt, 3, set(), keep=4)
    batched, _ = continue_all(qwen, [modes[EXACT].rows, modes["amortize"].rows], prompt, 3, set(), keep=4)
    assert torch.allclose(alone[0], batched[0], atol=1e-4)
    assert not torch.allclose(batched[0], batched[1], atol=1e-6)


def test_answer_logprob_is_the_teacher_forced_sum(qwen, edited):
    _, new, _, modes = edited
    prompt, answer = [21, 22, 23], [31, 32]
    (got,) = answer_logprob(qwen, [modes[EXACT].rows], prompt, answer)
    logits, _ = prefill(qwen, prompt + answer, len(new), modes[EXACT].rows)
    logp = torch.log_softmax(logits, -1)
    want = float(logp[2, 31] + logp[3, 32])
    assert abs(got - want) < 1e-3 and got < 0


def test_agreeing_prefix_counts_up_to_the_reference_stop():
    assert agreeing_prefix([1, 2, 3, 0, 5], [1, 2, 9, 0, 5], {0}) == (2, 4)
    assert agreeing_prefix([1, 2, 3, 0, 5], [1, 2, 3, 0, 7], {0}) == (4, 4)
    assert agreeing_prefix([1, 2], [1], set()) == (1, 2)


@pytest.fixture(scope="module")
def render():
    return Renderer(load("random-qwen2", torch.float32)[1])


def test_real_edits_do_what_their_kind_says(render):
    sessions = load_sessions()[:30]
    seen = set()
    for s in sessions:
        for kind, h in histories(render, s, 3000, 600).items():
            for e in candidates(h, kind):
                seen.add(kind)
                old, new = h.messages, e.messages
                assert new[-1] is old[-1]  # the last round is never edited
                if kind == "clear":
                    assert new[e.target].content == PLACEHOLDER and e.removed[0][1] == old[e.target].content
                elif kind == "truncate":
                    kept = new[e.target].content.split("\n")
                    assert len(kept) == 11 and "lines truncated" in kept[5]
                elif kind == "drop":
                    assert len(new) == len(old) - 2 and old[e.target + 1].content.startswith("<returncode>")
                    assert not old[e.target + 1].content.startswith("<returncode>0<")
                else:
                    assert len(new) == len(old) - 3 and new[e.target].role == "user"
                    assert len(new[e.target].content) <= SUMMARY_CHARS + 60
    assert seen == {"clear", "truncate", "drop", "summary"}


def test_tool_call_arguments_render_once_not_as_a_quoted_string():
    (call,) = [m for m in load_sessions()[0].messages if m.tool_calls][:1]
    assert isinstance(template_message(call)["tool_calls"][0]["function"]["arguments"], dict)


def test_questions_only_ask_for_values_the_edit_removed():
    removed = [("python run.py", "Traceback:\n  File \"pkg/mod.py\"\nKeyError: 'x'\nValueError: bad")]
    q = question_for(removed, "the task mentions ValueError")
    assert q.kind == "exception" and q.answers == ("KeyError",) and "`python run.py`" in q.text
    assert answers(q, "KeyError") and not answers(q, "ValueError")
    listing = "<returncode>0</returncode>\n<output>\nsetup.py\nsetup.py\nREADME.rst\nsrc/pkg/core.py\nsrc/pkg/util.py\n"
    q = question_for([("ls -R", listing)], "we saw src/pkg/core.py")
    # setup.py is not unique, core.py is shown elsewhere: the line after README.rst... is not, util.py is
    assert q.kind == "next_line" and q.answers == ("src/pkg/util.py",) and "`src/pkg/core.py`" in q.text
    assert answers(q, "`src/pkg/util.py`") and not answers(q, "src/pkg/core.py")
    assert answers(q, "It is src/pkg/util.py.") and not answers(q, "src/pkg/util.pyc")
    tree = question_for([("ls -R", "./data:\n./data/TeXmacs:\n./data/TeXmacs/bin:\n")], "")
    assert tree.answers == ("data/TeXmacs",) and answers(tree, "./data/TeXmacs:")
    assert answers(tree, "data/TeXmacs") and not answers(tree, "./data/TeXmacs/bin:")
    assert question_for([("ls", "<output>\nab\n</output>")], "") is None


@pytest.mark.slow  # drift-real --quick, every mode (~15 s on 2 cores): make test-slow
def test_quick_run_reports_every_mode_and_forget_is_exact(tmp_path):
    out = tmp_path / "out"
    assert main(["drift-real", "--quick", "--threads", "1", "--sessions", "30", "--max-tokens", "3000",
                 "--out", str(out)]) == 0
    payload = json.loads((out / "drift_real.json").read_text())
    assert (out / "drift_real.md").read_text().startswith("# leyline-bench drift-real")
    assert (out / "drift_real.png").exists() and (out / "drift_real.samples.json.gz").exists()
    s = payload["models"]["tiny-qwen2"]["summary"]
    assert s["edits"] == 4 and set(s["modes"]) == {"amortize", "repair-16", "auto", "forget"}
    assert s["checks"]["forget_vs_exact_max_jsd"] < 1e-9 and s["checks"]["forget_greedy_identical"] == 1
    assert s["checks"]["layer0_rotary_max_rel_err"] < 1e-4
    assert s["modes"]["forget"]["share"] == 1 and s["modes"]["amortize"]["share"] < 1
    assert s["modes"]["amortize"]["next_jsd_max"] > s["checks"]["forget_vs_exact_max_jsd"]
    assert s["removed"]["questions"] >= 1 and payload["models"]["tiny-qwen2"]["fp32_floor"]["edits"] == 2
    assert s["removed"]["arms"]["exact"]["logprob_gain_median"] == 0


@pytest.mark.slow  # two drift-real runs (~20 s on 2 cores): make test-slow
def test_a_journal_resumes_a_cut_run_without_playing_its_edits_again(tmp_path):
    """A run cut after two edits, resumed from its journal, reports what one uninterrupted run reports."""
    common = ["drift-real", "--quick", "--threads", "1", "--sessions", "30", "--max-tokens", "3000", "--fp32-floor", "0"]
    journal = tmp_path / "edits.jsonl"
    assert main([*common, "--edits", "2", "--out", str(tmp_path / "cut"), "--journal", str(journal)]) == 0
    cut = json.loads((tmp_path / "cut" / "drift_real.json").read_text())["models"]["tiny-qwen2"]
    lines = journal.read_text().splitlines()
    assert len(lines) == 2
    assert main([*common, "--out", str(tmp_path / "resumed"), "--journal", str(journal)]) == 0
    assert main([*common, "--out", str(tmp_path / "whole")]) == 0
    resumed, whole = (json.loads((tmp_path / d / "drift_real.json").read_text())["models"]["tiny-qwen2"]
                      for d in ("resumed", "whole"))
    assert journal.read_text().splitlines()[:2] == lines and len(journal.read_text().splitlines()) == 4
    assert resumed["summary"]["edits"] == whole["summary"]["edits"] == 4 and cut["summary"]["edits"] == 2
    strip = lambda s: {m: {k: v for k, v in r.items() if "seconds" not in k} for m, r in s["modes"].items()}
    assert strip(resumed["summary"]) == strip(whole["summary"])
    # the resumed run's time covers every edit, the two it read from the journal too
    journaled = [json.loads(line)["record"]["seconds"] for line in journal.read_text().splitlines()]
    assert resumed["seconds"] == pytest.approx(sum(journaled))


def test_the_llama_cpp_peer_pairs_its_edits_with_leylines_and_refuses_a_model_without_gguf(tmp_path):
    from leyline_bench.drift.llama_peer import markdown, summarise

    def leyline(session, kind, recomputed, same):
        modes = {m: {"recomputed": r, "greedy_same": g, "greedy_compared": 4}
                 for m, r, g in (("amortize", recomputed, same), ("auto", recomputed, same), ("forget", 100, 4))}
        return {"session": session, "kind": kind, "modes": modes}

    def peer(session, kind, recomputed, same):
        return {"session": session, "kind": kind, "forget_tokens": 100, "turn_tokens": 10, "prompt_tokens": 300,
                "exact_computed": 300, "recomputed": recomputed, "greedy_same": same, "greedy_compared": 4,
                "first_token_same": same > 0}

    records = [leyline("a", "clear", 5, 4), leyline("a", "drop", 3, 1), leyline("b", "clear", 7, 0)]
    s = summarise([peer("a", "drop", 0, 4), peer("b", "clear", 100, 4)], records, greedy_tokens=4)
    assert s["edits"] == 2 and s["exact_prefill_computed_every_token"]
    llama, amortize = s["arms"]["llama.cpp --cache-reuse 256"], s["arms"]["Leyline amortize"]
    assert llama["share"] == 100 / 200 and llama["greedy_identical"] == 1
    assert amortize["share"] == (3 + 7) / 200 and amortize["greedy_identical"] == 0  # the paired edits only
    assert amortize["first_token_same"] == 0.5 and s["arms"]["Leyline forget"]["share"] == 1
    assert "history recomputed" in markdown(s)

    out = tmp_path / "out"
    assert main(["drift-real", "--quick", "--threads", "1", "--sessions", "30", "--max-tokens", "3000", "--edits", "2",
                 "--fp32-floor", "0", "--llama-cpp", "2", "--out", str(out)]) == 0
    tiny = json.loads((out / "drift_real.json").read_text())["models"]["tiny-qwen2"]
    assert "weights:NAME" in tiny["llama_cpp"]["skipped"]
    assert "not run" in (out / "drift_real.md").read_text()


def test_the_vllm_arm_replaces_one_message_span_and_counts_each_modes_own_rows():
    from leyline_bench.drift.vllm_peer import markdown, merge, summarise
    from leyline_sdk.diff import diff_messages
    from leyline_sdk.protocol import Message

    def message_span(old, new):  # the one directive the vLLM arm sends for an edit (the SDK's diff)
        (d,) = diff_messages(old, new)
        return d.span.start, d.span.end, d.replacement

    old = [Message(role="user", content=str(k)) for k in range(6)]
    clear = old[:2] + [Message(role="user", content="[cleared]")] + old[3:]
    assert message_span(old, clear) == (2, 3, [clear[2]])
    assert message_span(old, old[:1] + old[3:]) == (1, 3, [])  # a drop: a call and its output go
    summary = old[:1] + [Message(role="user", content="Summary")] + old[5:]
    assert message_span(old, summary) == (1, 5, [summary[1]])

    def run(own, computed, same, choice=None, answered=False):
        return {"own": own, "recomputed": computed, "greedy_same": same, "greedy_compared": 8,
                "applied": "forget" if choice == "forget" else "amortize", "choice": choice, "fallback_reason": None}

    def record(kind, amortize_same, q):
        amortize = run(10, 10, amortize_same) | ({"parting_margin": 0.2} if amortize_same < 8 else {})
        modes = {"amortize": amortize, "auto": run(40, 30, 8, "amortize"), "forget": run(100, 70, 8),
                 "floor": {"greedy_same": 8, "greedy_compared": 8}}
        return {"session": f"s-{kind}", "edited_tokens": 500, "kind": kind, "forget_tokens": 96, "modes": modes,
                "seconds": 1.0, "question": {"replies": {}, "answered": {"F": q, "exact": False, "amortize": q,
                                                                        "auto": False, "forget": False}}}

    records = [record("clear", 8, True), record("drop", 3, False)]
    repaired = [{"session": r["session"], "edited_tokens": r["edited_tokens"], "seconds": 2.0,
                 "modes": {"repair 16": run(26, 26, 8 - k, "amortize")},
                 "question": {"answered": {"repair 16": False}, "replies": {"repair 16": "x"}}}
                for k, r in enumerate(records)]
    with pytest.raises(ValueError, match="not the same edit"):
        merge(copy.deepcopy(records), repaired[::-1])
    with pytest.raises(ValueError):
        merge(copy.deepcopy(records), repaired[:1])  # a server that measured fewer edits
    merge(records, repaired)
    s = summarise(records, {"dtype": "bfloat16"}, greedy_tokens=8)
    assert list(s["arms"]) == ["amortize", "repair 16", "auto", "forget", "floor"]  # cheapest first
    assert s["arms"]["repair 16"]["share"] == 52 / 200 and s["arms"]["repair 16"]["greedy_identical"] == 0.5
    assert s["removed"]["answered"]["repair 16"] == 0 and s["seconds_per_edit"] == 3.0
    assert "*repair W*" in markdown(s) and "| repair 16 |" in markdown(s)
    amortize, auto, forget = (s["arms"][m] for m in ("amortize", "auto", "forget"))
    assert forget["share"] == 1 and amortize["share"] == 20 / 200 and auto["share"] == 80 / 200
    assert auto["computed_share"] == 60 / 200  # what it computed after amortize's rows, not its own cost
    assert amortize["greedy_identical"] == 0.5 and amortize["greedy_prefix_mean"] == 5.5 and auto["greedy_identical"] == 1
    assert s["removed"] == {"questions": 2, "f_answers": 1,
                            "answered": {"F": 1, "exact": 0, "amortize": 1, "repair 16": 0, "auto": 0, "forget": 0},
                            "answered_where_f_does": {"exact": 0, "amortize": 1, "repair 16": 0, "auto": 0,
                                                      "forget": 0}}
    assert amortize["parted_on_near_tie"] == 1 and auto["parted_on_near_tie"] is None
    assert s["arms"]["floor"] == {"greedy_identical": 1, "greedy_prefix_mean": 8, "first_token_same": 1}
    assert s["by_kind_greedy_identical"]["drop"]["amortize"] == 0 and "own rows" in markdown(s)
    assert "floor: vLLM's exact prefill" in markdown(s)


def test_a_peers_only_run_needs_vllm_and_a_real_checkpoint(tmp_path):
    """--no-oracle leaves the transformers arms out; the vLLM arm refuses, by name, what it cannot serve."""
    from leyline_bench.drift.llama_peer import summarise

    peer = {"session": "a", "kind": "drop", "forget_tokens": 100, "turn_tokens": 10, "prompt_tokens": 300,
            "exact_computed": 300, "recomputed": 40, "greedy_same": 4, "greedy_compared": 4, "first_token_same": True}
    alone = summarise([peer], [], greedy_tokens=4)
    assert list(alone["arms"]) == ["llama.cpp --cache-reuse 256"] and alone["arms"]["llama.cpp --cache-reuse 256"][
        "share"] == 0.4
    out = tmp_path / "out"
    assert main(["drift-real", "--quick", "--threads", "1", "--sessions", "30", "--max-tokens", "3000", "--edits", "2",
                 "--no-oracle", "--vllm", "2", "--out", str(out)]) == 0
    tiny = json.loads((out / "drift_real.json").read_text())["models"]["tiny-qwen2"]
    assert tiny["summary"] == {"edits": 0} and "weights:NAME" in tiny["vllm"]["skipped"]
    assert "not run" in (out / "drift_real.md").read_text()
