"""websockets' internals the broker relies on, in one place.

websockets' asyncio server is used through its public API (``serve``, ``recv``, ``send``,
``close``, ``process_request``) except where measured costs asked for more:

- :class:`HookedServerConnection` overrides two of ``Connection``'s private methods:
  ``process_event`` (a whole text message is handed to the ACP connection in the step that
  parses it, no task woken: :attr:`~HookedServerConnection.frame_in`) and
  ``acknowledge_pings`` (the front's one keepalive loop answers its own Pings:
  :meth:`~HookedServerConnection.pong_received`);
- it looks at a connection's first bytes before websockets' handshake parser does
  (:meth:`~HookedServerConnection.before_handshake`: that parser refuses a request with a
  body without a word), overriding ``data_received``, which also notes that the peer sent
  something (:attr:`~HookedServerConnection.heard`);
- :func:`break_cycles`, run when a connection is lost, reaches into the protocol's
  ``parser`` generator and its exceptions, and the handshake request's private
  ``_exception``;
- the outbox (:mod:`broker.front.acp.outbox`) writes frames to ``transport`` itself, as
  ``websockets.broadcast`` does, once ``paused``, ``send_in_progress`` and
  ``protocol.state`` say nothing waits before them, and calls ``send_data`` after
  ``protocol.send_text`` where an extension rewrites frames; the keepalive writes Ping
  frames the same way.

``tests/test_compat_websockets.py`` checks each of these by behaviour (websockets' own
connection driven with bytes, its writes read back), so an upgrade that changes one fails
there by name. No other module subclasses a websockets class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.frames import DATA_OPCODES, Frame


class HookedServerConnection(ServerConnection):
    """A server connection with hooks into how websockets processes what it parses."""

    frame_in: Callable[[Frame], bool] | None = None
    """Told each message's last frame as it is parsed (the ACP connection's
    :meth:`~broker.front.acp.connection.ClientConnection.frame_in`); True: it was taken
    there, not queued for ``recv`` (no task woken, no queue, no reassembly for a whole
    text message)."""

    def process_event(self, event: Any) -> None:
        told = self.frame_in
        if (
            told is not None
            and type(event) is Frame
            and event.fin
            and event.opcode in DATA_OPCODES
            and told(event)
        ):
            return
        super().process_event(event)

    _first = True
    heard = False
    """Whether bytes came from the peer since the caller last cleared it (the keepalive: a
    peer that sends is alive, whether or not its Pong is read yet)."""

    def data_received(self, data: bytes) -> None:
        self.heard = True
        if self._first:
            self._first = False
            answer = self.before_handshake(data)
            if answer is not None:
                self.transport.write(answer)
                self.transport.close()
                return
        super().data_received(data)

    def before_handshake(self, data: bytes) -> bytes | None:
        """What to answer the connection's first bytes with instead of a handshake (an
        HTTP response, written before the socket is closed); None: the handshake goes on.
        A request with a body never reaches ``process_request`` (the handshake parser
        refuses bodies and closes the connection without a word)."""
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        break_cycles(self)

    def acknowledge_pings(self, data: bytes) -> None:
        if not self.pong_received(data):
            super().acknowledge_pings(data)

    def pong_received(self, data: bytes) -> bool:
        """A Pong with ``data`` came; True: it answered a Ping of the caller's own (the
        others go to websockets, as a pong of ``ping()`` does)."""
        return False


def break_cycles(ws: ServerConnection) -> None:
    """Break the reference cycles websockets leaves in a closed connection, so that it is
    freed as its last reference goes, not by the cyclic collector (a front freezes what
    full collections leave, see :mod:`broker.collector`: garbage in a cycle would live
    until the next sweep of the whole heap).

    - ``select_subprotocol``, the server's, is bound to the protocol in a closure over this
      connection (protocol -> closure -> connection -> protocol);
    - the ACP connection's :attr:`HookedServerConnection.frame_in` (a bound method: the
      connection holds this one);
    - the protocol's parser is a generator suspended in a method of the protocol; at the end
      of the stream (``connection_lost`` fed it) it only waits at its last ``yield``.
      Closing it ends it: nothing steps it after the end of the stream;
    - the exceptions websockets keeps once a connection failed (what stopped the parser, as
      the ``EOFError`` of a peer gone without a Close frame; what failed the handshake, on
      the protocol and on its request; what failed the connection) hold their tracebacks,
      whose frames hold the protocol or the connection (protocol -> exception ->
      traceback -> a frame of the protocol -> protocol): 16 objects of every connection
      that ended without a Close frame, the usual end of a client gone away, 27-52 of one
      whose handshake failed. Only the tracebacks go: the exceptions stay, the causes of
      the ``ConnectionClosed`` each later ``recv`` raises.
    """
    protocol = ws.protocol
    if isinstance(ws, HookedServerConnection):
        ws.frame_in = None  # a bound method of the ACP connection, which holds ws
    protocol.__dict__.pop("select_subprotocol", None)
    protocol.parser.close()
    for exc in (
        protocol.parser_exc,
        protocol.handshake_exc,
        ws.connection_exc,
        getattr(ws.request, "_exception", None),  # private in websockets: may go
    ):
        _drop_tracebacks(exc)


def _drop_tracebacks(exc: BaseException | None) -> None:
    """Drop the tracebacks of ``exc`` and of the exceptions it was raised from or while."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
