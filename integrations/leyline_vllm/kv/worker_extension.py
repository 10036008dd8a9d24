"""Worker methods the endpoint reaches through ``engine_client.collective_rpc``.

Enabled with ``--worker-extension-cls leyline_vllm.kv.worker_extension.LeylineWorkerExtension``
(vLLM mixes the class into its Worker).
"""

from __future__ import annotations

import torch


def _connector():
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    from .connector import LeylineConnector

    if not has_kv_transfer_group():
        raise RuntimeError("no KV connector configured: start vLLM with --kv-transfer-config (see docs/vllm.md)")
    connector = get_kv_transfer_group()
    if not isinstance(connector, LeylineConnector):
        raise RuntimeError(f"the KV connector is {type(connector).__name__}, not LeylineConnector")
    return connector


class LeylineWorkerExtension:
    def leyline_support(self) -> dict:
        """Whether this model's cache is spliced, with the layout or the reason it is not."""
        return _connector().worker.support()

    def leyline_drift(self, old_key: str, old_start: int, new_key: str, new_start: int, count: int
                      ) -> list[float] | None:
        """Per layer, how far the rows an amortize would move differ from the rows computed exactly in the
        edited context (``WorkerSide.drift``): mode ``auto``'s signal on vLLM."""
        return _connector().worker.drift(old_key, old_start, new_key, new_start, count)

    def leyline_rows(self, key: str, layer: int) -> dict | None:
        """One layer of a snapshot (from its held blocks, else the host tier) as float32 bytes
        (diagnostics and tests)."""
        layers = _connector().worker.snapshot_rows(key)
        if layers is None:
            return None
        rows = layers[layer].to(torch.float32).cpu().contiguous()
        return {"shape": list(rows.shape), "dtype": str(layers[layer].dtype), "data": rows.numpy().tobytes()}
