"""broker.front.acp.flow: a connection's pace."""

from __future__ import annotations

from broker.front.acp.flow import Pace


def test_a_pace_lets_in_what_its_bucket_holds_and_a_refund_gives_it_back() -> None:
    pace = Pace(rate=1.0)  # a full bucket: bursts of 2, refilled at 1 a second
    assert pace.take(2)
    assert not pace.take(1)  # nothing left, nothing spent (a second has not passed)
    pace.refund(2)
    assert pace.take(2)
    assert pace.spend(1) > 0  # owed: a wait before reading on
