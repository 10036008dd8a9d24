"""``leyline-bench traces``: real agent sessions replayed through the policies frameworks apply.

Each held-out mini-swe-agent session (``sessions.load``) is replayed call by call
(:mod:`.turns`): at every model call the history the policy makes of the session's raw history
(:mod:`.policies`) is sent with ``max_tokens=1``, then the session's real assistant message and
the next observation follow. Every (model, policy, arm) runs on a server of its own, started for
it and stopped after it (:mod:`.arms`): no arm, and no other policy, warms its cache. Sessions
run one after the other on that server. Measured per turn: the prompt tokens the engine computed,
the time to first token, the engine's prefill seconds; beside them the *floor* (:mod:`.floor`).
The Claude Code cache-break summary is turned into what each arm's rule would recompute per break
(:mod:`.breaks`: arithmetic on a summary, not a replay). Report: :mod:`.report`.

    .venv-vllm/bin/python -m leyline_bench.cli traces --out docs/perf/traces \
        --models qwen2.5-coder-0.5b,runtime --sessions 4 --cap 8192
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from ..common.arguments import comma_list
from .arms import ARMS, VLLM_BLOCK_SIZE
from .floor import prefix_cache_computed, stream_floors
from .models import MODELS, check_arms, load_model
from .policies import POLICIES, make_policy, parameters
from .turns import raw_calls, replay_policy


def add_parser(sub) -> None:
    p = sub.add_parser("traces")
    p.add_argument("--models", type=comma_list(MODELS), default=["qwen2.5-coder-0.5b", "runtime"],
                   help=f"comma list of {', '.join(MODELS)} (the first one's tokens measure --cap)")
    p.add_argument("--policies", type=comma_list(POLICIES), default=list(POLICIES),
                   help=f"comma list of {', '.join(POLICIES)}")
    p.add_argument("--arms", type=comma_list(ARMS), default=list(ARMS), help=f"comma list of {', '.join(ARMS)}")
    p.add_argument("--sessions", type=int, default=4, help="the first N held-out sessions (file order)")
    p.add_argument("--cap", type=int, default=8192,
                   help="context budget: calls are kept while the raw history holds at most this many tokens")
    p.add_argument("--max-turns", type=int, default=None, help="at most N calls per session")
    p.add_argument("--workdir", default=None, help="checkpoints + server logs (default: a temp folder)")
    p.add_argument("--resume", action="store_true",
                   help="keep the (model, policy, arm) runs a cut-short run with this --workdir finished")
    p.add_argument("--report-only", default=None, metavar="PARTIAL_JSON",
                   help="write the report from a run's <workdir>/traces-partial.json (saved after every arm) "
                        "without running anything")
    p.set_defaults(run=run, quick_overrides={"models": ["tiny-qwen3", "runtime"], "policies": ["langchain_clear"],
                                             "sessions": 2, "cap": 8192, "max_turns": 6})


def run(args) -> dict:
    from leyline_bench.sessions.load import load_sessions

    from .report import report

    if args.report_only:
        saved = json.loads(Path(args.report_only).read_text())
        return report(args.out, saved["result"], saved["samples"])
    check_arms(args.arms)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="leyline-bench-traces-"))
    sessions = load_sessions("heldout")[:args.sessions]
    models = [load_model(label, workdir, args.cap, args.arms) for label in args.models]
    reference = models[0]
    count = lambda history: len(reference.ids(history))  # noqa: E731
    raw = {s.instance_id: raw_calls(s.messages, count, args.cap, args.max_turns) for s in sessions}
    result = _new_result(args, reference.label, sessions, raw)
    samples: dict = {}
    partial_file = workdir / "traces-partial.json"
    if args.resume and partial_file.is_file():  # a run cut short: keep the arms it finished, run the rest
        saved = json.loads(partial_file.read_text())
        samples = saved["samples"]
        result["runs"] = [r for r in saved["result"]["runs"] if f"{r['model']}/{r['policy']}/{r['arm']}" in samples]
        result["resumed_from"] = saved["result"].get("run_command")
    for model in models:
        result["models"][model.label] = {"description": model.description, "arms": model.arms,
                                         "skipped": model.skipped}
        for policy_name in args.policies:
            policy = make_policy(policy_name, args.cap)
            result["policies"][policy_name] = parameters(policy)
            replays = [replay_policy(sid, calls, policy) for sid, calls in raw.items()]
            ids = [[model.ids(h) for h in r.sent] for r in replays]
            per_session = stream_floors(ids)
            floors = {r.instance_id: f for r, f in zip(replays, per_session)}
            # what plain vLLM's prefix cache computes by arithmetic, beside what it measures
            prefix = prefix_cache_computed(ids, VLLM_BLOCK_SIZE)
            result["prefix_cache_arithmetic"][f"{model.label}/{policy_name}"] = sum(map(sum, prefix))
            for arm_name in model.arms:
                if f"{model.label}/{policy_name}/{arm_name}" in samples:
                    continue
                run_record, turns = run_arm(model, arm_name, policy, replays, floors, workdir)
                result["runs"].append(run_record)
                samples[f"{model.label}/{policy_name}/{arm_name}"] = turns
                partial = {"result": {**result, "load_average": {**result["load_average"],
                                                                 "end": list(os.getloadavg())}},
                           "samples": samples}
                partial_file.write_text(json.dumps(partial))  # a crash loses no arm
    result["load_average"]["end"] = list(os.getloadavg())
    return report(args.out, result, samples)


def _new_result(args, reference: str, sessions, raw: dict) -> dict:
    from ..common.machine import command_line

    return {"run_command": command_line(), "cap": args.cap, "cap_tokens_of": reference, "max_turns": args.max_turns,
            "sessions": [{"instance_id": s.instance_id, "calls": len(raw[s.instance_id]),
                          "calls_in_session": sum(m.role == "assistant" for m in s.messages)} for s in sessions],
            "policies": {}, "models": {}, "runs": [], "prefix_cache_arithmetic": {},
            "load_average": {"start": list(os.getloadavg())}}


def run_arm(model, arm_name: str, policy, replays, floors: dict, workdir: Path,
            attempts: int = 3) -> tuple[dict, list[dict]]:
    """``_run_arm_once``, from the start on a fresh server again if its server dies (on a machine shared with
    other jobs the kernel's OOM killer may take it): a run resumed on another server would lose its cache."""
    for attempt in range(1, attempts + 1):
        try:
            record, turns = _run_arm_once(model, arm_name, policy, replays, floors, workdir / f"try{attempt}")
            record["attempts"] = attempt
            return record, turns
        except (RuntimeError, TimeoutError, OSError) as exc:
            if attempt == attempts:
                raise
            print(f"traces: {model.label} / {policy.name} / {arm_name} failed ({str(exc).splitlines()[0][:200]}); "
                  "rerun from the start", flush=True)
            time.sleep(120)
    raise AssertionError("unreachable")


def _run_arm_once(model, arm_name: str, policy, replays, floors: dict, workdir: Path) -> tuple[dict, list[dict]]:
    """One (model, policy, arm): a fresh server, every session in order, the server stopped."""
    arm = model.arm(arm_name, workdir / f"{model.label}-{policy.name}-{arm_name}")
    _wait_for_memory(getattr(arm, "memory_gib", 2.0))
    server_side = arm_name == "runtime" and policy.context_management is not None
    load_before = list(os.getloadavg())
    started = time.perf_counter()
    _start(arm)
    turns: list[dict] = []
    try:
        for replay in replays:
            arm.new_session(f"{policy.name}-{replay.instance_id}")
            for t, sent in enumerate(replay.sent):
                history = replay.raw[t] if server_side else sent
                res = arm.turn(history, context_management=policy.context_management if server_side else None)
                turns.append(_turn_record(model, replay, t, sent, res, floors, server_side))
            arm.end_session()
        description = arm.describe()
    finally:
        arm.stop()
    record = {"model": model.label, "policy": policy.name, "arm": arm_name, "server": description,
              "wall_s": time.perf_counter() - started, "load_average_before": load_before,
              "load_average_after": list(os.getloadavg()),
              "context_management": policy.context_management if server_side else None}
    print(f"traces: {model.label} / {policy.name} / {arm_name}: {sum(x['computed'] for x in turns)} tokens computed, "
          f"floor {sum(x['floor'] for x in turns)}, {record['wall_s']:.0f} s", flush=True)
    return record, turns


def _turn_record(model, replay, t: int, sent, res, floors: dict, server_side: bool) -> dict:
    expected = len(model.ids(sent))
    record = {"session": replay.instance_id, "turn": t, "computed": res.computed, "prompt": res.prompt,
              "expected_prompt": expected, "floor": floors[replay.instance_id][t], "latency_s": res.latency_s,
              "prefill_s": res.prefill_s, "edited": t in replay.edited_turns, **res.extra}
    if server_side:
        record["client_cleared"] = _cleared(replay.raw[t], sent)
    return record


def _cleared(raw, sent) -> int:
    """Tool results the client-side copy of the edit cleared (to compare with the server's report)."""
    return sum(1 for a, b in zip(raw, sent) if a.role == "tool" and a.content != b.content)


def _start(arm, attempts: int = 3, wait_s: float = 120.0) -> None:
    """Start the arm's server, again after a pause if it fails: on a machine shared with other jobs a start
    can find too little free memory for its KV cache (vLLM refuses to start then)."""
    for attempt in range(attempts):
        try:
            arm.start()
            return
        except (RuntimeError, TimeoutError) as exc:
            if attempt == attempts - 1:
                raise
            print(f"traces: {arm.name} did not start ({str(exc).splitlines()[0][:200]}); again in {wait_s:.0f} s",
                  flush=True)
            time.sleep(wait_s)


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def _wait_for_memory(gib: float, timeout_s: float = 7200.0) -> None:
    """Start a server only when the machine has the memory it needs (others' jobs share it): a server
    started short of memory gets itself, or another job, killed."""
    deadline = time.monotonic() + timeout_s
    while _available_gib() < gib and time.monotonic() < deadline:
        print(f"traces: waiting for {gib:.1f} GiB of free memory ({_available_gib():.1f} now)", flush=True)
        time.sleep(60)
