"""The workflow behind the MCP tools; nothing here knows about MCP."""
