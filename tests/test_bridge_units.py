"""The stdio bridge's pure parts: the backoff, the URL ring and the state it resumes from."""

from __future__ import annotations

from typing import Any

import pytest

from broker.clients.backoff import Backoff, UrlRing
from broker.clients.resume import (
    BRIDGE_ID_PREFIX,
    LOST_OUTCOME,
    REPLAY_AFTER_META,
    BridgeState,
    RecoveryKind,
)
from broker.protocol.jsonrpc import RpcError
from broker.protocol.render import LET_GO_META, POSITION_META
from broker.protocol.turns import (
    PROMPT_ID_META,
    PROMPT_OUTCOME,
    client_prompt_id,
    outcome_of,
    outcome_query,
)

SID = "sess_0123456789abcdef0123456789abcdef"


# -- backoff -------------------------------------------------------------------------------


def test_the_first_attempt_goes_at_once_then_pauses_grow_with_jitter_to_a_cap() -> None:
    backoff = Backoff(give_up_after=1000, initial=0.1, factor=2, maximum=1.0, uniform=lambda: 1)
    pauses = [backoff.delay(0.0) for _ in range(7)]
    assert pauses == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    low = Backoff(give_up_after=1000, initial=0.1, uniform=lambda: 0)
    assert [low.delay(0.0) for _ in range(3)] == [0.0, 0.05, 0.1]  # half of the base at least


def test_backoff_gives_up_past_its_bound_and_starts_over_after_a_reset() -> None:
    backoff = Backoff(give_up_after=10, uniform=lambda: 1)
    assert backoff.delay(100.0) == 0.0
    assert backoff.delay(105.0) is not None
    pause = backoff.delay(109.99)
    assert pause is not None and pause <= 0.01 + 1e-9  # never past the bound
    assert backoff.delay(110.0) is None
    backoff.reset()
    assert backoff.delay(500.0) == 0.0


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(give_up_after=-1)


def test_the_url_ring_moves_on_only_when_a_url_fails() -> None:
    ring = UrlRing(["ws://a/acp", "ws://b/acp"])
    assert ring.current == "ws://a/acp"
    ring.failed()
    assert ring.current == "ws://b/acp"
    ring.failed()
    assert ring.current == "ws://a/acp"
    with pytest.raises(ValueError):
        UrlRing([])


# -- state ---------------------------------------------------------------------------------


