"""A client process of ``bench storm``: ACP watchers that reconnect and resume by position.

``python -m bench.storm_clients CONFIG_JSON``, where the config is ``{"targets": [{"url",
"session", "n"}, …], "survivor": URL, "cwd": "/…", "concurrency": 200}``. Each watcher
connects to its target, sends ``initialize`` and ``session/resume`` and counts the
``session/update`` frames of its session by their ``_meta["acpBroker/position"]`` seq: a
seq at or below the last one seen is a duplicate, one past the next a gap. When its
connection drops it connects to ``survivor`` and resumes from the last position it saw
(``_meta["acpBroker/replayAfter"]``), as the broker's clients do, retrying (bounded in count
and time) until it is answered.

It prints ``ready {json}`` once every watcher joined (or failed to), then answers one stdin
line at a time: ``primed`` (``primed N``: watchers that have seen an event), ``status``
(``status {json}``: how many lost their connection, how many resumed), ``check {json}``
(given each session's first and final seq, ``check {json}``: watchers that have every event
from the first to the final exactly once, lost and duplicated events, the resume times),
``quit``. It stops by itself after ``LIFETIME`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from typing import Any

from bench.common import commands, raise_nofile
from bench.wsclient import WsClient, connect

LIFETIME = 900.0
RECONNECT_SECONDS = 60.0
"""How long a watcher keeps trying to reconnect."""
RECONNECT_ATTEMPTS = 200
REPLY_TIMEOUT = 30.0
POSITION = re.compile(rb'"acpBroker/position":\{"seq":(\d+),"epoch":"([^"]*)"')
UPDATE = b'"method":"session/update"'


class Watcher:
    """One client of one session, over as many connections as it takes."""

    def __init__(self, session: str, cwd: str) -> None:
        self.session = session
        self.cwd = cwd
        self.first = 0
        self.last = 0
        self.epoch = ""
        self.count = 0
        self.duplicates = 0
        self.gaps = 0
        self.client: WsClient | None = None
        self.waiting: asyncio.Future[bytes] | None = None
        self.lost_at = 0.0
        self.resumed_at = 0.0
        self.attempts = 0
        self.error = ""
        self._ids = 0

    def on_text(self, payload: bytes) -> None:
        if UPDATE in payload:
            match = POSITION.search(payload)
            if match is None:
                return
            seq = int(match[1])
            if not self.count:
                self.first, self.epoch = seq, match[2].decode()
            elif seq <= self.last:
                self.duplicates += 1
                return
            elif seq != self.last + 1:
                self.gaps += 1
            self.last = seq
            self.count += 1
            return
        waiting = self.waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(payload)

    async def _ask(self, method: str, params: dict[str, Any]) -> bytes:
        assert self.client is not None
        self._ids += 1
        self.waiting = asyncio.get_running_loop().create_future()
        frame = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        self.client.send_text(json.dumps(frame))
        reply = await asyncio.wait_for(self.waiting, REPLY_TIMEOUT)
        if b'"error"' in reply:
            raise RuntimeError(f"{method}: {reply.decode()[:300]}")
        return reply

    async def join(self, url: str) -> None:
        """Connect, initialize, resume: from the last position seen, once one was."""
        self.client = await connect(url, self.on_text)
        try:
            await self._ask("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            params: dict[str, Any] = {"sessionId": self.session, "cwd": self.cwd, "mcpServers": []}
            if self.count:
                position = {"seq": self.last, "epoch": self.epoch}
                params["_meta"] = {"acpBroker/replayAfter": position}
            await self._ask("session/resume", params)
        except BaseException:
            self.client.close()
            raise

    async def reconnect(self, survivor: str, limit: asyncio.Semaphore) -> None:
        """Wait for the connection to drop, then resume on ``survivor`` (bounded)."""
        assert self.client is not None
        await self.client.closed
        self.lost_at = time.time()
        deadline = time.monotonic() + RECONNECT_SECONDS
        for attempt in range(RECONNECT_ATTEMPTS):
            self.attempts = attempt + 1
            try:
                async with limit:
                    await self.join(survivor)
                self.resumed_at = time.time()
                return
            except Exception as exc:  # kept and retried; a watcher never resumed is reported
                self.error = repr(exc)[:200]
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(min(0.05 * 2**attempt, 1.0))

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def check(watchers: list[Watcher], first: dict[str, int], final: dict[str, int]) -> dict[str, Any]:
    """Whether each watcher got every event of its session from ``first`` to ``final``
    exactly once, and what the others lost or got twice."""
    exact = lost = duplicated = gaps = 0
    for w in watchers:
        want = final[w.session] - first[w.session] + 1
        got_all = w.count and w.first == first[w.session] and w.last == final[w.session]
        if got_all and w.count == want and not w.duplicates and not w.gaps:
            exact += 1
        lost += max(0, want - w.count)
        duplicated += w.duplicates
        gaps += w.gaps
    return {
        "watchers": len(watchers),
        "exact": exact,
        "lost": lost,
        "duplicated": duplicated,
        "gaps": gaps,
    }


async def main(config: dict[str, Any]) -> None:
    raise_nofile()
    limit = asyncio.Semaphore(int(config.get("concurrency", 200)))
    cwd = config.get("cwd", "/tmp")
    survivor = config["survivor"]
    watchers: list[Watcher] = []
    failures: list[str] = []

    async def one(url: str, session: str) -> None:
        watcher = Watcher(session, cwd)
        try:
            async with limit:
                await watcher.join(url)
            watchers.append(watcher)
        except Exception as exc:  # a join that failed is counted and printed, not hidden
            failures.append(repr(exc)[:200])

    await asyncio.gather(
        *(one(t["url"], t["session"]) for t in config["targets"] for _ in range(int(t["n"])))
    )
    print(
        "ready "
        + json.dumps(
            {"joined": len(watchers), "failed": len(failures), "first_failure": failures[:1]}
        ),
        flush=True,
    )
    reconnecting = [asyncio.create_task(w.reconnect(survivor, limit)) for w in watchers]

    # A check line carries every session's seqs.
    async for line in commands(LIFETIME, limit=1 << 24):
        command, _, arg = line.partition(" ")
        if command == "primed":
            print(f"primed {sum(1 for w in watchers if w.count)}", flush=True)
        elif command == "status":
            status = {
                "lost": sum(1 for w in watchers if w.lost_at),
                "resumed": sum(1 for w in watchers if w.resumed_at),
                "given_up": sum(
                    1
                    for w, t in zip(watchers, reconnecting, strict=True)
                    if t.done() and not w.resumed_at
                ),
            }
            print("status " + json.dumps(status), flush=True)
        elif command == "check":
            maps = json.loads(arg)
            out = check(watchers, maps["first"], maps["final"])
            moved = [w for w in watchers if w.lost_at]
            out["lost_at"] = [w.lost_at for w in moved]
            out["resumed_at"] = [w.resumed_at for w in moved]
            out["attempts"] = sum(w.attempts for w in moved)
            out["errors"] = sorted({w.error for w in moved if w.error})[:5]
            print("check " + json.dumps(out), flush=True)
        elif command in ("quit", ""):
            break
    for task in reconnecting:
        task.cancel()
    for watcher in watchers:
        watcher.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
