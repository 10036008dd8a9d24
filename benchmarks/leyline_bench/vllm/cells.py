"""``leyline-bench vllm``'s cells beyond the edits: a system prompt shared by many sessions, and what
the plugin costs requests that use none of it; with the HTTP helpers every cell uses.

* ``shared``: sessions whose histories start with the same system prompt and tool definitions.
  Plain vLLM (one cache salt for the whole cell, so no other cell's blocks help it) computes the
  common prefix once; Leyline salts each session's requests apart, so each session computes it
  again. Prompt tokens computed per arm, and time to first token.
* ``tax``: plain ``vllm serve`` (no plugin loaded) against the same server with the plugin, same
  checkpoint, chat requests without Leyline parameters, ``tokens`` generated per request at 1 and
  16 concurrent streams; every measurement sends the same number of requests (``requests``, split
  evenly over the streams), so one stream is measured over as much work as sixteen. Both servers are
  started once, one at a time; the one not measured is stopped with SIGSTOP (no CPU), and the arms
  alternate A/B, B/A, ... per repeat so drift on a shared machine falls on both. Median and spread
  of tokens/s per arm, and the paired ratios; beside them what the engine spends: the CPU seconds per
  request of the server's processes (API server, EngineCore, worker; ``/proc/<pid>/stat`` utime +
  stime over the measurement), per arm and paired, which other load on the machine hardly moves.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx

from leyline_sdk.protocol import Message
from leyline_sdk.tools_prompt import TOOLS_MESSAGE_ID, TOOLS_PREAMBLE

from ..common.output import md_table
from ..common.process_cpu import group_cpu_seconds
from leyline_testkit.vllm_server import SERVED_MODEL_NAME

CELLS = ("edits", "shared", "replay", "tax")
MODEL = SERVED_MODEL_NAME  # the name the bench server is started under
TAX_STREAMS = (1, 16)


def parse_cells(text: str) -> list[str]:
    """``--cells edits,tax`` -> the named cells in run order; unknown or no names are an error."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CELLS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"cells are a comma list of {', '.join(CELLS)}; got {text!r}")
    return [c for c in CELLS if c in names]


# -- HTTP ---------------------------------------------------------------------------------------

def post(base_url: str, body: dict, path: str = "/v1/chat/completions") -> dict:
    r = httpx.post(f"{base_url}{path}", json=body, timeout=900)
    r.raise_for_status()
    return r.json()


def complete(base_url: str, ids: list[int], salt: str | None = None) -> dict:
    """Plain vLLM: the same prompt tokens the plugin builds, no session, no plugin code on the path;
    ``salt`` keeps its prefix cache apart from every other arm's and cell's."""
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0}
    return post(base_url, {**body, "cache_salt": salt} if salt else body, "/v1/completions")


def cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def api_layout(messages: list[Message]) -> list[Message]:
    """The benchmark histories carry the tools block inside the system prompt (as the default
    model was trained); sent through an API it is Leyline's own tools message (the one message
    allowed to spell the call markers, ``leyline_sdk.tools_prompt``) before the system prompt,
    which is how the chat routes and the LangChain adapter lay a prompt out."""
    first = messages[0] if messages else None
    if first is None or first.role != "system" or TOOLS_PREAMBLE not in first.content:
        return messages
    prompt, tools = first.content.split(TOOLS_PREAMBLE, 1)
    head = [Message(role="system", content=TOOLS_PREAMBLE + tools, id=TOOLS_MESSAGE_ID)]
    if prompt.strip():
        head.append(Message(role="system", content=prompt.rstrip("\n")))
    return head + messages[1:]


def spread(values: list[float]) -> dict:
    """Median, extremes and (max - min) / median of repeated measurements."""
    mid = statistics.median(values)
    return {"median": mid, "min": min(values), "max": max(values),
            "rel_spread": (max(values) - min(values)) / mid if mid else None, "values": list(values)}


# -- shared system prompt -----------------------------------------------------------------------

def shared_prefix(tok, n_tokens: int) -> list[Message]:
    """The tools message and system prompt every session of the cell starts with, the system prompt
    lengthened by house rules until both together hold at least ``n_tokens`` tokens (the bundled
    runtime's count; one rule more at most)."""
    from ..common import agent_text

    head = api_layout([agent_text.system()])
    fixed = sum(len(tok.encode_message(m)) for m in head[:-1])
    rules, prompt = 0, head[-1]
    while fixed + len(tok.encode_message(prompt)) < n_tokens:
        rules += 1
        prompt = head[-1].model_copy(update={"content": head[-1].content + "".join(
            f"\nRule {i}: check every tool call's arguments against its schema before step {i} runs."
            for i in range(1, rules + 1))})
    return head[:-1] + [prompt]


def session_tails(sessions: int) -> list[list[Message]]:
    """Each session's own first turn: a different task of the shipped transcripts."""
    from ..common import agent_text

    return [agent_text.conversation(seed)[:1] for seed in range(sessions)]