def _request(msg_id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def _update(seq: int, kind: str = "agent_message_chunk", text: str = "x") -> dict[str, Any]:
    update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    meta = {POSITION_META: {"seq": seq, "epoch": "e1"}}
    params = {"sessionId": SID, "update": update, "_meta": meta}
    return {"jsonrpc": "2.0", "method": "session/update", "params": params}


def _with_session(version: int = 1) -> BridgeState:
    state = BridgeState()
    state.connected()
    state.from_editor(_request(0, "initialize", protocolVersion=version))
    state.from_broker({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": version}})
    state.from_editor(_request(1, "session/new", cwd="/w", mcpServers=[]))
    state.from_broker({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": SID}})
    return state


def test_a_new_connection_initializes_again_and_resumes_after_the_last_update() -> None:
    state = _with_session()
    assert state.from_broker(_update(5)).to_editor
    state.lost()
    state.connected()
    [init] = state.handshake()
    assert init["method"] == "initialize" and init["id"].startswith(BRIDGE_ID_PREFIX)
    assert init["params"] == {
        "protocolVersion": 1,
        "_meta": {"clientInstanceId": state.client_instance},  # the same on every connection
    }
    [(sid, resume)] = state.resumes()
    assert sid == SID and resume["method"] == "session/resume"
    assert resume["params"]["cwd"] == "/w"
    assert resume["params"]["_meta"] == {REPLAY_AFTER_META: {"seq": 5, "epoch": "e1"}}


def test_a_session_with_nothing_forwarded_is_loaded_whole_and_v2_resumes_by_replay_from() -> None:
    state = _with_session()
    state.lost()
    [(_, request)] = state.resumes()
    assert request["method"] == "session/load"
    v2 = _with_session(version=2)
    v2.from_broker(_update(3))
    [(_, request)] = v2.resumes()
    assert request["params"]["replayFrom"] == {
        "type": "_acpbroker_position",
        "seq": 4,
        "epoch": "e1",
    }


def test_updates_already_forwarded_are_dropped_and_an_events_updates_share_a_seq() -> None:
    state = _with_session()
    assert state.from_broker(_update(5)).to_editor
    assert state.from_broker(_update(5, text="second update of the same event")).to_editor
    assert not state.from_broker(_update(4)).to_editor
    assert state.from_broker(_update(6)).to_editor


def test_the_editors_own_load_gets_the_whole_replay_let_go_or_not() -> None:
    for let_go in (False, True):
        state = _with_session()
        for seq in range(1, 6):
            assert state.from_broker(_update(seq)).to_editor
        if let_go:  # the broker let the session go to make room for a newer one
            notice = _update(6, kind="notice")
            notice["params"]["update"]["_meta"] = {LET_GO_META: True}
            assert state.from_broker(notice).to_editor
            assert state.resumes() == []
        state.from_editor(_request(2, "session/load", sessionId=SID, cwd="/w", mcpServers=[]))
        replay = [state.from_broker(_update(seq)).to_editor for seq in range(1, 6)]
        assert all(replay), let_go  # every update of the replay reaches the editor
        state.from_broker({"jsonrpc": "2.0", "id": 2, "result": {}})
        [(_, resume)] = state.resumes()  # and a drop now resumes after the replay's last
        assert resume["params"]["_meta"] == {REPLAY_AFTER_META: {"seq": 5, "epoch": "e1"}}


def test_closed_sessions_are_not_resumed() -> None:
    state = _with_session()
    state.from_editor(_request(2, "session/close", sessionId=SID))
    state.from_broker({"jsonrpc": "2.0", "id": 2, "result": {}})
    assert state.resumes() == []


def test_requests_in_flight_are_resent_when_safe_awaited_when_prompts_else_failed() -> None:
    state = _with_session()
    sent = state.from_editor(_request(3, "session/prompt", sessionId=SID, prompt=[{"t": 1}]))
    assert sent is not None
    prompt_id = sent["params"]["_meta"][PROMPT_ID_META]
    listing = _request(4, "session/list")
    assert state.from_editor(listing) is listing  # unchanged: sent as the editor wrote it
    made = state.from_editor(_request(5, "session/new", cwd="/w", mcpServers=[]))
    state.from_editor(_request(6, "_vendor/launch", what="rockets"))
    state.lost()
    state.connected()
    by_id = {r.editor_id: r for r in state.recoveries()}
    assert by_id[3].kind is RecoveryKind.AWAIT_PROMPT
    assert by_id[3].message["method"] == PROMPT_OUTCOME
    assert by_id[3].message["params"] == {"sessionId": SID, "promptId": prompt_id}
    assert by_id[4].kind is RecoveryKind.RESEND and by_id[4].message == listing
    # Named by an operation id, a session/new goes again: the broker answers the first's.
    assert by_id[5].kind is RecoveryKind.RESEND and by_id[5].message == made
    assert made["params"]["_meta"]["operationId"]
    assert by_id[6].kind is RecoveryKind.ANSWER
    assert by_id[6].message["error"]["code"] == LOST_OUTCOME
    # The prompt's answer: what the outcome request was answered.
    reply = state.prompt_settled(3, {"id": "x", "result": {"stopReason": "end_turn"}})
    assert reply == {"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}}
    assert state.recoveries() == []  # the listing went again on this connection


def test_a_question_asked_again_reaches_the_editor_once_and_its_answer_goes_to_the_new_id() -> None:
    state = _with_session()
    ask = _request(70, "session/request_permission", sessionId=SID, toolCall={"id": "t"})
    assert state.from_broker(ask).to_editor == [ask]
    state.lost()
    state.connected()
    again = {**ask, "id": 9, "params": {**ask["params"], "_meta": {"trace": "other"}}}
    assert state.from_broker(again).to_editor == []  # the editor has it already
    answer = {"jsonrpc": "2.0", "id": 70, "result": {"outcome": "allowed"}}
    assert state.from_editor(answer) == {**answer, "id": 9}


def test_an_answer_given_during_the_outage_answers_the_next_ask() -> None:
    state = _with_session()
    ask = _request(70, "session/request_permission", sessionId=SID, toolCall={"id": "t"})
    state.from_broker(ask)
    state.lost()
    answer = {"jsonrpc": "2.0", "id": 70, "result": {"outcome": "allowed"}}
    assert state.from_editor(answer) is None  # kept: no connection asks it now
    state.connected()
    routed = state.from_broker({**ask, "id": 11})
    assert routed.to_editor == [] and routed.to_broker == [{**answer, "id": 11}]


def test_an_initialize_in_flight_at_the_drop_gets_the_handshakes_answer() -> None:
    state = BridgeState()
    state.connected()
    state.from_editor(_request(0, "initialize", protocolVersion=1))
    state.lost()
    state.connected()
    [handshake] = state.handshake()
    assert handshake["method"] == "initialize"
    state.initialized = {"protocolVersion": 1}
    [recovery] = state.recoveries()
    assert recovery.kind is RecoveryKind.ANSWER
    assert recovery.message == {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}


def test_the_editors_own_prompt_replayed_after_a_drop_is_not_echoed() -> None:
    state = _with_session()
    state.from_broker(_update(5))
    block = {"type": "text", "text": "hello"}
    state.from_editor(_request(3, "session/prompt", sessionId=SID, prompt=[block, block]))
    state.lost()
    state.connected()
    echo = _update(6, kind="user_message_chunk", text="hello")
    assert not state.from_broker(echo).to_editor
    assert not state.from_broker(_update(6, kind="user_message_chunk", text="hello")).to_editor
    assert state.from_broker(_update(7)).to_editor
    # Another person's prompt, later, is shown.
    assert state.from_broker(_update(9, kind="user_message_chunk", text="hello")).to_editor


def test_a_named_prompt_and_its_outcome() -> None:
    assert client_prompt_id({"_meta": {PROMPT_ID_META: "abc-1"}}) == "abc-1"
    assert client_prompt_id({}) is None
    with pytest.raises(RpcError):
        client_prompt_id({"_meta": {PROMPT_ID_META: "no spaces"}})
    assert outcome_query({"sessionId": SID, "promptId": "p1"}) == (SID, "p1")
    with pytest.raises(RpcError):
        outcome_query({"sessionId": SID})
    result = {"stopReason": "end_turn", "_meta": {"k": 1}}
    assert outcome_of({"type": "prompt_end", "stopReason": "end_turn", "result": result}) == result
    with pytest.raises(RpcError) as failed:
        outcome_of({"type": "prompt_end", "error": {"code": -32603, "message": "agent died"}})
    assert failed.value.code == -32603 and failed.value.message == "agent died"


def test_an_answer_lost_with_the_connection_answers_the_broker_asking_again() -> None:
    state = _with_session()
    ask = _request(70, "session/request_permission", sessionId=SID, toolCall={"id": "t"})
    state.from_broker(ask)
    answer = {"jsonrpc": "2.0", "id": 70, "result": {"outcome": "allowed"}}
    assert state.from_editor(answer) == answer  # sent: then the connection dropped
    assert state.from_broker({**ask, "id": 71}).to_editor  # same link: a new question
    state.lost()
    state.connected()
    routed = state.from_broker({**ask, "id": 12})
    assert routed.to_editor == [] and routed.to_broker == [{**answer, "id": 12}]


def test_a_withdrawn_question_is_withdrawn_under_the_editors_id() -> None:
    state = _with_session()
    ask = _request(70, "session/request_permission", sessionId=SID, toolCall={"id": "t"})
    state.from_broker(ask)
    state.lost()
    state.connected()
    state.from_broker({**ask, "id": 9})
    withdraw = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 9}}
    [told] = state.from_broker(withdraw).to_editor
    assert told["params"] == {"requestId": 70}
    assert state.questions == {}


def test_a_cancel_of_a_prompt_in_flight_is_sent_again_after_a_drop() -> None:
    state = _with_session()
    state.from_editor(_request(3, "session/prompt", sessionId=SID, prompt=[{"t": 1}]))
    cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SID}}
    state.from_editor(cancel)
    state.lost()
    state.connected()
    kinds = [(r.kind, r.message.get("method")) for r in state.recoveries()]
    assert kinds == [
        (RecoveryKind.RESEND, "session/cancel"),
        (RecoveryKind.AWAIT_PROMPT, PROMPT_OUTCOME),
    ]
