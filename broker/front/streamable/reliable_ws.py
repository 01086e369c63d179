"""ACP Remote's reliable transport on WebSocket: a socket bridged to a store-backed
connection, with the same cursors as Streamable HTTP's streams.

A client that opens the socket with the subprotocol
:data:`~.remote_frames.SUBPROTOCOL` and an ``initialize`` asking for the profile (see
:mod:`.remote_frames`) gets a connection of :class:`~.service.StreamableHttp` with one
stream (everything it is sent, at consecutive cursors, in the store): the socket is its
reader (a :class:`~.sse.ScopeStream`, as a GET's is), and what the client submits goes to
its inbox (as a POST's does). So any front serves it, and the same cursor rule resumes it
(:func:`~.resume.resume_after`): on reconnecting, to any front, ``initialize`` with
``connection.type: "resume"``, the secret it was given and the last cursor it applied sends
every record after that cursor, once, in order; further back than the stream keeps answers
``cursor_gap``. Each new socket is a new generation: the older one's reader is replaced (it
is closed, told ``connection_fenced``), and its frames are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import secrets
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from ...auth.principal import Principal
from ...errors.remote import RemoteCondition
from ...store.http_links import CONNECTION_SCOPE
from ..acp.connection import CLOSE_GOING_AWAY, CLOSE_POLICY
from .remote_frames import (
    PROFILE,
    SERVER_EPOCH,
    FrameError,
    Opening,
    answered,
    client_frame,
    delivery,
    error_message,
    opening,
)
from .resume import CursorRefused, parse_cursor, resume_after
from .service import ConnectionRefused, StreamableHttp
from .sse import ScopeStream

CLOSE_UNSUPPORTED = 1003


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ReliableWebSocket:
    """One WebSocket speaking the reliable transport, from its ``initialize`` to its end."""

    def __init__(self, service: StreamableHttp, ws: ServerConnection, principal: Principal | None):
        self.service = service
        self.links = service.links
        self.ws = ws
        self.principal = principal
        self.conn_id = ""
        self.generation = 0

    async def run(self) -> None:
        """Serve the socket until it closes, a newer generation takes its connection, the
        connection ends or the front stops."""
        with contextlib.suppress(ConnectionClosed):
            text = await self._first()
            if text is None:
                return
            after = await self._open(text)
            if after is None:
                return
            # Counted as the connection, where it runs (its holder), no more as a socket.
            self.service.access.close_connection(str(self.ws.id))
            reading = asyncio.ensure_future(self._receive())
            sending = asyncio.ensure_future(self._send(after))
            try:
                await asyncio.wait({reading, sending}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (reading, sending):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                        await task

    async def _first(self) -> str | None:
        """The first message (text, within ``login_timeout``); None: the socket was closed."""
        try:
            async with asyncio.timeout(self.service.settings.login_timeout):
                text = await self.ws.recv()
        except TimeoutError:
            await self.ws.close(CLOSE_POLICY, "initialize first")
            return None
        if not isinstance(text, str):
            await self.ws.close(CLOSE_UNSUPPORTED, "Remote Frames are text messages")
            return None
        return text

    async def _refuse(self, msg_id: Any, refused: FrameError) -> None:
        await self.ws.send(error_message(msg_id, refused.error()))
        await self.ws.close(CLOSE_POLICY, str(refused)[:120])

    # -- opening ----------------------------------------------------------------------------

    async def _open(self, text: str) -> int | None:
        """Open or resume the connection; the cursor its records go on after (None: it was
        refused, and the socket closed)."""
        msg_id: Any = None
        try:
            message = json.loads(text)
            msg_id = message.get("id") if isinstance(message, dict) else None
            wanted = opening(message)
            if self.principal is None:
                raise FrameError(
                    RemoteCondition.UNAUTHENTICATED, f"{PROFILE} needs credentials at the upgrade"
                )
            if wanted.resume is None:
                return await self._create(wanted, text)
            return await self._resume(wanted)
        except FrameError as refused:  # before ValueError: it is one
            await self._refuse(msg_id, refused)
        except ValueError:
            await self._refuse(msg_id, FrameError(None, "the first message is one JSON object"))
        return None

    async def _create(self, wanted: Opening, text: str) -> int | None:
        assert self.principal is not None
        try:
            conn_id, response = await self.service.initialize(
                self.principal, wanted.msg_id, text, one_stream=True
            )
        except ConnectionRefused as refused:
            raise FrameError(None, str(refused)) from None
        if not conn_id:  # initialize failed: its error is the answer
            await self.ws.send(response)
            await self.ws.close(CLOSE_POLICY, "initialize failed")
            return None
        self.conn_id = conn_id
        _, given = await self.links.reader(conn_id, CONNECTION_SCOPE)
        secret = secrets.token_urlsafe(32)
        answer, result = answered(response, await self._remote(secret, given))
        assert result is not None
        result.pop("remote")  # stored without the secret: a resume adds its own
        await self.links.save(conn_id, {"rs": _digest(secret), "init": json.dumps(result)})
        await self.ws.send(answer)
        return given

    async def _resume(self, wanted: Opening) -> int | None:
        assert self.principal is not None and wanted.resume is not None
        conn_id = wanted.resume["connectionId"]
        record = await self.links.load(conn_id)
        digest = _digest(wanted.resume["resumeSecret"])
        if (
            record is None
            or record.get("tenant") != self.principal.tenant
            or record.get("one") != "1"
            or not any(hmac.compare_digest(digest, record.get(f) or "") for f in ("rs", "rs0"))
        ):
            raise FrameError(RemoteCondition.INVALID_RESUME, "no such connection, or a bad secret")
        try:
            after = await resume_after(
                self.links, conn_id, CONNECTION_SCOPE, wanted.resume["afterCursor"]
            )
        except CursorRefused as refused:
            if refused.gap:
                raise FrameError(
                    RemoteCondition.CURSOR_GAP,
                    "the records after afterCursor are no longer kept: open a new connection "
                    "and reattach the sessions with session/resume",
                    oldest=str(refused.oldest),
                ) from None
            raise FrameError(None, f"afterCursor is {refused}") from None
        self.conn_id = conn_id
        secret = secrets.token_urlsafe(32)  # rotated; the one just used stays good a while
        acknowledged = str(max(after, int(record.get("ack") or 0)))  # afterCursor acknowledges
        await self.links.save(conn_id, {"rs": _digest(secret), "rs0": digest, "ack": acknowledged})
        await self.links.touch(conn_id)
        result = json.loads(record.get("init") or "{}")
        result["remote"] = await self._remote(secret, after)
        answer = {"jsonrpc": "2.0", "id": wanted.msg_id, "result": result}
        await self.ws.send(json.dumps(answer, separators=(",", ":")))
        await self.service.ensure_held(conn_id, self.principal)  # its front may be gone
        return after

    async def _remote(self, secret: str, start: int) -> dict[str, Any]:
        """The ``remote`` member of the answer: a new generation of the connection."""
        self.generation = await self.links.next_generation(self.conn_id)
        settings = self.service.settings
        return {
            "profile": PROFILE,
            "connectionId": self.conn_id,
            "generation": str(self.generation),
            "serverEpoch": SERVER_EPOCH,
            "startCursor": str(start),
            "resumeSecret": secret,
            "retention": {
                "maximumUnackedRecords": str(self.links.retention),
                "resumeGraceSeconds": str(int(settings.http_idle_timeout)),
            },
            "limits": {"maximumFrameBytes": str(settings.max_frame_bytes)},
        }

    # -- records out ------------------------------------------------------------------------

    async def _send(self, after: int) -> None:
        """Send the connection's records after ``after`` until another reader (a newer
        generation) takes the stream, the connection ends, or the front stops."""
        assert self.principal is not None
        stream = ScopeStream(self.service, self.conn_id, CONNECTION_SCOPE, after, self.principal)
        write_timeout = self.service.settings.http_write_timeout
        try:
            async with contextlib.aclosing(stream.records()) as records:
                async for rows in records:  # an empty list: a heartbeat (the keepalive pings)
                    async with asyncio.timeout(write_timeout):  # not read in time: cut
                        for cursor, text in rows:
                            record = delivery(self.conn_id, self.generation, cursor, text)
                            await self.ws.send(record)
        except TimeoutError:  # what it missed waits in the store for its resume
            await self.ws.close(CLOSE_POLICY, "records not read in time: resume")
            return
        if self.service.stopping:
            await self.ws.close(CLOSE_GOING_AWAY, "broker shutting down: resume elsewhere")
        elif await self.links.load(self.conn_id) is None:
            await self.ws.close(1000, "the connection ended")
        else:
            await self._fenced()

    async def _fenced(self) -> None:
        fenced = FrameError(
            RemoteCondition.CONNECTION_FENCED, "a newer generation took this connection"
        )
        await self._refuse(None, fenced)

    # -- frames in --------------------------------------------------------------------------

    async def _receive(self) -> None:
        """Take the client's frames: acknowledgements, and submissions for the inbox."""
        assert self.principal is not None
        while True:
            text = await self.ws.recv()
            if not isinstance(text, str):
                await self.ws.close(CLOSE_UNSUPPORTED, "Remote Frames are text messages")
                return
            try:
                frame = client_frame(text, self.conn_id)
            except FrameError as refused:
                await self.ws.send(error_message(None, refused.error()))
                continue
            record = await self.links.load(self.conn_id)
            if record is None:
                return  # the connection ended (the sender closes the socket)
            if frame.generation != str(self.generation) or record.get("g") != frame.generation:
                await self._fenced()
                return
            if frame.ack is not None:
                await self._acknowledge(frame.ack, record)
            for message in frame.messages:
                await self.service.post(self.conn_id, self.principal, message)

    async def _acknowledge(self, cursor_text: str, record: dict[str, str]) -> None:
        """Note a cumulative acknowledgement (an older or repeated one changes nothing)."""
        cursor = parse_cursor(cursor_text)
        _, given = await self.links.reader(self.conn_id, CONNECTION_SCOPE)
        if cursor is None or cursor > given:
            refused = FrameError(None, "the acknowledged cursor is not one this connection sent")
            await self.ws.send(error_message(None, refused.error()))
            return
        if cursor > int(record.get("ack") or 0):
            await self.links.save(self.conn_id, {"ack": str(cursor)})
