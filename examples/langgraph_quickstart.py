"""A LangGraph agent on Leyline in a few lines: the middleware clears old tool results, Leyline edits the
runtime's KV cache in place (directives) instead of re-prefilling the history.

Needs a running runtime (``leyline-runtime serve``): LEYLINE_BASE_URL (default http://127.0.0.1:8000) and
LEYLINE_API_KEY (or ``LeylineClient(base_url, api_key)``) when the server was started with ``--api-key``;
and LangChain (from the checkout: ``.venv/bin/pip install -e '.[langchain]'``). Run twice on one server, the
second run's first call adopts the session the first left and starts over in it: ``[rerun forget]``.
"""

from langchain.agents import create_agent
from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from leyline_langchain import ChatLeyline
from leyline_sdk import LeylineClient, LeylineMemory


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 17 * 23."""
    allowed = set("0123456789+-*/(). ")
    return str(eval(expression, {"__builtins__": {}})) if set(expression) <= allowed else "Error: bad expression"


memory = LeylineMemory(LeylineClient())  # LEYLINE_BASE_URL, LEYLINE_API_KEY
agent = create_agent(
    model=ChatLeyline.from_memory(memory, max_tokens=48),
    tools=[calculator],
    system_prompt="You are a careful assistant. Use the calculator for every sum, then answer.",
    # a small trigger, so that the second question already clears the first tool result
    middleware=[ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=50, keep=1)])],
    checkpointer=InMemorySaver(),
)
# One thread_id = one runtime session (``lg-<thread_id>``). Another process with the same thread_id
# takes that session over (a ThreadSessionWarning says so); outside a graph, pass the same config to
# ChatLeyline.invoke(..., config=config) and it uses that thread too.
config = {"configurable": {"thread_id": "quickstart-1"}}
for question in ["What is 17 * 23? Use the calculator.", "And 391 + 45? Use the calculator.",
                 "And 436 - 6? Use the calculator."]:
    result = agent.invoke({"messages": [("user", question)]}, config)
    print("answer:", result["messages"][-1].text)

for n, call in enumerate(memory.calls("quickstart-1"), 1):
    print(f"call {n}: {call.directives} directives, {call.prefilled_tokens} prefilled, "
          f"{call.rotated_tokens} rotated", *(f"[{e.reason} {e.applied_mode}]" for e in call.edits))
print("directives:", memory.stats("quickstart-1").directives)
