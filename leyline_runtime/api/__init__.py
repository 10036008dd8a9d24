"""The REST surface every Leyline backend serves, written once (FastAPI + leyline_sdk, no torch).

``sessions.build_session_router`` declares the native session routes
(``/sessions``, ``/sessions/{id}/messages``, ``/sessions/{id}/generate``,
``/directives``) against :class:`sessions.SessionBackend`, which the bundled
runtime (``leyline_runtime.server.routes_sessions``) and the vLLM plugin
(``leyline_vllm.api_server.endpoints``) each implement; ``errors`` maps every error to
``{"error": {"code", "message"}}`` for both. Importing this package loads
neither torch nor the rest of the runtime, so ``leyline_vllm`` may use it
(the documented exception in docs/design.md).
"""
