"""The front's HTTP listener: REST, OpenAPI, MCP over streamable HTTP, health."""
