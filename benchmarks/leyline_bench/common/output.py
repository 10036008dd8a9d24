"""Result files: ``<out>/<name>.json`` (with provenance), ``<name>.md`` and PNGs."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path

from .machine import provenance


def _clean(value):
    """JSON-safe: NaN/inf become None (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def fmt(value) -> str:
    """Compact human formatting for tables: about three significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        a = abs(value)
        if a == 0:
            return "0"
        if a >= 1e5 or a < 1e-3:
            return f"{value:.3g}"
        if a >= 100:
            return f"{value:.0f}"
        if a >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def md_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def md_header(title: str, payload: dict) -> str:
    m = payload["machine"]
    git = payload["git"]
    commit = (git.get("commit") or "unknown")[:12] + (" (dirty)" if git.get("dirty") else "")
    return (f"# {title}\n\n`{payload['command']}`\n\n"
            f"Machine: {m['cpu']}{' (' + m['isa'] + ')' if m.get('isa') else ''}, {m['cores']} cores, "
            f"torch {m['torch']} ({m['threads']} threads)"
            f"{', GPU ' + m['cuda'] if m.get('cuda') else ', no GPU'}; commit {commit}.\n"
            + _runtime_line(payload.get("runtime")))


def _runtime_line(rt: dict | None) -> str:
    if not rt:
        return ""
    return (f"\nModel: {rt['model']} ({rt['layers']} layers, hidden {rt['hidden_size']}, kv_lora_rank "
            f"{rt['kv_lora_rank']}, rope {rt['qk_rope_head_dim']}, context {rt['max_position_embeddings']}), "
            f"{rt['dtype']}, prefill chunk {rt['prefill_chunk']}, block {rt['block_size']}"
            f"{', fp32 products on ' + rt['cpu_gemm'] if rt.get('cpu_gemm') else ''}.\n")


def write_results(out: str | Path, name: str, result: dict, title: str, body_md: str,
                  samples: dict | None = None) -> dict:
    """Write ``<out>/<name>.json`` and ``<out>/<name>.md``; returns the JSON payload.

    ``samples``: the per-sample records behind the summaries (per session, per edit), written apart to
    ``<out>/<name>.samples.json.gz``, which git ignores: a run's summary is committed, its raw records are
    regenerated with the command the summary names (they ran to megabytes per run)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {**provenance(), **result}
    if samples is not None:
        path = out / f"{name}.samples.json.gz"
        path.write_bytes(gzip.compress(json.dumps(_clean(samples)).encode()))
        payload["samples_file"] = path.name
    payload = _clean(payload)
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / f"{name}.md").write_text(md_header(title, payload) + "\n" + body_md.rstrip() + "\n")
    return payload
