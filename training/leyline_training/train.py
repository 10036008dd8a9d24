"""Train the embedded default model from scratch on CPU, within a time budget.

    python -m leyline_training.train --out runs/default --minutes 70

* Model: ``--arch mla`` (default) ``leyline_runtime.model.default_config(vocab)``
  (DeepSeek-V3 MLA, dense, ~13M parameters, tied embeddings), initialised by
  ``seeded_model``; ``--arch llama`` a GQA Llama of the same size
  (:mod:`.architectures`).
* Data: :class:`.corpus.Packer` shards (transcripts, ``--drill-share`` of them copy/recall
  drills and ``--token-echo-share`` echo drills over random token ids (:mod:`.drills`),
  + stdlib, ``seq_len``
  rows); a sequence-length curriculum (default ``--curriculum 1024:0.4``:
  1024-token rows for the first 40 % of the budget, then ``--seq-len``
  2048, so 2k-token agent histories are in distribution). Tokens per
  optimiser step stay ``batch * seq_len`` in every phase.
* Optimiser: AdamW (no decay on norms and embeddings), linear warmup, then a
  cosine decay driven by the *fraction of the time budget used*, so the LR
  reaches its floor exactly when the budget runs out. ``--max-steps`` adds a
  step-based budget (whichever ends first).
* Precision: fp32 weights; ``--dtype bfloat16`` runs forward/backward under CPU
  bf16 autocast. ``auto`` (default) picks bfloat16 where the CPU has native bf16
  matmul (AVX512-BF16 / AMX) and fp32 elsewhere (AVX2-only CPUs emulate bf16
  matmuls several times slower than fp32).
* Checkpoints ``out/checkpoint.pt`` (model, optimiser, step, data position,
  elapsed time) every ``--checkpoint-minutes``; a rerun resumes from it.
* At the end: ``out/model/`` = ``config.json`` + ``model.safetensors`` (bf16) +
  ``tokenizer.json`` (+ ``tokenizer_config.json`` with the chat template for
  ``llama``; + ``training.json``); ``--export DIR`` copies them there (e.g.
  ``leyline_runtime/default_model``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from leyline_runtime.model.default import DEFAULT_MODEL_DIR
from leyline_runtime.text.tokenizer import ChatTokenizer
from .architectures import arch_of, config_dict, folder_arch, from_config_dict, load_trained, new_model, save_trained
from .cli import add_train_arguments
from .corpus import DataMix, Packer, loss_weights
from .evaluate import heldout_loss

DEFAULT_TOKENIZER = DEFAULT_MODEL_DIR / "tokenizer.json"
CHECKPOINT = "checkpoint.pt"


def native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))


def parse_curriculum(spec: str | None, final_len: int) -> list[tuple[float, int]]:
    """``"512:0.2,1024:0.5"`` -> [(0.2, 512), (0.5, 1024), (1.0, final_len)] (budget fraction ends)."""
    phases = []
    if spec:
        for part in spec.split(","):
            length, until = part.split(":")
            phases.append((float(until), int(length)))
    phases.append((1.0, final_len))
    return phases


def lr_at(step: int, progress: float, *, lr: float, warmup: int, min_ratio: float) -> float:
    warm = min(1.0, (step + 1) / max(1, warmup))
    progress = min(max(progress, 0.0), 1.0)
    return lr * warm * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def weighted_loss(model: torch.nn.Module, tokens: torch.Tensor, weights: torch.Tensor,
                  autocast_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted mean CE for the gradient, plain mean CE over the scored targets for the log).

    Targets of weight 0 (token-echo drills' random user ids) are left out of the logged mean: their
    CE stays near log(vocab) by construction and would hide what the model learns.
    """
    x, y = tokens[:, :-1], tokens[:, 1:]
    if autocast_dtype is not None:
        with torch.autocast("cpu", dtype=autocast_dtype):
            logits = model(x)
    else:
        logits = model(x)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    scored = w > 0
    return (ce * w).sum() / w.sum(), ce[scored].mean().detach()


