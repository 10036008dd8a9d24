"""The same edits inside vLLM: ``vllm serve`` with the plugin, every mode against vLLM's own exact prefill.

The transformers arms of ``drift-real`` splice a cache as the connectors splice it; this arm runs the
connector itself. Per edit, one ``vllm serve`` (the checkpoint's Hugging Face folder, the plugin on) is
driven over HTTP only, through the SDK:

* per arm (``amortize``, ``auto``, ``forget``): a session is created with the unedited history (the rows
  the agent's previous call left), the edit is applied as one message-span directive in that mode, and
  the session's next round is appended and answered with ``greedy_tokens`` greedy tokens
  (``min_tokens`` = ``max_tokens``: the end of generation is not taken, as the transformers arms do);
* the reference, last: vLLM's own ``/v1/completions`` (no session, no plugin code) on the token ids the
  plugin renders for the edited history, its next round and an assistant header, the same sampling;
* the floor: the same completion again with a fresh ``cache_salt``, so vLLM reuses no cached row and
  prefills all of it. Two exact prefills that differ only in which rows came from the prefix cache (so
  in the shapes of their matrix products) agree this often in the run's dtype: the most any mode can.

*repair W* (``--vllm-repair``): each window W on its own ``vllm serve`` whose ``auto`` is set (through
``LEYLINE_VLLM_AUTO``, :func:`repair_config`) to always amortize with a W-token window: the replacement
and the W tokens after it computed exactly in the edited context, the rest of the moved run rotated, no
threshold and no drift budget. That server scores it against its own exact prefill (no floor, no
questions to vLLM's own completions: the main server asks those once).

At the first token where a mode parts from the reference, the reference's margin there (its top
log-probability less its second, nats) says whether that was a near-tie.

Where the removed text supports a question (:mod:`.removed_content`), each mode's session is taken back
to the rows right after the edit (the next round and its reply deleted: a suffix, nothing recomputed)
and asked it (greedy, ``answer_tokens``, ending at the end of generation); vLLM's own completions answer
it from the edited history (*exact*) and from the unedited one (*F*: whether the model can answer at all).

The modes' tokens are compared one by one with the reference's, up to the first difference. The three
sessions share one server and vLLM's prefix cache, as sessions do in use: exact rows are shared (the
unedited history is prefilled once), rotated rows are salted per session. So a mode that runs after
another can find exact rows the other computed (auto finds amortize's replacement, forget auto's window):
*computed* is what vLLM computed for the directive on this server (``recomputed_tokens``, with auto's
``drift_repair_tokens``), *own* what the mode computes alone — the edited history's tokens neither
rotated nor in the session's own exact prefix before the edit (its whole 32-token blocks) — and the
share of forget's divides by forget's own (the edited history from the block the first change falls
in). Ids here are the plugin's rendering (its own tool-call text), so the token counts differ slightly
from the transformers arms', which render with the model's tool template.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

from leyline_sdk import LeylineClient
from leyline_sdk.diff import diff_messages
from leyline_sdk.protocol import Directive, Message, Span
from ..common.output import fmt, md_table
from ..common.stats import mean, percentile
from leyline_testkit.vllm_server import SERVED_MODEL_NAME, VllmServer
from .drift_oracle import diff
from .real_edits import RealEdit
from .real_modes import agreeing_prefix
from .removed_content import Question, answers

MODES = ("amortize", "auto", "forget")  # the main server's arms, each the SDK mode of its name
NEAR_TIE = 0.5  # nats between the reference's top two tokens: a margin bf16 rounding can close
BLOCK = 32  # the server's --block-size: the unit of vLLM's prefix cache
LABEL = "Leyline on vLLM"
ARM_ORDER = ("amortize", "repair", "auto", "forget")  # a table's rows: cheapest first, repairs by window


def repair_config(window: int) -> dict:
    """``LEYLINE_VLLM_AUTO`` for a repair arm: ``auto`` always amortizes with a ``window``-token exact window."""
    return {"signal_window": window, "forget_threshold": 1e9, "repair_threshold": None, "short_tail": 0,
            "repair_tail": 0, "drift_budget": None}


def repair_arm(window: int) -> str:
    return f"repair {window}"


def _arm_key(name: str) -> tuple[int, int]:
    kind, _, window = name.partition(" ")
    return ARM_ORDER.index(kind), int(window or 0)


class VllmPeer:
    """One plugin server for a run; ``record(edit)`` measures one edit under each of its arms.

    ``arms``: arm name -> the SDK mode its directive carries (default: :data:`MODES`); ``auto_config``:
    the server's ``LEYLINE_VLLM_AUTO``; ``main``: also the floor and vLLM's own answers to the question."""

    def __init__(self, folder: Path, workdir: Path, *, dtype: str, max_model_len: int, greedy_tokens: int,
                 answer_tokens: int, kv_gib: int = 4, arms: dict[str, str] | None = None,
                 auto_config: dict | None = None, main: bool = True):
        from transformers import AutoTokenizer
        from leyline_vllm.api_server.auto_edits import AUTO_CONFIG_ENV
        from leyline_vllm.api_server.template import ChatRenderer

        self.renderer = ChatRenderer(AutoTokenizer.from_pretrained(folder))
        self.greedy_tokens, self.answer_tokens = greedy_tokens, answer_tokens
        self.arms, self.auto_config, self.main = arms or {m: m for m in MODES}, auto_config, main
        env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_gib), "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}
        if auto_config is not None:
            env[AUTO_CONFIG_ENV] = json.dumps(auto_config)
        self.server = VllmServer(folder, workdir, plugin=True, dtype=dtype, max_model_len=max_model_len,
                                 block_size=BLOCK, env=env)

    def __enter__(self) -> "VllmPeer":
        self.server.start()
        self.client = LeylineClient(self.server.base_url, timeout=3600)
        self.http = httpx.Client(base_url=self.server.base_url, timeout=3600)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.http.close()
        self.server.stop()

    def describe(self) -> dict:
        splice = self.http.get("/healthz").json().get("splice")
        return {"cmd": self.server.cmd, "dtype": self.server.dtype, "startup_s": self.server.startup_s,
                "splice": splice, "auto_config": self.auto_config}

    def record(self, edit: RealEdit, question: Question | None = None) -> dict:
        old, new, turn = edit.history.messages, edit.messages, edit.history.next_turn
        old_ids, new_ids = self.renderer.ids(old), self.renderer.ids(new)
        first = diff(old_ids, new_ids).start
        t0 = time.perf_counter()
        asked = [Message(role="user", content=question.text)] if question else None
        runs = {}
        for arm, mode in self.arms.items():
            (directive,) = diff_messages(old, new, mode=mode)  # what the SDK sends: every edit kind is one span
            runs[arm] = self._mode(mode, old, directive, turn, len(new), asked)
        for run in runs.values():
            run["own"] = len(new_ids) - run["rotated"] - first // BLOCK * BLOCK
        exact = self._complete(new + list(turn), self.greedy_tokens, ignore_end=True)
        reference = exact["tokens"]
        if self.main:
            cold = self._complete(new + list(turn), self.greedy_tokens, ignore_end=True, salt=uuid.uuid4().hex)
            runs["floor"] = {"tokens": cold["tokens"]}
        for run in runs.values():
            run["greedy_same"], run["greedy_compared"] = agreeing_prefix(reference, run.pop("tokens"), set())
            if run["greedy_same"] < len(reference):
                run["parting_margin"] = exact["margins"][run["greedy_same"]]
        out = {"session": edit.history.session, "kind": edit.kind, "history_tokens": len(old_ids),
               "edited_tokens": len(new_ids), "forget_tokens": len(new_ids) - first, "modes": runs}
        replies = {arm: runs[arm].pop("answer") for arm in self.arms}
        if question and self.main:
            replies["exact"] = self._complete(new + asked, self.answer_tokens)["text"]
            replies["F"] = self._complete(list(old) + asked, self.answer_tokens)["text"]
        if question:
            out["question"] = {"kind": question.kind, "text": question.text, "answers": list(question.answers),
                               "replies": replies, "answered": {a: answers(question, t) for a, t in replies.items()}}
        return out | {"seconds": time.perf_counter() - t0}

    def _mode(self, mode: str, old: list[Message], directive: Directive, turn: list[Message], edited_messages: int,
              asked: list[Message] | None) -> dict:
        sid = f"drift-{mode}-{uuid.uuid4().hex[:12]}"
        self.client.create_session(old, session_id=sid)
        answer = None
        try:
            (outcome,) = self.client.apply(sid, [directive]).outcomes
            reply = self.client.generate(sid, list(turn), max_tokens=self.greedy_tokens,
                                         min_tokens=self.greedy_tokens, temperature=0, logprobs=True)
            if asked:
                # back to the rows right after the edit: the round and its reply go (a suffix: nothing recomputed)
                held = self.client.get_session(sid).num_messages
                self.client.apply(sid, [Directive(span=Span(start=edited_messages, end=held), mode="forget")])
                answer = _text(self.client.generate(sid, asked, max_tokens=self.answer_tokens, temperature=0).message)
        finally:
            self.client.delete_session(sid)
        auto = outcome.auto
        return {"applied": outcome.applied_mode, "fallback_reason": outcome.fallback_reason, "answer": answer,
                "recomputed": outcome.recomputed_tokens + (auto.drift_repair_tokens if auto else 0),
                "repaired": auto.repaired_tokens if auto else 0,
                "rotated": outcome.rotated_tokens, "reused": outcome.reused_tokens,
                "choice": auto.choice if auto else None, "reason": auto.reason if auto else None,
                "layer1_change": auto.layer1_change if auto else None,
                "turn_prefill": reply.usage.prefill_tokens, "turn_cached": reply.usage.cached_tokens,
                "tokens": [lp.token for lp in reply.logprobs or []]}

    def _complete(self, messages: list[Message], max_tokens: int, ignore_end: bool = False,
                  salt: str | None = None) -> dict:
        """vLLM's own greedy completion of the plugin's rendering of ``messages`` (no session): text, tokens
        and each position's margin (top log-probability less the second's); ``salt``: no cached rows used."""
        ids = self.renderer.ids(messages, generation_prompt=True)
        body = {"model": SERVED_MODEL_NAME, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2,
                "min_tokens": max_tokens if ignore_end else 0}
        if salt:
            body["cache_salt"] = salt
        r = self.http.post("/v1/completions", json=body)
        r.raise_for_status()
        lp = r.json()["choices"][0]["logprobs"]
        margins = [_margin(top) for top in lp["top_logprobs"]]
        return {"text": r.json()["choices"][0]["text"], "tokens": lp["tokens"], "margins": margins}


def _margin(top: dict | None) -> float | None:
    values = sorted((top or {}).values(), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def _text(message: Message) -> str:
    """A reply as the removed-content check reads it: its text and any tool call's arguments."""
    return " ".join([message.content or "", *(c.function.arguments for c in message.tool_calls or [])])