def shared_prompt_cell(client, base_url: str, renderer, tok, *, sessions: int = 8, prefix_tokens: int = 1536) -> dict:
    prefix = shared_prefix(tok, prefix_tokens)
    cell_salt = f"shared-{time.monotonic_ns()}"
    arms: dict[str, list[dict]] = {"leyline": [], "vllm": []}
    for i, tail in enumerate(session_tails(sessions)):
        messages = prefix + tail
        for arm in (("vllm", "leyline") if i % 2 == 0 else ("leyline", "vllm")):
            started = time.perf_counter()
            if arm == "vllm":
                usage = complete(base_url, renderer.ids(messages, generation_prompt=True), cell_salt)["usage"]
                computed, prompt = usage["prompt_tokens"] - cached(usage), usage["prompt_tokens"]
            else:
                sid = f"shared-{i}-{time.monotonic_ns()}"
                reply = post(base_url, {"model": MODEL, "messages": [m.model_dump(exclude_none=True) for m in messages],
                                        "max_tokens": 1, "temperature": 0, "session_id": sid})
                computed, prompt = reply["leyline"]["prefilled_tokens"], reply["usage"]["prompt_tokens"]
                client.delete_session(sid)
            arms[arm].append({"latency_s": time.perf_counter() - started, "computed": computed, "prompt": prompt})
    out = {"sessions": sessions, "prefix_tokens": len(renderer.ids(prefix)), "arms": {}}
    for arm, samples in arms.items():
        out["arms"][arm] = {"computed_tokens": sum(s["computed"] for s in samples),
                            "prompt_tokens": sum(s["prompt"] for s in samples),
                            "ttft_s_median": statistics.median(s["latency_s"] for s in samples), "samples": samples}
    plain = out["arms"]["vllm"]["computed_tokens"]
    out["leyline_over_vllm_computed"] = out["arms"]["leyline"]["computed_tokens"] / plain if plain else None
    return out


# -- the unused plugin's tax ------------------------------------------------------------------------

def tax_schedule(repeats: int) -> list[tuple[int, str]]:
    """(repeat, arm) in run order: plain/plugin, then plugin/plain, ...: each arm goes first equally often."""
    order = []
    for r in range(repeats):
        order += [(r, arm) for arm in (("plain", "plugin") if r % 2 == 0 else ("plugin", "plain"))]
    return order


def throughput(base_url: str, streams: int, tokens: int, rounds: int, tag: str,
               cpu_seconds: Callable[[], float] | None = None) -> dict:
    """``streams`` clients each sending ``rounds`` chat requests in turn (no Leyline parameters,
    ``tokens`` generated each, EOS ignored): completion tokens per second of wall time and, with
    ``cpu_seconds`` (the server's processes' CPU time so far), the server's CPU seconds per request.

    A request whose kept-alive connection the server closed as it was sent (``RemoteProtocolError``,
    no response) is sent once more on a new connection; such resends are counted."""
    resent = [0] * streams

    def one_stream(s: int) -> int:
        done = 0
        with httpx.Client(timeout=900) as http:
            for k in range(rounds):
                body = {"model": MODEL, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"[{tag} {s}.{k}] Summarise the build log."}]}
                try:
                    r = http.post(f"{base_url}/v1/chat/completions", json=body)
                except httpx.RemoteProtocolError:
                    resent[s] += 1
                    r = http.post(f"{base_url}/v1/chat/completions", json=body)
                r.raise_for_status()
                done += r.json()["usage"]["completion_tokens"]
        return done

    cpu_before = cpu_seconds() if cpu_seconds else None
    started = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        generated = sum(pool.map(one_stream, range(streams)))
    wall = time.perf_counter() - started
    out = {"tokens_per_s": generated / wall, "generated": generated, "wall_s": wall, "resent": sum(resent)}
    if cpu_seconds:
        out["cpu_s"] = cpu_seconds() - cpu_before
        out["cpu_s_per_request"] = out["cpu_s"] / (streams * rounds)
    return out


