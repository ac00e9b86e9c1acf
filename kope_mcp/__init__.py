"""kope-mcp: an MCP workbench and memory for LLM-driven kernel optimisation (after the KOPE paper)."""

__version__ = "0.1.0"
