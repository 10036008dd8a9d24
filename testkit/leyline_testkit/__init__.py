"""What the tests and the benches both start: ``vllm serve`` with Leyline's plugins, tiny random checkpoints
per attention family, free loopback ports, and the CPU facts that choose a dtype. Not part of the product."""
