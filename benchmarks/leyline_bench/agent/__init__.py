"""Agents and agent-like traces on the bundled runtime (``leyline-bench agent | replay``): LangGraph agents end to
end, synthetic traces through cache arms."""