def merge(records: list[dict], other: list[dict]) -> None:
    """Add another server's arms on the same edits (a repair window's) to ``records``, edit by edit."""
    for r, o in zip(records, other, strict=True):
        if (r["session"], r["edited_tokens"]) != (o["session"], o["edited_tokens"]):
            raise ValueError(f"not the same edit: {r['session']} {r['edited_tokens']} vs {o['session']} "
                             f"{o['edited_tokens']}")
        r["modes"].update(o["modes"])
        if r.get("question"):
            for part in ("replies", "answered"):
                r["question"][part].update(o["question"][part])
        r["seconds"] += o["seconds"]


def summarise(records: list[dict], describe: dict | None, greedy_tokens: int) -> dict:
    if not records:
        return {"edits": 0}
    names = sorted((a for a in records[0]["modes"] if a != "floor"), key=_arm_key)
    forget = max(1, sum(r["modes"]["forget"]["own"] for r in records))
    arms = {}
    for m in names:
        runs = [r["modes"][m] for r in records]
        margins = [run["parting_margin"] for run in runs if run.get("parting_margin") is not None]
        arms[m] = {"share": sum(run["own"] for run in runs) / forget,
                   "computed_share": sum(run["recomputed"] for run in runs) / forget,
                   **_agreement(runs),
                   "applied": dict(Counter(run["applied"] for run in runs)),
                   "choices": dict(Counter(run["choice"] for run in runs if run["choice"])),
                   "fallbacks": dict(Counter(run["fallback_reason"] for run in runs if run["fallback_reason"])),
                   "parting_margin_p50": percentile(margins, 50), "parted_on_near_tie": mean([v < NEAR_TIE for v in margins])}
    if all("floor" in r["modes"] for r in records):  # a journal written before the floor was measured has none
        arms["floor"] = _agreement([r["modes"]["floor"] for r in records])
    asked = [r["question"] for r in records if r.get("question")]
    removed = {"questions": len(asked), "f_answers": sum(q["answered"]["F"] for q in asked),
               "answered": {a: sum(q["answered"][a] for q in asked) for a in ("F", "exact", *names)},
               "answered_where_f_does": {a: sum(q["answered"][a] for q in asked if q["answered"]["F"])
                                         for a in ("exact", *names)}}
    kinds = sorted({r["kind"] for r in records})
    by_kind = {k: {m: mean([r["modes"][m]["greedy_same"] == r["modes"][m]["greedy_compared"]
                            for r in records if r["kind"] == k]) for m in names} for k in kinds}
    return {"edits": len(records), "greedy_tokens": greedy_tokens, "server": describe, "arms": arms,
            "by_kind_greedy_identical": by_kind, "removed": removed, "edit_kinds": dict(Counter(r["kind"] for r in records)),
            "seconds_per_edit": mean([r["seconds"] for r in records])}


