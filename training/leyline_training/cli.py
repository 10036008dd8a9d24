"""The flags of ``leyline-train train`` / ``evaluate`` (and ``python -m leyline_training.*``).

Kept free of torch so that building the parser (``--help``) stays instant; the
command line itself is :mod:`leyline_training.__main__`, which imports the
trainer and evaluator only when a command runs; they import this module,
never the other way round.
"""

from __future__ import annotations

import argparse

TRAIN_HELP = "train the embedded default model from scratch on local data (resumable, time budget)"
ARCHITECTURES = ("mla", "llama")  # leyline_training.architectures builds them
EVALUATE_HELP = ("held-out perplexity (vs the seeded random model) and agent-loop evaluation on test-split "
                 "synthetic tasks through the runtime")


def add_layout_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--order-share", type=float, default=0.0,
                    help="fraction of the tasks that are 'order' tasks (read a config and a price list, compute "
                         "a total: examples/langgraph_agent.py's kind of task; default 0: none)")
    ap.add_argument("--api-share", type=float, default=0.0,
                    help="fraction of the other tasks whose prompt starts the way API requests do (tools message, "
                         "then the system prompt; default 0: none)")
    ap.add_argument("--custom-tool-share", type=float, default=0.0,
                    help="fraction of the tasks that offer the caller's own tools, never seen before (a number "
                         "function, a create or lookup call; values copied from the request, names in Latin or "
                         "CJK script; sometimes forced with tool_choice; default 0: none)")


def add_train_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="run folder (checkpoint.pt, model/)")
    ap.add_argument("--arch", choices=ARCHITECTURES, default="mla",
                    help="mla: the bundled runtime's DeepSeek-V3 MLA model; llama: a GQA Llama of the same size "
                         "(6 query heads over 2 KV heads), served by vLLM and transformers, not by the bundled "
                         "runtime (default: %(default)s)")
    ap.add_argument("--minutes", type=float, default=70.0, help="time budget; the LR decays to it")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1,
                    help="rows of --seq-len per micro-batch (shorter curriculum phases take proportionally more rows)")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimiser step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="float32, or bfloat16 autocast for forward/backward; auto picks bfloat16 only where "
                         "the CPU has native bf16 matmuls (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--assistant-weight", type=float, default=2.0, help="loss weight of assistant tokens")
    ap.add_argument("--transcript-share", type=float, default=0.7, help="transcript fraction of the tokens")
    ap.add_argument("--drill-share", type=float, default=0.0,
                    help="fraction of the conversations that are copy/recall drills instead of agent tasks")
    ap.add_argument("--token-echo-share", type=float, default=0.0,
                    help="fraction of the conversations that are echo drills over random token ids: the clean "
                         "copying signal text drills lack (default 0: none)")
    ap.add_argument("--wide-share", type=float, default=0.0,
                    help="fraction of the tasks and drills whose entities have made-up names from a 4,000-word "
                         "pool, too many to memorise: names must be copied from the context (default 0: none)")
    ap.add_argument("--english-share", type=float, default=0.0,
                    help="fraction of the tasks and drills whose entities have real English names from a "
                         "2,997-word list (drawn with --wide-share's die: the two shares add; default 0: none)")
    ap.add_argument("--script-share", type=float, default=0.0,
                    help="fraction of the conversations that are copy drills in other writing systems (CJK, kana, "
                         "Hangul, Cyrillic, ...: an echo, or a custom-tool call whose name is in that script), "
                         "copied byte token by byte token (default 0: none)")
    add_layout_arguments(ap)
    ap.add_argument("--curriculum", default="1024:0.4",
                    help="shorter rows first: LEN:FRACTION[,...] of the budget, then --seq-len ('' = none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-minutes", type=float, default=5.0)
    ap.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the embedded default model's)")
    ap.add_argument("--export", default=None, help="also copy the final folder's files here")
    ap.add_argument("--init-from", default=None,
                    help="model folder whose weights (and config) start the run instead of a seeded random "
                         "init: how a later stage continues an earlier one (a checkpoint in --out wins)")
    ap.add_argument("--eval-transcripts", type=int, default=32, help="held-out transcripts scored at the end")


def add_evaluate_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default", help="model folder, or 'default' for the embedded model")
    ap.add_argument("--tasks", type=int, default=200, help="held-out tasks for the agent loop (0: skip)")
    ap.add_argument("--start", type=int, default=0, help="first test seed")
    ap.add_argument("--max-turns", type=int, default=8)
    add_layout_arguments(ap)
    ap.add_argument("--max-tokens", type=int, default=256, help="per assistant turn")
    ap.add_argument("--ppl-transcripts", type=int, default=64, help="test transcripts for perplexity (0: skip)")
    ap.add_argument("--drills", type=int, default=0,
                    help="copying probe: teacher-forced assistant top-1 on this many test drills of each kind "
                         "(echo, recall, compute; seconds, not minutes; 0: skip)")
    ap.add_argument("--script-calls", type=int, default=0,
                    help="names in other scripts: this many held-out custom-tool requests whose name is in CJK, "
                         "kana, Hangul, Cyrillic, ...; is it copied exactly into the call? (0: skip)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--records", action="store_true", help="keep per-task records in the JSON")
    ap.add_argument("--constrained", action="store_true",
                    help="decode with the chat route's grammar (only offered tools, schema-valid arguments)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: stdout only)")

