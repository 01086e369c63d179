"""ACP's Streamable HTTP transport: POST, GET (SSE) and DELETE on ``/acp``, any front."""