class DataStream:
    """Batches from consecutive shards; the position is ``(shard, row)``."""

    def __init__(self, packer: Packer, shard: int = 0, row: int = 0):
        self.packer, self.shard_index, self.row = packer, shard, row
        self._shard = None
        self.transcript_tokens = self.text_tokens = 0

    def next(self, batch: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        if self._shard is not None and (self._shard.seq_len != seq_len or self.row + batch > len(self._shard.tokens)):
            self.shard_index, self.row, self._shard = self.shard_index + 1, 0, None
        if self._shard is None:
            self._shard = self.packer.shard(self.shard_index, seq_len)
            if self.row + batch > len(self._shard.tokens):
                self.shard_index, self.row = self.shard_index + 1, 0
                self._shard = self.packer.shard(self.shard_index, seq_len)
            self.transcript_tokens += self._shard.transcript_tokens
            self.text_tokens += self._shard.text_tokens
        rows = slice(self.row, self.row + batch)
        self.row += batch
        return self._shard.tokens[rows], self._shard.classes[rows]


def _save_checkpoint(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


@dataclasses.dataclass
class _Progress:
    """What a checkpoint carries besides the weights: where training is and what it logged."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    history: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Window:
    """Throughput and loss since the last log line."""

    tokens: int = 0
    seconds: float = 0.0
    loss: float = 0.0
    steps: int = 0


class _Loop:
    """The optimiser loop: steps, logging and checkpoints over one model, optimiser and data stream."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, stream: DataStream,
                 done: _Progress, ckpt_path: Path, *, seq_len: int, batch: int, accum: int, grad_clip: float,
                 assistant_weight: float, autocast_dtype: torch.dtype | None, ckpt_args: dict):
        self.model, self.opt, self.stream, self.done, self.ckpt_path = model, opt, stream, done, ckpt_path
        self.seq_len, self.batch, self.accum, self.grad_clip = seq_len, batch, accum, grad_clip
        self.assistant_weight, self.autocast_dtype, self.ckpt_args = assistant_weight, autocast_dtype, ckpt_args

    def checkpoint(self) -> None:
        done = self.done
        _save_checkpoint(self.ckpt_path, {
            "model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "step": done.step,
            "tokens": done.tokens, "elapsed": done.elapsed, "data": (self.stream.shard_index, self.stream.row),
            "arch": arch_of(self.model), "config": config_dict(self.model), "history": done.history,
            "args": self.ckpt_args})

    def step(self, cur_len: int, cur_lr: float) -> tuple[float, int]:
        """One optimiser step at ``cur_len``-token rows: (mean logged loss, tokens trained on)."""
        for g in self.opt.param_groups:
            g["lr"] = cur_lr
        self.opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        rows_per_micro = max(1, self.batch * self.seq_len // cur_len)  # same tokens per step in every phase
        for _ in range(self.accum):
            rows, classes = self.stream.next(rows_per_micro, cur_len)
            tokens = torch.from_numpy(rows.astype(np.int64))
            weights = torch.from_numpy(loss_weights(classes, self.assistant_weight))
            loss, plain = weighted_loss(self.model, tokens, weights, self.autocast_dtype)
            (loss / self.accum).backward()
            loss_sum += plain.item() / self.accum
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        return loss_sum, rows_per_micro * self.accum * cur_len

    def run(self, phases: list[tuple[float, int]], budget_s: float, max_steps: int | None, lr_of,
            log_every: int, checkpoint_minutes: float, log, minutes: float) -> str:
        """Steps until the budget (time, or ``max_steps``) is spent; the reason training stopped."""
        done = self.done
        t_last, last_ckpt, win = time.perf_counter(), done.elapsed, _Window()
        while True:
            progress = done.elapsed / budget_s
            if max_steps is not None:
                progress = max(progress, done.step / max_steps)
            if progress >= 1.0:
                return "max_steps" if max_steps is not None and done.step >= max_steps else "budget"
            cur_len = next(length for until, length in phases if progress < until)
            cur_lr = lr_of(done.step, progress)
            loss_sum, n_tok = self.step(cur_len, cur_lr)
            done.step += 1
            done.tokens += n_tok
            now = time.perf_counter()
            dt, t_last = now - t_last, now
            done.elapsed += dt
            win = _Window(win.tokens + n_tok, win.seconds + dt, win.loss + loss_sum, win.steps + 1)
            if not math.isfinite(loss_sum):
                log(f"step {done.step}: loss is {loss_sum}; stopping")
                return "non-finite loss"
            if done.step % log_every == 0 or done.step == 1:
                rec = {"step": done.step, "tokens": done.tokens, "loss": win.loss / win.steps, "lr": cur_lr,
                       "tok_s": win.tokens / win.seconds, "elapsed_min": done.elapsed / 60, "seq_len": cur_len}
                done.history.append(rec)
                log(f"step {done.step:6d} | {rec['tok_s']:7.0f} tok/s | loss {rec['loss']:.4f} | lr {cur_lr:.2e} | "
                    f"seq {cur_len} | {done.tokens / 1e6:.2f}M tok | {done.elapsed / 60:5.1f}/{minutes:g} min")
                sys.stdout.flush()
                win = _Window()
            if done.elapsed - last_ckpt >= checkpoint_minutes * 60:
                self.checkpoint()
                last_ckpt = done.elapsed
                t_last = time.perf_counter()  # saving time is not training time


def _start_model(out: Path, resume: bool, init_from: str | Path | None, tok: ChatTokenizer, seed: int,
                 arch: str, tokenizer: str | Path, log) -> tuple[torch.nn.Module, dict | None]:
    """The model to train and, when resuming, the checkpoint it resumes from."""
    ckpt_path = out / CHECKPOINT
    state = None
    torch.manual_seed(seed)
    if resume and ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model = from_config_dict(state.get("arch", "mla"), state["config"], seed)
        model.load_state_dict(state["model"])
        log(f"resuming from {ckpt_path}: step {state['step']}, {state['elapsed'] / 60:.1f} min done")
    elif init_from:
        if folder_arch(init_from) != arch:
            raise ValueError(f"--init-from {init_from} holds a {folder_arch(init_from)} model, not --arch {arch}")
        model = load_trained(init_from, dtype=torch.float32)
        log(f"starting from the weights in {init_from}")
    else:
        model = new_model(arch, tok.vocab_size, tokenizer, seed)
    model.train()
    return model, state


def _export(final: Path, export: str | Path | None, log) -> None:
    if not export:
        return
    dest = Path(export)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if (final / name).is_file():
            shutil.copyfile(final / name, dest / name)
    log(f"exported to {dest}")


def train(out_dir: str | Path, *, minutes: float = 70.0, seq_len: int = 2048, batch: int = 1, accum: int = 1,
          lr: float = 2e-3, min_lr_ratio: float = 0.05, warmup_steps: int = 60, weight_decay: float = 0.1,
          grad_clip: float = 1.0, betas: tuple[float, float] = (0.9, 0.95), dtype: str = "auto",
          threads: int | None = None, assistant_weight: float = 2.0,
          curriculum: str | None = "1024:0.4", seed: int = 0, checkpoint_minutes: float = 5.0, resume: bool = True,
          log_every: int = 10, max_steps: int | None = None, tokenizer: str | Path = DEFAULT_TOKENIZER,
          export: str | Path | None = None, eval_transcripts: int = 32, rows_per_shard: int = 64,
          init_from: str | Path | None = None, mix: DataMix = DataMix(), arch: str = "mla", log=print) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if threads:
        torch.set_num_threads(threads)
    if dtype == "auto":
        dtype = "bfloat16" if native_bf16() else "float32"
    autocast_dtype = {"bfloat16": torch.bfloat16, "float32": None}[dtype]
    tok = ChatTokenizer.from_file(tokenizer)
    phases = parse_curriculum(curriculum, seq_len)
    budget_s = minutes * 60.0
    model, state = _start_model(out, resume, init_from, tok, seed, arch, tokenizer, log)
    cfg = model.config
    opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=1e-8)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
    stream = DataStream(Packer(tok, mix, seed=seed, rows_per_shard=rows_per_shard),
                        *(state["data"] if state else (0, 0)))
    done = _Progress(state["step"], state["tokens"], state["elapsed"], state.get("history", [])) if state \
        else _Progress()
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    log(f"model: {arch_of(model)}, {n_params / 1e6:.2f}M params ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {cfg.vocab_size}, tied={cfg.tie_word_embeddings}); dtype {dtype}; threads "
        f"{torch.get_num_threads()}; batch {batch}x{accum} rows; phases {phases}; budget {minutes:g} min")

    loop = _Loop(model, opt, stream, done, out / CHECKPOINT, seq_len=seq_len, batch=batch, accum=accum,
                 grad_clip=grad_clip, assistant_weight=assistant_weight, autocast_dtype=autocast_dtype,
                 ckpt_args={"seq_len": seq_len, "batch": batch, "accum": accum, "lr": lr, "minutes": minutes,
                            "dtype": dtype, "curriculum": curriculum})
    stop_reason = loop.run(phases, budget_s, max_steps, lambda step, progress: lr_at(
        step, progress, lr=lr, warmup=warmup_steps, min_ratio=min_lr_ratio), log_every, checkpoint_minutes, log,
        minutes)
    loop.checkpoint()
    model.eval()
    final = out / "model"
    save_trained(model, final, tokenizer)
    summary = {"steps": done.step, "tokens": done.tokens, "elapsed_min": done.elapsed / 60, "stop": stop_reason,
               "params": n_params, "dtype": dtype, "threads": torch.get_num_threads(), "seq_len": seq_len,
               "batch": batch, "accum": accum, "lr": lr, "curriculum": curriculum, "seed": seed,
               "init_from": str(init_from) if init_from else None, "assistant_weight": assistant_weight,
               **dataclasses.asdict(mix),
               "data_position": [stream.shard_index, stream.row],
               "packed_tokens_this_process": {"transcripts": stream.transcript_tokens, "stdlib": stream.text_tokens},
               "last_loss": done.history[-1]["loss"] if done.history else None,
               "arch": arch_of(model), "config": config_dict(model)}
    if eval_transcripts:
        summary["heldout"] = heldout_loss(model, tok, eval_transcripts)
        log(f"held-out (test split, {eval_transcripts} transcripts): loss {summary['heldout']['loss']:.4f}, "
            f"assistant-token loss {summary['heldout']['assistant_loss']:.4f}")
    (final / "training.json").write_text(json.dumps({**summary, "history": done.history}, indent=1))
    _export(final, export, log)
    log(f"done: {done.step} steps, {done.tokens / 1e6:.2f}M tokens, {done.elapsed / 60:.1f} min ({stop_reason}); "
        f"weights in {final}")
    return summary


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m leyline_training.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> dict:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    return train(args.out, minutes=args.minutes, seq_len=args.seq_len, batch=args.batch, accum=args.accum,
                 lr=args.lr, min_lr_ratio=args.min_lr_ratio, warmup_steps=args.warmup_steps,
                 weight_decay=args.weight_decay, grad_clip=args.grad_clip, dtype=args.dtype,
                 threads=args.threads, assistant_weight=args.assistant_weight,
                 curriculum=args.curriculum, seed=args.seed,
                 checkpoint_minutes=args.checkpoint_minutes, resume=not args.no_resume,
                 log_every=args.log_every, max_steps=args.max_steps, tokenizer=args.tokenizer or DEFAULT_TOKENIZER,
                 export=args.export, eval_transcripts=args.eval_transcripts, init_from=args.init_from,
                 mix=DataMix.from_namespace(args), arch=args.arch)


if __name__ == "__main__":
    main()