def _agreement(runs: list[dict]) -> dict:
    return {"greedy_identical": mean([run["greedy_same"] == run["greedy_compared"] for run in runs]),
            "greedy_prefix_mean": mean([run["greedy_same"] for run in runs]),
            "first_token_same": mean([run["greedy_same"] > 0 for run in runs])}


def markdown(s: dict | None) -> str:
    if not s or not s.get("edits"):
        return "" if not s or "skipped" not in s else f"{LABEL}: not run ({s['skipped']}).\n\n"
    server = s.get("server") or {}
    splice = server.get("splice") or {}
    names = [m for m in s["arms"] if m != "floor"]
    rows = [[m, a["share"], a["computed_share"], a["greedy_identical"], a["greedy_prefix_mean"], a["first_token_same"],
             a["parted_on_near_tie"], ", ".join(f"{k} {v}" for k, v in sorted((a["choices"] or a["applied"]).items()))]
            for m, a in s["arms"].items() if m != "floor"]
    if floor := s["arms"].get("floor"):
        rows.append(["floor: vLLM's exact prefill, no cached rows", "–", "–", floor["greedy_identical"],
                     floor["greedy_prefix_mean"], floor["first_token_same"], "–", "–"])
    kinds = [[k, *[v[m] for m in names]] for k, v in s["by_kind_greedy_identical"].items()]
    return (f"### {LABEL}: the same {s['edits']} edits through the plugin\n\n"
            f"`vllm serve` with the plugin ({server.get('dtype')}, spliced: {splice.get('supported')}, "
            f"{splice.get('kind')}, rotary {splice.get('rotary_dim')}), each mode against vLLM's own "
            f"`/v1/completions` on the edited history (no session): {s['greedy_tokens']} greedy tokens after the "
            "next round, compared up to the first difference. *own rows*: what the mode computes alone (the edited "
            "history's tokens neither rotated nor in its exact prefix's whole blocks; auto: with its exact window), "
            "as a share of forget's alone; *computed here*: what vLLM computed for the directive on the shared "
            "server, where a mode run later finds exact rows an earlier one computed (order: amortize, auto, "
            "forget). *floor*: the reference's completion again with a fresh `cache_salt` (every row prefilled): "
            "what two exact prefills agree on in this dtype. *parted on a near-tie*: of the replies that part "
            f"from the reference, those where its top two tokens were within {NEAR_TIE:g} nat. "
            + ("*repair W*: on its own `vllm serve` whose `auto` always amortizes with a W-token exact window "
               "(`LEYLINE_VLLM_AUTO`: `signal_window` W, `forget_threshold` 1e9, `short_tail` and `repair_tail` 0, "
               "no drift budget), scored against that server's own exact prefill. "
               if any(m.startswith("repair") for m in names) else "")
            + f"{fmt(s['seconds_per_edit'])} s per edit (all servers).\n\n"
            + md_table(["mode", "own rows (share of forget's)", "computed here", "greedy identical",
                        f"greedy agreeing prefix (mean, of {s['greedy_tokens']})", "first token same",
                        "parted on a near-tie", "applied / auto chose"], rows)
            + "\n\nGreedy continuation identical by edit kind (through vLLM):\n\n"
            + md_table(["kind", *names], kinds) + "\n\n" + _removed_markdown(s["removed"]))


def _removed_markdown(r: dict) -> str:
    if not r["questions"]:
        return ""
    rows = [[a, r["answered"][a], r["answered_where_f_does"].get(a, r["f_answers"])] for a in r["answered"]]
    return (f"Removed content through vLLM: {r['questions']} questions whose answer only the removed text held, "
            "each asked right after the edit (every mode's session taken back to its rows after the edit); "
            "*F*: vLLM's own completion on the unedited history, *exact*: on the edited one.\n\n"
            + md_table(["arm", "replies holding a removed value", f"of the {r['f_answers']} F answers"], rows)
            + "\n\n")
