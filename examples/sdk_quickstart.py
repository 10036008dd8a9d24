"""The SDK alone (pydantic + httpx, no torch): a session, a directive, a generation.

Needs a running runtime: LEYLINE_BASE_URL (default http://127.0.0.1:8000), LEYLINE_API_KEY.
"""

from leyline_sdk import Directive, FunctionCall, LeylineClient, Message, Span, ToolCall

calculator_call = ToolCall(id="call_1",
                           function=FunctionCall(name="calculator", arguments='{"expression": "37*12-5"}'))
history = [
    Message(role="system", content="You are a careful agent. Use tools when needed."),
    Message(role="user", content="What is 37*12-5?"),
    Message(role="assistant", content="Computing 37*12- first."),  # a failed attempt ...
    Message(role="user", content="That expression is incomplete."),  # ... and its correction
    Message(role="assistant", content=None, tool_calls=[calculator_call]),  # the calculator, called right
    Message(role="tool", tool_call_id="call_1", content="439"),
]

with LeylineClient() as client:
    session = client.create_session(messages=history, session_id="quickstart")
    print("session", session.session_id, "tokens", session.num_tokens)

    # Drop the failed attempt (messages 2 and 3): the prefix stays, the tail is rotated in place.
    result = client.apply(session.session_id, [Directive(span=Span(start=2, end=4), mode="amortize")])
    outcome = result.outcomes[0]
    print("tokens", result.num_tokens, "applied", outcome.applied_mode, "rotated", outcome.rotated_tokens,
          "recomputed", outcome.recomputed_tokens)

    # The reply reads the calculator's result; greedy: temperature 0 is the default.
    reply = client.generate(session.session_id, max_tokens=16)
    print("reply", repr(reply.message.content), "cached", reply.usage.cached_tokens)
    client.delete_session(session.session_id)
