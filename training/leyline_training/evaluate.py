"""Evaluate a model folder on the held-out (test split) synthetic tasks.

Three measurements:

* **Held-out perplexity** — mean token cross-entropy on test-split
  transcripts (each scored alone, from position 0, tokenised exactly as the
  runtime does), for the model and for the seeded random-init model of the
  same config (``seeded_model(config)``); also on assistant tokens only.
* **Copying probe** (``--drills N``) — teacher-forced top-1 accuracy on the
  assistant tokens of ``N`` test-split drills of each kind (:mod:`.drills`):
  every such token is copied from the context, so this measures in seconds
  what task success needs and the agent loop only shows in minutes.
* **Names in other scripts** (``--script-calls N``) — ``N`` held-out custom-tool
  requests whose name is in another writing system (:mod:`.writing_systems`): does the
  model's first reply call the tool with the name copied exactly (and its first
  character right, which is what LangChain's unicode test checks)?
* **Agent loop** — ``generate(messages, tools) -> assistant Message`` (or raw
  assistant text) is driven through held-out tasks: the model's tool calls
  are executed by the generator's tools (:func:`.tools.execute`), results are
  appended as tool messages, until the model answers without a tool call or
  ``max_turns`` assistant turns pass. Reported: well-formed tool-call rate
  (blocks that parse *and* name a real tool with valid arguments / all
  ``<|tool_call|>`` blocks the model wrote), task success rate (``Task.check``
  on the final answer), mean assistant turns, per task kind.

``python -m leyline_training.evaluate --model PATH --tasks 200 --out eval.json``
(``--model default`` is the embedded default model) drives the real runtime
(:class:`leyline_runtime.runtime.Runtime`, greedy decoding, paged KV cache).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from leyline_sdk.protocol import Message

from leyline_runtime.text import chat_template as tpl
from leyline_runtime.text.tokenizer import ChatTokenizer
from .cli import EVALUATE_HELP, add_evaluate_arguments
from .corpus import CLS_ASSISTANT, transcript_tokens
from .custom_tools import make_custom_tool_task
from .drills import DRILL_KINDS, drill_of_kind
from .tools import execute, validate_call
from .transcripts import Task, TaskMix, make_task, make_transcript
from .writing_systems import SCRIPT_BLOCKS

Generate = Callable[[list[Message], list[dict]], "Message | str"]


# --------------------------------------------------------------------------- perplexity


@torch.no_grad()
def heldout_loss(model, tok: ChatTokenizer, n: int = 64, max_len: int = 2048, start: int = 0) -> dict:
    """Mean CE per token (all tokens / assistant tokens) on test-split transcripts."""
    was_training = model.training
    model.eval()
    tot = tot_a = 0.0
    cnt = cnt_a = 0
    for seed in range(start, start + n):
        ids, cls = transcript_tokens(tok, make_transcript(seed, "test").messages)
        ids, cls = ids[:max_len + 1], cls[:max_len + 1]
        t = torch.tensor([ids])
        logits = model(t[:, :-1]).float()
        ce = F.cross_entropy(logits[0], t[0, 1:], reduction="none")
        mask = torch.tensor(cls[1:]) == CLS_ASSISTANT
        tot += ce.sum().item()
        cnt += ce.numel()
        tot_a += ce[mask].sum().item()
        cnt_a += int(mask.sum())
    model.train(was_training)
    loss, loss_a = tot / cnt, tot_a / max(cnt_a, 1)
    return {"loss": loss, "ppl": math.exp(loss), "assistant_loss": loss_a, "assistant_ppl": math.exp(loss_a),
            "tokens": cnt, "assistant_tokens": cnt_a, "transcripts": n}


def compare_perplexity(model_path: str | None, n: int = 64, seed: int = 0) -> dict:
    """Trained model vs the seeded random-init model of the same config."""
    from leyline_runtime.model.default import DEFAULT_MODEL_DIR
    from .architectures import config_dict, folder_arch, from_config_dict, load_trained

    folder = Path(model_path) if model_path else DEFAULT_MODEL_DIR
    tok = ChatTokenizer.from_file(folder / "tokenizer.json")
    model = load_trained(folder)
    random_model = from_config_dict(folder_arch(folder), config_dict(model), seed).eval()
    trained, rand = heldout_loss(model, tok, n), heldout_loss(random_model, tok, n)
    return {"trained": trained, "random_init": rand, "loss_ratio": trained["loss"] / rand["loss"],
            "uniform_loss": math.log(model.config.vocab_size)}


@torch.no_grad()
def drill_accuracy(model, tok: ChatTokenizer, n: int = 12) -> dict:
    """Per drill kind: share of assistant tokens whose greedy prediction is the copied token."""
    was_training = model.training
    model.eval()
    out = {}
    for kind in DRILL_KINDS:
        right = total = 0
        for seed in range(n):
            ids, cls = transcript_tokens(tok, drill_of_kind(kind, seed, "test"))
            t = torch.tensor([ids])
            predicted = model(t[:, :-1])[0].argmax(-1)
            mask = torch.tensor(cls[1:]) == CLS_ASSISTANT
            right += int((predicted == t[0, 1:])[mask].sum())
            total += int(mask.sum())
        out[kind] = {"top1": right / total, "tokens": total, "drills": n}
    model.train(was_training)
    return out


def _script_of(text: str) -> str:
    return next((s for s, (lo, hi) in SCRIPT_BLOCKS.items() if text and lo <= ord(text[0]) <= hi), "other")


def script_calls(generate: Generate, n: int) -> dict:
    """Per script: share of first replies whose call copies the name exactly / its first character."""
    by_script: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples = []
    for seed in range(n):
        task = make_custom_tool_task(random.Random(f"script-call:test:{seed}"), "test", foreign=True)
        want = json.loads(task.solution[0].tool_calls[0].function.arguments)
        (key, name), = ((k, v) for k, v in want.items() if k != "description")
        msg, _ = _as_message(generate(list(task.messages), [t.spec for t in task.tools]))
        got = ""
        if msg.tool_calls:
            try:
                got = str(json.loads(msg.tool_calls[0].function.arguments).get(key, ""))
            except ValueError:
                pass
        counts = by_script[_script_of(name)]
        counts.update(calls=1, exact=got == name, first_character=bool(got) and got[0] == name[0])
        if len(examples) < 8:
            examples.append({"name": name, "got": got})
    total = sum(by_script.values(), collections.Counter())
    rates = {s: {"calls": c["calls"], "exact": c["exact"] / c["calls"],
                 "first_character": c["first_character"] / c["calls"]} for s, c in sorted(by_script.items())}
    return {"calls": n, "exact": total["exact"] / max(n, 1), "first_character": total["first_character"] / max(n, 1),
            "by_script": rates, "examples": examples}


# --------------------------------------------------------------------------- agent loop


def _as_message(out) -> tuple[Message, int]:
    """The assistant message and how many ``<|tool_call|>`` blocks its text held."""
    if isinstance(out, str):
        parsed = tpl.parse_assistant(out, call_id_prefix="call_eval")
        msg = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls or None)
        return msg, len(parsed.tool_calls) + len(parsed.malformed)
    # A runtime-parsed message: malformed blocks stay in the content, verbatim.
    return out, len(out.tool_calls or []) + out.content.count(tpl.TOOL_CALL)


def run_task(task: Task, generate: Generate, max_turns: int = 8) -> dict:
    messages = list(task.messages)
    attempted = well_formed = turns = 0
    answer, error, finished = None, None, False
    for _ in range(max_turns):
        try:
            msg, blocks = _as_message(generate(list(messages), task.tools))
        except Exception as exc:  # noqa: BLE001 -- a runtime error fails the task and is reported
            error = f"{type(exc).__name__}: {exc}"
            break
        turns += 1
        attempted += blocks
        messages.append(msg)
        if not msg.tool_calls:
            if blocks:  # only malformed calls: the model meant to call a tool and failed
                answer = msg.content
                break
            answer, finished = msg.content, True
            break
        for call in msg.tool_calls:
            if validate_call(call.function.name, call.function.arguments, task.tools) is None:
                well_formed += 1
            result = execute(task.world, call.function.name, call.function.arguments)
            messages.append(Message(role="tool", content=result, tool_call_id=call.id, name=call.function.name))
    success = finished and task.check(answer or "")
    return {"task_id": task.task_id, "kind": task.kind, "expected": task.expected, "answer": answer,
            "success": success, "finished": finished, "turns": turns, "tool_calls_attempted": attempted,
            "tool_calls_well_formed": well_formed, "error": error,
            "transcript_tokens_hint": sum(len(m.content) for m in messages)}


def run_agent_eval(generate: Generate, n_tasks: int = 200, max_turns: int = 8, start: int = 0,
                   split: str = "test", progress: Callable[[str], None] | None = None,
                   mix: TaskMix = TaskMix()) -> dict:
    records = []
    t0 = time.time()
    for i, seed in enumerate(range(start, start + n_tasks)):
        task = make_task(seed, split, mix=mix)
        rec = run_task(task, generate, max_turns)
        records.append(rec)
        if progress and ((i + 1) % 10 == 0 or i + 1 == n_tasks):
            ok = sum(r["success"] for r in records)
            progress(f"{i + 1}/{n_tasks} tasks, {ok} solved, {time.time() - t0:.0f}s")
    attempted = sum(r["tool_calls_attempted"] for r in records)
    well = sum(r["tool_calls_well_formed"] for r in records)
    by_kind: dict[str, dict] = collections.defaultdict(lambda: {"tasks": 0, "success": 0})
    for r in records:
        by_kind[r["kind"]]["tasks"] += 1
        by_kind[r["kind"]]["success"] += int(r["success"])
    return {
        "split": split, "tasks": len(records), "seeds": [start, start + n_tasks],
        "well_formed_tool_call_rate": well / attempted if attempted else None,
        "tool_calls_attempted": attempted, "tool_calls_well_formed": well,
        "task_success_rate": sum(r["success"] for r in records) / len(records),
        "finished_rate": sum(r["finished"] for r in records) / len(records),
        "mean_turns": sum(r["turns"] for r in records) / len(records),
        "errors": sum(r["error"] is not None for r in records),
        "by_kind": {k: {**v, "success_rate": v["success"] / v["tasks"]} for k, v in sorted(by_kind.items())},
        "seconds": time.time() - t0,
        "records": records,
    }


def oracle_generate(task_lookup: dict[str, list[Message]] | None = None) -> Generate:
    """A reference ``generate`` that replays the worked solution (for testing the harness)."""

    def gen(messages: list[Message], tools: list[dict]) -> Message:
        user = next(m.content for m in messages if m.role == "user")
        solution = task_lookup[user]
        n_assistant = sum(1 for m in messages if m.role == "assistant")
        return [m for m in solution if m.role == "assistant"][n_assistant]

    return gen


class RuntimeGenerator:
    """``generate`` over a :class:`~leyline_runtime.runtime.Runtime` session (greedy).

    Keeps one session per conversation: when the new history extends the
    session's, only the new messages are appended (prefilled); otherwise a
    fresh session is created.
    """

    def __init__(self, runtime, max_tokens: int = 256, constrained: bool = False):
        self.runtime = runtime
        self.max_tokens = max_tokens
        # constrained: the chat route's grammar (calls name offered tools, arguments match their schemas)
        self.grammars = None
        if constrained:
            from leyline_runtime.engine.grammar import GrammarCompiler

            self.grammars = GrammarCompiler(runtime.tokenizer)
        self.session_id: str | None = None
        self.history: list[Message] = []

    def __call__(self, messages: list[Message], tools: list[dict]) -> Message:
        from leyline_sdk.protocol import GenerateRequest, SessionCreate

        n = len(self.history)
        extends = (self.session_id is not None and len(messages) >= n
                   and all(a.fingerprint() == b.fingerprint() for a, b in zip(self.history, messages[:n])))
        if extends:
            new = messages[n:]
        else:
            self.close()
            info = self.runtime.create_session(SessionCreate(messages=[]))
            self.session_id, new = info.session_id, messages
        request = GenerateRequest(messages=new, max_tokens=self.max_tokens, temperature=0.0,
                                  tools=tools if self.grammars is not None else None)
        processors = None
        if self.grammars is not None:
            from leyline_runtime.server.constraints import native_processors

            processors = native_processors(request, self.runtime.tokenizer, self.grammars)
        resp = self.runtime.generate(self.session_id, request, processors=processors)
        self.history = list(messages) + [resp.message]
        return resp.message

    def close(self) -> None:
        if self.session_id is not None:
            try:
                self.runtime.delete_session(self.session_id)
            except Exception:  # noqa: BLE001,S110 -- already gone (evicted) is fine
                pass
            self.session_id, self.history = None, []


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m leyline_training.evaluate", description=EVALUATE_HELP)
    add_evaluate_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    path = None if args.model == "default" else args.model
    result: dict = {"model": args.model}

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.ppl_transcripts:
        result["perplexity"] = compare_perplexity(path, args.ppl_transcripts)
        p = result["perplexity"]
        log(f"held-out loss {p['trained']['loss']:.3f} (ppl {p['trained']['ppl']:.2f}) vs random "
            f"{p['random_init']['loss']:.3f}; assistant tokens {p['trained']['assistant_loss']:.3f} vs "
            f"{p['random_init']['assistant_loss']:.3f}")
    if args.drills:
        from leyline_runtime.model.default import DEFAULT_MODEL_DIR
        from .architectures import load_trained

        folder = Path(path) if path else DEFAULT_MODEL_DIR
        result["copying"] = drill_accuracy(load_trained(folder), ChatTokenizer.from_file(folder / "tokenizer.json"),
                                           args.drills)
        log("copying probe (assistant top-1 on test drills): " + ", ".join(
            f"{kind} {v['top1']:.3f}" for kind, v in result["copying"].items()))
    if args.tasks or args.script_calls:
        from leyline_runtime.runtime import Runtime, RuntimeConfig
        from .architectures import folder_arch

        if path and folder_arch(path) != "mla":
            raise SystemExit(f"{path} holds a {folder_arch(path)} model: the agent tasks run on the bundled runtime, "
                             "which serves MLA models only (serve it with vLLM and Leyline's plugin instead); "
                             "--ppl-transcripts and --drills work on it")

        runtime = Runtime(RuntimeConfig(model_path=path))
        gen = RuntimeGenerator(runtime, max_tokens=args.max_tokens, constrained=args.constrained)
        result["constrained"] = args.constrained
    if args.script_calls:
        result["script_calls"] = script_calls(gen, args.script_calls)
        gen.close()
        sc = result["script_calls"]
        log(f"names in other scripts: exact {sc['exact']:.1%}, first character {sc['first_character']:.1%} "
            f"of {sc['calls']}")
    if args.tasks:
        mix = TaskMix(args.order_share, args.api_share, args.custom_tool_share)
        agent = run_agent_eval(gen, args.tasks, args.max_turns, args.start, progress=log, mix=mix)
        gen.close()
        if not args.records:
            agent.pop("records")
        result["agent"] = agent
        wf = agent["well_formed_tool_call_rate"]
        log(f"well-formed tool calls {wf if wf is None else f'{wf:.1%}'}, task success "
            f"{agent['task_success_rate']:.1%}, mean turns {agent['mean_turns']:.2f}")
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
