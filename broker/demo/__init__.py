"""The demo agent: an example ACP agent that runs behind the broker out of the box."""
