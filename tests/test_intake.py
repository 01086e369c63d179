"""The intake, fed frames with no socket and no store: what each request is answered, how
(in this step, when a read lands, in a task), and how frames are paced."""

from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.front.acp.dispatch import IN_TASK, InTask, PendingRead, StepAnswer
from broker.front.acp.flow import Pace
from broker.front.acp.intake import Intake
from broker.front.acp.lifetime import Lifetime
from broker.protocol.jsonrpc import Request, Response, RpcError

from .conftest import make_settings


class RecordingOutbox:
    def __init__(self) -> None:
        self.frames: list[Any] = []

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None:
        self.frames.append(json.loads(text))

    def send_encoded(self, parts: tuple[bytes, ...]) -> None:
        self.frames.append(json.loads(b"".join(parts)))


@dataclass
class Owner:
    id: str = "c1"
    principal: Any = None
    protocol_version: int | None = 2
    pace: Pace = field(default_factory=lambda: Pace(1000.0))
    answers: list[Response] = field(default_factory=list)
    holds: list[bool] = field(default_factory=list)

    def answers_for_client(self, message: Response) -> None:
        self.answers.append(message)

    def reading_held(self, held: bool) -> None:
        self.holds.append(held)


@dataclass
class Methods:
    """Methods that answer ``echo`` in a task, ``now`` in the step, ``read`` when a future
    lands, and ``wait`` once released."""

    settings: Any = field(default_factory=lambda: make_settings(max_requests_in_flight=4))
    access: Any = None
    read: asyncio.Future[Any] | None = None
    fallback: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    dispatched: list[str] = field(default_factory=list)

    async def dispatch(self, conn: Any, request: Request) -> Any:
        self.dispatched.append(request.method)
        if request.method == "wait":
            await self.release.wait()
        if request.method == "refuse":
            raise RpcError(-32602, "refused")
        return {"echo": request.method}

    def at_once(self, conn: Any, request: Request) -> StepAnswer | None:
        if request.method == "now":
            return lambda conn, request: {"now": True}
        if request.method == "later":
            return lambda conn, request: IN_TASK
        if request.method == "read":
            assert self.read is not None
            finish = self._finish
            return lambda conn, request: PendingRead(self.read, finish)  # type: ignore[arg-type]
        return None

    def _finish(self, future: asyncio.Future[Any]) -> Any:
        if self.fallback:
            return InTask()
        return {"read": future.result()}


_OWNERS: list[Owner] = []
"""The test's connections (an intake holds its own weakly, as a connection holds it)."""


def _intake(methods: Methods | None = None, owner: Owner | None = None) -> tuple[Intake, Any]:
    loop = asyncio.get_running_loop()
    outbox = RecordingOutbox()
    owner = owner or Owner()
    _OWNERS[:] = [owner]
    methods = methods or Methods()
    intake = Intake(weakref.ref(owner), methods, outbox, Lifetime(loop), loop, holds=True)  # type: ignore[arg-type]
    return intake, outbox


def _request(msg_id: Any, method: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": {}})


async def _settled() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_request_that_needs_a_wait_is_answered_from_its_task() -> None:
    intake, outbox = _intake()
    assert intake.take_frame_now(_request(1, "echo"))
    assert outbox.frames == [] and 1 in intake.inflight
    await _settled()
    assert outbox.frames == [{"jsonrpc": "2.0", "id": 1, "result": {"echo": "echo"}}]
    assert intake.inflight == {}


async def test_a_step_answer_is_sent_in_the_step_that_read_the_request() -> None:
    intake, outbox = _intake()
    assert intake.take_frame_now(_request(2, "now"))
    assert outbox.frames == [{"jsonrpc": "2.0", "id": 2, "result": {"now": True}}]


async def test_a_step_answer_may_hand_the_request_to_a_task() -> None:
    methods = Methods()
    intake, outbox = _intake(methods)
    intake.take_frame_now(_request(3, "later"))
    await _settled()
    assert methods.dispatched == ["later"]
    assert outbox.frames == [{"jsonrpc": "2.0", "id": 3, "result": {"echo": "later"}}]


@pytest.mark.parametrize("fallback", [False, True])
async def test_a_pending_read_is_answered_when_it_lands_or_handed_to_a_task(
    fallback: bool,
) -> None:
    methods = Methods(read=asyncio.get_running_loop().create_future(), fallback=fallback)
    intake, outbox = _intake(methods)
    intake.take_frame_now(_request(4, "read"))
    assert 4 in intake.inflight and outbox.frames == []  # in flight, as a task would be
    assert methods.read is not None
    methods.read.set_result("page")
    await _settled()
    expected = {"echo": "read"} if fallback else {"read": "page"}
    assert outbox.frames == [{"jsonrpc": "2.0", "id": 4, "result": expected}]
    assert intake.inflight == {}


async def test_a_refusal_is_answered_with_its_error_and_the_same_id() -> None:
    intake, outbox = _intake()
    intake.take_frame_now(_request("r", "refuse"))
    await _settled()
    assert outbox.frames == [
        {"jsonrpc": "2.0", "id": "r", "error": {"code": -32602, "message": "refused"}}
    ]


async def test_a_batch_is_answered_in_one_array_once_every_entry_is() -> None:
    intake, outbox = _intake()
    batch = f"[{_request(1, 'echo')},{_request(2, 'now')}]"
    intake.take_frame_now(batch)
    await _settled()
    [array] = outbox.frames
    assert sorted(reply["id"] for reply in array) == [1, 2]


async def test_a_second_request_with_an_id_in_flight_is_refused() -> None:
    methods = Methods()
    intake, outbox = _intake(methods)
    intake.take_frame_now(_request(5, "wait"))
    intake.take_frame_now(_request(5, "echo"))
    assert outbox.frames[0]["error"]["code"] == -32600 and outbox.frames[0]["id"] == 5
    methods.release.set()
    await _settled()


async def test_a_cancelled_request_is_answered_request_cancelled() -> None:
    intake, outbox = _intake()
    intake.take_frame_now(_request(6, "wait"))
    await _settled()
    cancel = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 6}}
    intake.take_frame_now(json.dumps(cancel))
    await _settled()
    assert outbox.frames == [
        {"jsonrpc": "2.0", "id": 6, "error": {"code": -32800, "message": "request cancelled"}}
    ]
    assert intake.inflight == {}


async def test_an_answer_to_this_side_goes_to_the_connection() -> None:
    intake, _ = _intake()
    intake.take_frame_now('{"jsonrpc":"2.0","id":9,"result":{}}')
    assert _OWNERS[0].answers == [Response(9, {}, None)]


async def test_past_its_pace_a_frame_waits_and_the_connection_is_told_it_is_held() -> None:
    # A bucket of 2 that refills a token a second: a loaded machine's stall between two
    # takes does not refill it (one of 50 a second did, after 100 takes).
    owner = Owner(pace=Pace(1.0))
    intake, outbox = _intake(owner=owner)
    for n in range(2):
        assert intake.take_frame_now(_request(n, "now"))
    assert not intake.take_frame_now(_request(2, "now"))  # nothing done: it must wait
    assert len(outbox.frames) == 2 and owner.holds == []
    await asyncio.wait_for(intake.take_frame(_request(2, "now")), 30)
    assert len(outbox.frames) == 3 and owner.holds == [True, False]
