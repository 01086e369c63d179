"""ACP over WebSocket: one client connection, its sessions, the v1 and v2 methods."""
