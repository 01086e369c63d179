"""What a method handler may return besides its result.

Handlers that must order their reply against the session's events (``session/new``,
``load``, ``resume``, ``set_title``) send the reply themselves and return
:data:`DEFERRED`, so that the connection sends nothing more.
"""

from __future__ import annotations


class Deferred:
    """A handler result meaning: the handler has sent (or will send) the reply itself."""


DEFERRED = Deferred()
