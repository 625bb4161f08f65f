"""Developer tools: the mutation runner, the requirements audit, and the live stack
harness (`stack.py`) that integration tests and benchmarks start."""
