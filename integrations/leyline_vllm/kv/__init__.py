"""What runs beside vLLM's KV cache: the connector in the EngineCore process (scheduler side) and in
each worker (worker side), and the worker extension the API server calls. Imports torch and vLLM;
never the API-server side."""
