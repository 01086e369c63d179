"""The two names a client can put into a Redis key, and the one format each may take.

Session keys read ``…:t:<tenant>:s:<session>`` (:mod:`.keys`), unescaped: a tenant
name holding ``:`` (``sec:s:v``) or a session id holding one (``v:s:<S>``) would let
one tenant name another's keys. So both are checked where they enter the broker: a
tenant when a token is created, a JWT is verified or the settings are read; a session
id in every request that carries one. The broker makes every session id itself
(:func:`new_session_id`), so an id of any other shape names no session.
"""

from __future__ import annotations

import re
import secrets

TENANT_MAX = 64
_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SESSION_ID = re.compile(r"sess_[0-9a-f]{32}")
TENANT_RULE = f"1 to {TENANT_MAX} ASCII letters, digits, '-' or '_'"
"""What a tenant name may be, as error messages say it."""
SESSION_ID_RULE = "'sess_' and 32 lowercase hex digits"
"""What a session id looks like, as error messages say it."""


def is_tenant(name: object) -> bool:
    """Whether ``name`` is a valid tenant name (see :data:`TENANT_RULE`)."""
    return isinstance(name, str) and _TENANT.fullmatch(name) is not None


def is_session_id(value: object) -> bool:
    """Whether ``value`` has the one shape of the broker's session ids."""
    return isinstance(value, str) and _SESSION_ID.fullmatch(value) is not None


def new_session_id() -> str:
    """A fresh session id (128 random bits)."""
    return "sess_" + secrets.token_hex(16)
