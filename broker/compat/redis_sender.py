"""redis-py's client with commands sent by the broker's own connections.

:class:`SendingClient` is redis-py's ``Redis`` (its command builders, ``hset``,
``xreadgroup`` …, its scripts, its exceptions) whose ``execute_command`` and ``pipeline``
hand the built commands to a :class:`Sender` and read the raw replies (RESP2) through
redis-py's own reply callbacks for RESP2, as its client would. It leans on:

* every command builder of ``Redis`` calling ``execute_command(*args, **options)`` (the
  options its reply callback takes, and ``keys``, ``NEVER_DECODE``, ``EMPTY_RESPONSE``);
* ``Redis.response_callbacks``, for the protocol of the pool's ``connection_kwargs``;
* the asyncio ``Pipeline`` queueing every command in ``command_stack`` as ``(args,
  options)`` through ``pipeline_execute_command``, a script run on it adding itself to
  ``scripts`` (``AsyncScript.__call__``), and ``annotate_exception``;
* ``Pipeline.execute``, ``reset`` and ``immediate_execute_command`` (overridden).

``tests/test_compat_redis_sender.py`` checks each by behaviour, side by side with redis-py's
own client on a real server, at the lowest and the highest redis-py the pin allows
(``.ci/compat``).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import hiredis
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.exceptions import ExecAbortError, RedisError, ResponseError, WatchError

from .redis import error_from_reply


class Sender(Protocol):
    """What carries a :class:`SendingClient`'s commands to the server (RESP2)."""

    async def reply(self, args: tuple[Any, ...], decode: bool) -> Any:
        """The raw reply to one command (strings decoded unless ``decode`` is False); an
        error reply raised as redis-py's client raises it."""
        ...

    async def replies(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The raw replies to ``commands`` written at once, error replies among them (as
        hiredis reads them: ``hiredis.ReplyError``)."""
        ...

    def close(self) -> None: ...


class SendingClient(Redis):
    """redis-py's client whose commands go through :attr:`sender`."""

    sender: Sender

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            reply = await self.sender.reply(args, NEVER_DECODE not in options)
        except ResponseError:
            if EMPTY_RESPONSE in options:
                return options[EMPTY_RESPONSE]
            raise
        return await self.parsed(args[0], reply, options)

    async def parsed(self, name: Any, reply: Any, options: dict[str, Any]) -> Any:
        """``reply`` to command ``name`` as redis-py's client gives it: through the reply
        callback of the command (with the options its builder passed)."""
        callback = self.response_callbacks.get(name)
        if callback is None:
            return reply
        for internal in ("keys", EMPTY_RESPONSE, NEVER_DECODE):
            options.pop(internal, None)
        value = callback(reply, **options)
        return await value if inspect.isawaitable(value) else value

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> SendingPipeline:
        return SendingPipeline(self, transaction)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        self.sender.close()
        await super().aclose(close_connection_pool)


class SendingPipeline(Pipeline):
    """A :class:`SendingClient`'s pipeline: its commands written at once by the client's
    sender (a transaction wrapped in ``MULTI`` … ``EXEC``, one write, so nothing comes
    between), their replies read through the same callbacks. ``WATCH`` holds a connection
    for the transaction's whole time, which a sender does not promise: it is refused."""

    def __init__(self, client: SendingClient, transaction: bool) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, transaction, None)
        self.sending = client

    async def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        raise RedisError(f"{args[0]} is not supported on this client's pipelines")

    async def reset(self) -> None:  # type: ignore[override]  # as redis-py's Pipeline's
        self.command_stack = []
        self.scripts = set()
        self.watching = False
        self.explicit_transaction = False

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        try:
            if not stack:
                return []
            if self.scripts:
                await self._load_scripts()
            transaction = self.is_transaction or self.explicit_transaction
            return await self._results(stack, transaction, raise_on_error)
        finally:
            await self.reset()

    async def _load_scripts(self) -> None:
        """Every script this pipeline runs known to the server (a restart empties its
        cache), as redis-py's pipeline makes sure."""
        scripts = list(self.scripts)
        known = await self.sending.execute_command("SCRIPT EXISTS", *[s.sha for s in scripts])
        for script, exists in zip(scripts, known, strict=True):
            if not exists:
                script.sha = await self.sending.execute_command("SCRIPT LOAD", script.script)

    async def _results(
        self, stack: list[Any], transaction: bool, raise_on_error: bool
    ) -> list[Any]:
        commands = [args for args, _ in stack]
        if not transaction:
            replies = await self.sending.sender.replies(commands)
        else:
            wrapped = [("MULTI",), *commands, ("EXEC",)]
            replies = _executed(await self.sending.sender.replies(wrapped))
        results: list[Any] = []
        for number, ((args, options), reply) in enumerate(zip(stack, replies, strict=True), 1):
            if isinstance(reply, hiredis.ReplyError):
                error = error_from_reply(str(reply))
                self.annotate_exception(error, number, args)
                results.append(error)
            else:
                results.append(await self.sending.parsed(args[0], reply, dict(options)))
        if raise_on_error:
            for result in results:
                if isinstance(result, RedisError):
                    raise result
        return results


def _executed(replies: list[Any]) -> list[Any]:
    """A transaction's commands' replies, from those of ``MULTI``, each command
    (``QUEUED`` or an error) and ``EXEC``: what ``EXEC`` answered, or the first command's
    error when the server refused the transaction (``EXECABORT``), as redis-py raises it."""
    queued, executed = replies[1:-1], replies[-1]
    if isinstance(replies[0], hiredis.ReplyError):
        raise error_from_reply(str(replies[0]))
    if isinstance(executed, hiredis.ReplyError):
        refused = [error_from_reply(str(r)) for r in queued if isinstance(r, hiredis.ReplyError)]
        if refused:
            raise refused[0] from ExecAbortError(str(executed))
        raise error_from_reply(str(executed))
    if executed is None:
        raise WatchError("Watched variable changed.")
    return list(executed)
