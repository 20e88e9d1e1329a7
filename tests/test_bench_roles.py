"""What the bench reads from the proxy's status between two phases (specproxy.bench.roles.shed_delta): the chunk
events shed, the records flagged and the records lost during the phase, or nothing known when a status is missing."""

from __future__ import annotations

from typing import Any

from specproxy.bench.roles import shed_delta


def _status(chunk: int, requests: int, lost: int, body: int = 0) -> dict[str, Any]:
    shed = {"chunk": chunk, "body": body} if chunk or body else {}
    return {"bookkeeping": {"shed": shed, "shed_requests": requests, "lost_records": lost}}


def test_the_phases_own_counts_are_the_difference() -> None:
    assert shed_delta(_status(10, 2, 1), _status(25, 5, 1, body=3)) == {
        "shed_chunks": 15,
        "shed_requests": 3,
        "lost_records": 0,
    }


def test_a_kind_never_shed_counts_zero() -> None:
    assert shed_delta(_status(0, 0, 0), _status(0, 0, 2))["shed_chunks"] == 0


def test_without_either_status_nothing_is_known() -> None:
    unknown = {"shed_chunks": None, "shed_requests": None, "lost_records": None}
    assert shed_delta(None, _status(1, 1, 1)) == unknown
    assert shed_delta(_status(1, 1, 1), None) == unknown
