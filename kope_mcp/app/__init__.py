"""The entry points: the CLI, the MCP servers (stdio, HTTP, the proxy), the daemon, the demo, and the mains of
the trusted worker processes the sandbox runs."""
