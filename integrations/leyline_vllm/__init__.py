"""Leyline on vLLM: directives executed in vLLM's paged KV cache.

Two vLLM plugins ship here:

* ``register`` (entry point ``vllm.general_plugins: leyline``) registers
  :class:`~leyline_vllm.kv.connector.LeylineConnector`, the KV connector that
  holds a session's blocks in vLLM's paged cache between its turns and copies
  its rows, rope part rotated, into the blocks vLLM allocates for an edited
  prompt;
* ``LeylineEndpoints`` (entry point ``vllm.endpoint_plugins: leyline``) gives
  ``vllm serve`` Leyline's REST surface for sessions and directives, so the
  unchanged ``leyline_sdk`` clients work against it.

How to enable both: ``docs/vllm.md``. Imports leyline_sdk and leyline_kernels, and of
leyline_runtime only its torch-free parts (``api``: the session routes and the chat turn they
share with the bundled runtime; ``auto_rule`` and ``outcome_rule``), as docs/design.md's import table allows.
"""

from __future__ import annotations

CONNECTOR_NAME = "LeylineConnector"


def register() -> None:
    """``vllm.general_plugins`` hook: make ``LeylineConnector`` known to vLLM's factory."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from .test_config import apply_from_env

    apply_from_env()  # the tests' forced configuration, if any (nothing without its variable)
    if CONNECTOR_NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, "leyline_vllm.kv.connector", "LeylineConnector")


def endpoint_plugin():
    """``vllm.endpoint_plugins`` factory."""
    from .api_server.endpoints import LeylineEndpoints

    return LeylineEndpoints()


__all__ = ["CONNECTOR_NAME", "endpoint_plugin", "register"]
