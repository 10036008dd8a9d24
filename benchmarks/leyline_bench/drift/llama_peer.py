"""The peer on the same edits: llama.cpp's ``llama-server --cache-reuse`` serving the GGUF the weights came from.

Per edit, on one slot (:mod:`..common.llama_server`): the unedited history is prefilled (the slot holds it,
as after the agent's previous call), then the edited history and the next turn are sent with the cache on
— llama.cpp keeps the common prefix and shifts the chunks of at least 256 tokens it finds again, the
K-shift being the RoPE rotation amortize applies — and again with the cache off (its own exact prefill).
Both decode the same number of greedy tokens (end of generation ignored, as the transformers arms do).

What llama.cpp can reuse (read from its server's reuse loop, ``tools/server/server-context.cpp``, and seen
here): after the common prefix it advances through the new prompt only where a cached chunk of at least
``--cache-reuse`` tokens continues it *at that point*. A dropped span (a pure deletion) is skipped and the
rest shifted; an edit that writes anything in place — a placeholder, a truncation marker, a summary —
leaves the new prompt's next tokens unmatched, and the whole tail is recomputed.

Measured: history tokens it recomputed (its prompt tokens computed less the next turn's, which every arm
computes) as a share of forget's, and its greedy tokens against its own exact prefill's. llama.cpp runs
the Q4_K_M weights, Leyline's arms their bf16 dequantization: each is compared with its own exact
prefill, never with the other's.
"""

from __future__ import annotations

import time

from ..common.llama_server import LlamaServer
from ..common.output import md_table
from ..common.stats import mean
from .drift_oracle import diff
from .real_edits import RealEdit, Renderer
from .real_modes import agreeing_prefix

LABEL = "llama.cpp --cache-reuse 256"


def peer_record(server: LlamaServer, render: Renderer, edit: RealEdit, greedy_tokens: int) -> dict | None:
    old, new = edit.history.tokens, render.ids(edit.messages)
    turn = render.appended(edit.messages, edit.history.next_turn)
    if turn is None:
        return None
    t0 = time.perf_counter()
    server.complete(old, n_predict=1)
    cached = server.complete(new + turn, n_predict=greedy_tokens, ignore_eos=True)
    exact = server.complete(new + turn, n_predict=greedy_tokens, cache_prompt=False, ignore_eos=True)
    same, compared = agreeing_prefix(exact["tokens"], cached["tokens"], render.stop_ids())
    forget = len(new) - diff(old, new).start
    recomputed = max(0, cached["timings"]["prompt_n"] - len(turn))
    return {"session": edit.history.session, "kind": edit.kind, "forget_tokens": forget, "turn_tokens": len(turn),
            "prompt_tokens": len(new) + len(turn), "recomputed": recomputed, "reused": cached["timings"]["cache_n"],
            "exact_computed": exact["timings"]["prompt_n"], "greedy_same": same, "greedy_compared": compared,
            "first_token_same": cached["tokens"][:1] == exact["tokens"][:1], "seconds": time.perf_counter() - t0}


def summarise(peer: list[dict], leyline: list[dict], greedy_tokens: int,
              modes: tuple[str, ...] = ("amortize", "auto", "forget")) -> dict:
    """The peer's totals beside Leyline's modes on the same edits (matched by session and kind, in order);
    the peer alone where the transformers arms did not run (``leyline`` empty)."""
    if not peer:
        return {"edits": 0}
    keyed = {}
    for r in leyline:
        keyed.setdefault((r["session"], r["kind"]), []).append(r)
    pairs = ([(p, keyed[(p["session"], p["kind"])].pop(0)) for p in peer if keyed.get((p["session"], p["kind"]))]
             if leyline else [(p, None) for p in peer])
    forget = max(1, sum(p["forget_tokens"] for p, _ in pairs))
    rows = {LABEL: _row([p for p, _ in pairs], forget)}
    for m in modes if leyline else ():
        rows[f"Leyline {m}"] = _row([r["modes"][m] | {"first_token_same": r["modes"][m]["greedy_same"] > 0}
                                     for _, r in pairs], forget)
    # the check that "cache off" is an exact prefill: llama.cpp computed every prompt token
    whole = all(p["exact_computed"] == p["prompt_tokens"] for p, _ in pairs)
    return {"edits": len(pairs), "greedy_tokens": greedy_tokens, "exact_prefill_computed_every_token": whole,
            "arms": rows}


def _row(runs: list[dict], forget_tokens: int) -> dict:
    return {"share": sum(r["recomputed"] for r in runs) / forget_tokens,
            "greedy_identical": mean([r["greedy_same"] == r["greedy_compared"] for r in runs]),
            "greedy_prefix_mean": mean([r["greedy_same"] for r in runs]),
            "first_token_same": mean([bool(r["first_token_same"]) for r in runs])}


def markdown(s: dict | None) -> str:
    if not s:
        return ""
    if "skipped" in s:
        return f"{LABEL}: not run ({s['skipped']}).\n\n"
    if not s["edits"]:
        return ""
    greedy_tokens = s["greedy_tokens"]
    rows = [[arm, r["share"], r["greedy_identical"], r["greedy_prefix_mean"], r["first_token_same"]]
            for arm, r in s["arms"].items()]
    return (f"The peer on the same {s['edits']} edits: {LABEL} on the GGUF the weights came from, each arm against its own exact "
            "prefill (llama.cpp's with its cache off, Leyline's the bf16 transformers prefill). *history "
            "recomputed*: prompt tokens computed less the next turn's, as a share of forget's. llama.cpp reuses the "
            "tail only where the new prompt continues with it right at the edit (a drop); an edit that writes "
            "anything in place (a placeholder, a truncation marker, a summary) makes it recompute the tail.\n\n"
            + md_table(["arm", "history recomputed (of forget's)", "greedy identical",
                        f"greedy agreeing prefix (mean, of {greedy_tokens})", "first token same"], rows)
            + f"\n\nllama.cpp's cache-off prefill computed every prompt token: "
            f"{'yes' if s['exact_prefill_computed_every_token'] else 'no'}.\n\n")