def rounds_per_stream(requests: int, streams: int) -> int:
    """Requests each of ``streams`` clients sends so a measurement holds at least ``requests``."""
    return max(1, -(-requests // streams))


def tax_cell(model: Path, workdir: Path, *, repeats: int, tokens: int = 64, requests: int = 64,
             streams: tuple[int, ...] = TAX_STREAMS) -> dict:
    from leyline_testkit.vllm_server import VllmServer

    servers = {"plain": VllmServer(model, workdir / "serve-plain", plugin=False),
               "plugin": VllmServer(model, workdir / "serve-plugin")}
    runs: dict[str, dict[int, list[dict]]] = {arm: {n: [] for n in streams} for arm in servers}
    try:
        for arm, server in servers.items():  # one at a time: the other is paused while one starts
            server.start()
            throughput(server.base_url, 2, tokens, 1, f"warm {arm}")
            server.pause()
        for r, arm in tax_schedule(repeats):
            server = servers[arm]
            server.resume()
            for n in streams:
                runs[arm][n].append(throughput(server.base_url, n, tokens, rounds_per_stream(requests, n),
                                               f"{arm} r{r}", partial(group_cpu_seconds, server.proc.pid)))
            server.pause()
    finally:
        for server in servers.values():
            server.stop()
    out = {"repeats": repeats, "tokens_per_request": tokens, "requests_per_measurement": requests, "streams": {}}
    for n in streams:
        plain = [s["tokens_per_s"] for s in runs["plain"][n]]
        plugin = [s["tokens_per_s"] for s in runs["plugin"][n]]
        ratios = [b / a for a, b in zip(plain, plugin)]
        measured = runs["plain"][n] + runs["plugin"][n]
        cpu_plain = [s["cpu_s_per_request"] for s in runs["plain"][n]]
        cpu_plugin = [s["cpu_s_per_request"] for s in runs["plugin"][n]]
        cpu_ratios = [b / a for a, b in zip(cpu_plain, cpu_plugin)]
        out["streams"][str(n)] = {"plain": spread(plain), "plugin": spread(plugin), "plugin_over_plain": spread(ratios),
                                  "tax": 1 - statistics.median(ratios),
                                  "cpu_s_per_request": {"plain": spread(cpu_plain), "plugin": spread(cpu_plugin)},
                                  "cpu_plugin_over_plain": spread(cpu_ratios),
                                  "cpu_tax": statistics.median(cpu_ratios) - 1,
                                  "rounds_per_stream": rounds_per_stream(requests, n),
                                  "wall_s": spread([m["wall_s"] for m in measured]),
                                  "resent": sum(m["resent"] for m in measured)}
    return out


# -- report -------------------------------------------------------------------------------------------

def shared_markdown(cell: dict) -> list[str]:
    a = cell["arms"]
    rows = [[arm, a[arm]["prompt_tokens"], a[arm]["computed_tokens"], a[arm]["ttft_s_median"] * 1000]
            for arm in ("vllm", "leyline")]
    return [f"## {cell['sessions']} sessions sharing a {cell['prefix_tokens']}-token system prompt + tools", "",
            md_table(["arm", "prompt tokens (all sessions)", "computed tokens", "TTFT ms (median)"], rows), "",
            f"Leyline computed {cell['leyline_over_vllm_computed']:.2f}x the prompt tokens plain vLLM did "
            "(target: within 5%). Leyline's session requests carry no cache salt while their rows are exact "
            "(only requests that load rotated rows are salted), so the sessions share the common prefix "
            "through vLLM's own prefix cache, as plain vLLM's requests do, where that cache is on.", ""]


def tax_markdown(cell: dict) -> list[str]:
    cpu_rows = []
    for n, s in cell["streams"].items():
        if "cpu_tax" not in s:  # a run from before the CPU time was measured
            continue
        c, r = s["cpu_s_per_request"], s["cpu_plugin_over_plain"]
        ms = {arm: (c[arm]["median"] * 1000, f"{c[arm]['min'] * 1000:.1f}–{c[arm]['max'] * 1000:.1f}")
              for arm in ("plain", "plugin")}
        cpu_rows.append([n, *ms["plain"], *ms["plugin"], r["median"], f"{r['min']:.3f}–{r['max']:.3f}",
                         f"{s['cpu_tax']:+.1%}", f"{s['tax']:+.1%}"])
    cpu_lines = [] if not cpu_rows else [
        "What the engine spends: CPU seconds per request of the server's processes (API server, EngineCore, "
        "worker: `/proc/<pid>/stat` utime + stime over each measurement), the same measurements as below.", "",
        md_table(["streams", "plain vLLM CPU ms/request (median)", "range",
                  "with the plugin CPU ms/request (median)", "range", "plugin / plain (median of pairs)", "range",
                  "CPU tax", "wall-time tax (below)"], cpu_rows), ""]
    rows = []
    for n, s in cell["streams"].items():
        rows.append([n, s["plain"]["median"], f"{s['plain']['min']:.1f}–{s['plain']['max']:.1f}",
                     s["plugin"]["median"], f"{s['plugin']['min']:.1f}–{s['plugin']['max']:.1f}",
                     s["plugin_over_plain"]["median"],
                     f"{s['plugin_over_plain']['min']:.3f}–{s['plugin_over_plain']['max']:.3f}", f"{s['tax']:+.1%}",
                     s["wall_s"]["median"], s["resent"]])
    return [f"## The unused plugin's tax ({cell['tokens_per_request']} tokens per request, "
            f"{cell['requests_per_measurement']} requests per measurement, {cell['repeats']} paired repeats)", "",
            *cpu_lines,
            md_table(["streams", "plain vLLM tok/s (median)", "range", "with the plugin tok/s (median)", "range",
                      "plugin / plain (median of pairs)", "range", "tax", "s per measurement (median)",
                      "requests resent (server closed a kept-alive connection)"], rows), "",
            "Chat requests without Leyline parameters; the two servers were up one at a time (the other "
            "SIGSTOPped), arms alternating plain/plugin then plugin/plain. Tax = 1 − median paired ratio "
            "(issue 43's target: ≤ 3% at 1 and 16 streams).", ""]
