"""The REST surface every Leyline backend serves, written once (FastAPI + leyline_sdk, no torch).

``sessions.build_session_router`` declares the native session routes
(``/sessions``, ``/sessions/{id}/messages``, ``/sessions/{id}/generate``,
``/directives``) against :class:`sessions.SessionBackend`; ``chat.bound_chat`` answers
``/v1/chat/completions`` bound to a session against :class:`chat.ChatBackend` (the
request, ``chat_request``; its prompt and sampling, ``chat_prompt``; the turn's plan,
``chat_turn``; the response and its ``leyline`` report, ``chat_response``). The bundled
runtime (``leyline_runtime.server``) and the vLLM plugin
(``leyline_vllm.api_server.endpoints``) each implement both backends; ``errors`` maps
every native error to ``{"error": {"code", "message"}}`` and ``openai_errors`` every
``/v1`` error to OpenAI's shape, for both. Importing this package loads
neither torch nor the rest of the runtime, so ``leyline_vllm`` may use it
(the documented exception in docs/design.md).
"""
