"""``vllm serve`` with Leyline's plugin (``leyline-bench vllm | portability``): the server, tiny random checkpoints
per attention family, correctness probes shared with tests/vllm."""
