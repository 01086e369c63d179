"""A client swarm process: many watching connections, counting and timing what arrives.

``python -m bench.swarm CONFIG_JSON``, where the config is
``{"system": "broker"|"socketio"|"relay", "targets": [{"url", "room", "n"}, …],
"cwd": "/…", "concurrency": 100, "local_host": "127.0.0.2", "trace": true}`` (``local_host``,
optional: the source address of its connections; ``trace``, optional: also report each
update's first and last arrival, ``updates``). It opens ``n`` connections per target, joins each
to its room the system's way (broker: ``initialize`` + ``session/resume``; python-socketio:
the Socket.IO connect and a ``join`` event with an ack; relay: ``join ROOM``), prints
``ready {json}`` (how many joined, how long it took), then on each stdin line:
``count`` prints ``count N LAST`` (messages counted so far, the unix time of the last
arrival); ``report`` prints ``report {json}`` (messages counted, first and last arrival, latency
samples in ms: receive time minus the ``ts=`` stamp in the message) and starts counting
afresh; ``quit`` ends it. It stops by itself after ``--lifetime`` seconds.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from array import array
from typing import Any

from bench.common import commands, raise_nofile
from bench.wsclient import WsClient, connect

MAX_SAMPLES = 3_000_000
MAX_TRACED = 100_000
STAMP = b"ts="


class Counter:
    def __init__(self, trace: bool = False) -> None:
        self.trace = trace
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.samples = array("d")
        self.updates: dict[bytes, list[float]] = {}  # stamp -> [first, last, count] (trace)

    def seen(self, payload: bytes) -> bool:
        i = payload.find(STAMP)
        if i < 0:
            return False
        now = time.time()
        end = payload.find(b'"', i)
        sent = float(payload[i + 3 : end])
        if not self.count:
            self.first = now
        self.count += 1
        self.last = now
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append((now - sent) * 1000.0)
        if self.trace:
            self._traced(payload[i + 3 : end], now)
        return True

    def _traced(self, stamp: bytes, now: float) -> None:
        seen = self.updates.get(stamp)
        if seen is None:
            if len(self.updates) < MAX_TRACED:
                self.updates[stamp] = [now, now, 1]
            return
        seen[1] = now
        seen[2] += 1

    def report(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "first": self.first,
            "last": self.last,
            "samples": self.samples.tolist(),
            "updates": [[float(k), *v] for k, v in self.updates.items()],
        }


class Watcher:
    """One connection and its handshake."""

    def __init__(self, system: str, counter: Counter) -> None:
        self.system = system
        self.counter = counter
        self.client: WsClient | None = None
        self.waiting: asyncio.Future[bytes] | None = None
        self.expect = b""

    def on_text(self, payload: bytes) -> None:
        if self.counter.seen(payload):
            return
        if self.system == "socketio" and payload == b"2":
            assert self.client is not None
            self.client.send_text(b"3")  # Engine.IO ping -> pong
            return
        if self.waiting is not None and not self.waiting.done() and self.expect in payload:
            self.waiting.set_result(payload)

    async def _ask(self, text: str | None, expect: bytes, timeout: float = 60.0) -> bytes:
        self.waiting = asyncio.get_running_loop().create_future()
        self.expect = expect
        if text is not None:
            assert self.client is not None
            self.client.send_text(text)
        return await asyncio.wait_for(self.waiting, timeout)

    async def join(self, url: str, room: str, cwd: str, local_host: str | None = None) -> None:
        if self.system == "socketio":
            self.waiting = asyncio.get_running_loop().create_future()
            self.expect = b"0{"
        self.client = await connect(url, self.on_text, local_host=local_host)
        if self.system == "broker":
            init = {"protocolVersion": 1, "clientCapabilities": {}}
            await self._ask(_rpc(1, "initialize", init), b'"id":1')
            resume = {"sessionId": room, "cwd": cwd, "mcpServers": []}
            reply = await self._ask(_rpc(2, "session/resume", resume), b'"id":2')
            if b'"error"' in reply:
                raise RuntimeError(reply.decode()[:300])
        elif self.system == "socketio":
            await asyncio.wait_for(self.waiting, 30)  # type: ignore[arg-type]
            await self._ask("40", b"40")
            await self._ask(f'421["join","{room}"]', b"431")
        elif self.system == "relay":
            await self._ask(f"join {room}", b"ok")
        elif self.system == "idle":
            pass
        else:
            raise ValueError(self.system)


def _rpc(msg_id: int, method: str, params: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})


async def main(config: dict[str, Any], lifetime: float) -> None:
    raise_nofile()
    counter = Counter(bool(config.get("trace")))
    system = config["system"]
    cwd = config.get("cwd", "/tmp")
    local_host = config.get("local_host")
    limit = asyncio.Semaphore(int(config.get("concurrency", 100)))
    watchers: list[Watcher] = []
    failures: list[str] = []

    async def one(url: str, room: str) -> None:
        async with limit:
            watcher = Watcher(system, counter)
            try:
                await watcher.join(url, room, cwd, local_host)
                watchers.append(watcher)
            except Exception as exc:
                failures.append(repr(exc)[:200])
                if watcher.client is not None:
                    watcher.client.close()

    start = time.monotonic()
    jobs = [
        one(target["url"], target["room"])
        for target in config["targets"]
        for _ in range(int(target["n"]))
    ]
    await asyncio.gather(*jobs)
    took = time.monotonic() - start
    ready: dict[str, Any] = {"joined": len(watchers), "failed": len(failures), "seconds": took}
    if failures:
        ready["first_failure"] = failures[0]
    # What the joins made lives until the end: the collector need not walk it again (its
    # full collections would stall the reading of every connection here, whichever system
    # is measured).
    gc.collect()
    gc.freeze()
    print("ready " + json.dumps(ready), flush=True)

    async for command in commands(lifetime):
        if command == "count":
            print(f"count {counter.count} {counter.last:.6f}", flush=True)
        elif command == "report":
            print("report " + json.dumps(counter.report()), flush=True)
            counter.reset()
        elif command in ("quit", ""):
            break
    for watcher in watchers:
        if watcher.client is not None:
            watcher.client.close()


if __name__ == "__main__":
    lifetime = 1800.0
    asyncio.run(main(json.loads(sys.argv[1]), lifetime))
