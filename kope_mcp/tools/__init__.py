"""Thin MCP handlers: take the app context, call a service, return its pydantic result."""
