"""The execution runtime: the sandbox, the harness that runs kernels inside it, the measurement protocol and the
timekeeper. Standard library and numpy only; nothing here imports the rest of kope_mcp."""
