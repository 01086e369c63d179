"""What an operator reads off every role: health (``/livez``, ``/readyz``) and metrics."""
