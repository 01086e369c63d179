"""Telling a tenant's connections that its session list changed, as it changes.

The broker sends a connection ``session/update`` only for the sessions active on it, so a
window that lists sessions learns of the others' changes only by listing again. But every
writer of the index announces the tenant it changed (``acpb:index:changed``, heard by
:class:`~.pages.IndexWatch`), so a front knows when each tenant's list changed: it tells
the connections of that tenant that asked (``capabilities._meta["acpBroker/listChanged"]:
true`` at ``initialize``) with an extension notification,
:data:`~broker.protocol.capabilities.LIST_CHANGED_METHOD`, and they list again.

* **Coalesced**: at most one notification per tenant (so per connection) per
  :data:`WINDOW`, however many announcements arrive (the projector announces a busy tenant
  once per batch, dozens a second): the first at once, what comes during the window in one
  more at its end (:class:`Coalescer`), so the last change is never left untold.
* **Never waits**: a notification is one shared frame handed to each connection's own send
  path in a timer's callback (no task, no await), so a slow connection cannot hold up the
  others, the watch or the fan-out; it queues behind its own frames under the queue's bound
  like any frame, and is cut off past it (close code 4008).
* **The tenant's own**: a connection hears only announcements of the tenant its credential
  names now, and only while that credential may read (list) sessions.
* **At most once, and caught up**: pub/sub may drop an announcement, and the watch may be
  unsubscribed a while (a Redis restart, a failover). Each (re)subscription counts as a
  change of every tenant with listeners here (what was announced meanwhile is unknown);
  clients keep a slow poll besides for the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from ..auth.principal import Principal, Scope
from ..ops import metrics
from ..protocol import capabilities, jsonrpc
from ..protocol.jsonrpc import JsonObject

log = logging.getLogger(__name__)

WINDOW = 0.25
"""Seconds: the least time between two notifications to one tenant's connections."""

FRAME = jsonrpc.encode(jsonrpc.notification(capabilities.LIST_CHANGED_METHOD, {}))
"""The notification's text: the same for every connection (framed once, see ``_wire``)."""

K = TypeVar("K", bound=Hashable)


class Coalescer(Generic[K]):
    """Which announcements of a key are told, pure (the caller keeps the time).

    A key is idle or in a window. Heard while idle: tell now, and a window opens. Heard in
    a window: owed. When the window ends: if owed, tell now and another window opens; else
    the key is idle again. So two tellings of a key are at least a window apart, and every
    announcement is followed by a telling within a window."""

    def __init__(self) -> None:
        self._owed: dict[K, bool] = {}  # keys in a window -> whether a telling is owed

    def heard(self, key: K) -> bool:
        """An announcement of ``key``; True: tell now, and end a window in one window's time."""
        if key in self._owed:
            self._owed[key] = True
            return False
        self._owed[key] = False
        return True

    def window_ended(self, key: K) -> bool:
        """``key``'s window is over; True: tell now, and end another window in one window's
        time (False: idle, nothing to time)."""
        owed = self._owed.pop(key, False)
        if owed:
            self._owed[key] = False
        return owed

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is in a window."""
        return key in self._owed


class Listener(Protocol):
    """What a connection offers to be told (:class:`~.acp.connection.ClientConnection`)."""

    tenant: str
    principal: Principal | None
    client_capabilities: JsonObject

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None: ...


def wants_list_changes(conn: Listener) -> bool:
    """Whether the connection asked at ``initialize`` to be told of its list's changes."""
    return capabilities.opted_in(conn.client_capabilities, capabilities.LIST_CHANGED_META)


def may_hear(conn: Listener, tenant: str) -> bool:
    """Whether ``conn`` may be told that ``tenant``'s list changed: its credential names the
    tenant now and may list sessions (a connection logged out, or not yet in, hears none)."""
    principal = conn.principal
    return (
        principal is not None
        and principal.tenant == tenant
        and conn.tenant == tenant
        and principal.may(Scope.READ)
    )


class ListChanges:
    """The connections of this front that asked to be told, by tenant; tells them."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._coalescer: Coalescer[str] = Coalescer()
        self._by_tenant: dict[str, set[Listener]] = {}
        self._tenant_of: dict[Listener, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def follow(self, conn: Listener) -> None:
        """Tell ``conn`` of its tenant's changes if it asked to be (again after its credential
        changed: the tenant it hears is the one it acts for now)."""
        self.discard(conn)
        if not wants_list_changes(conn):
            return
        self._tenant_of[conn] = conn.tenant
        self._by_tenant.setdefault(conn.tenant, set()).add(conn)

    def discard(self, conn: Listener) -> None:
        """Tell ``conn`` nothing more (it closed)."""
        tenant = self._tenant_of.pop(conn, None)
        if tenant is None:
            return
        listeners = self._by_tenant.get(tenant)
        if listeners is not None:
            listeners.discard(conn)
            if not listeners:
                del self._by_tenant[tenant]

    def listeners(self, tenant: str) -> int:
        """How many connections here are told of ``tenant``'s changes."""
        return len(self._by_tenant.get(tenant, ()))

    def changed(self, tenant: str) -> None:
        """An announcement of ``tenant`` (the index watch's); tells its listeners, coalesced."""
        if tenant not in self._by_tenant and tenant not in self._coalescer:
            return  # nobody here to tell
        if self._coalescer.heard(tenant):
            self._tell(tenant)

    def resubscribed(self) -> None:
        """The watch is subscribed again: what was announced while it was not is unknown, so
        every tenant with listeners here may have changed."""
        for tenant in list(self._by_tenant):
            self.changed(tenant)

    def close(self) -> None:
        """Cancel the windows' timers (the front stops)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _tell(self, tenant: str) -> None:
        """Send the notification to the tenant's listeners now, and time the window's end."""
        told = 0
        for conn in list(self._by_tenant.get(tenant, ())):
            if may_hear(conn, tenant):
                conn.send_text(FRAME, shared=True)
                told += 1
        if told:
            metrics.LIST_CHANGES_SENT.inc(told)
        loop = asyncio.get_running_loop()
        self._timers[tenant] = loop.call_later(self.window, self._window_ended, tenant)

    def _window_ended(self, tenant: str) -> None:
        del self._timers[tenant]
        if self._coalescer.window_ended(tenant):
            self._tell(tenant)
