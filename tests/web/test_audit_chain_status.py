"""The audit page's chain status never walks the whole chain (issue 15): it starts at
the last keyed seal (without one it stops at a fixed number of events:
tests/domain/test_seals.py)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deletion.domain import audit
from deletion.domain.audit import audit_append
from deletion.domain.seals import SealKeys, audit_seal
from deletion.web.domain_session import domain_session

KEY = SealKeys(b"s" * 32)


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every audit row the verification walk reads, counted at the one place it reads them."""
    counts: list[int] = []
    original = audit._row_batches

    def counting(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for batch in original(*args, **kwargs):
            counts.append(len(batch))
            yield batch

    monkeypatch.setattr(audit, "_row_batches", counting)
    return counts


def _append(count: int) -> int:
    with domain_session() as session:
        for i in range(count):
            audit_append(session, actor="system:test", action="test.event", object_type="t",
                         object_ref=str(i))
        return audit_append(session, actor="system:test", action="test.event", object_type="t",
                            object_ref="last").seq


def test_verifying_from_the_page_reads_only_the_events_after_the_last_seal(
        client_as: Any, walked: list[int]) -> None:
    _append(200)
    with domain_session() as session:
        sealed = audit_seal(session, keys=KEY).seal
    assert sealed is not None
    head = _append(9)
    client = client_as("auditor")
    walked.clear()  # the sealer's own walk is not the page's

    plain = client.get("/audit/").content.decode()
    assert sum(walked) == 0  # an ordinary page read verifies nothing beyond its own rows
    assert f"seq {sealed.sealed_seq}" in plain and f"{head - sealed.sealed_seq} events since" in plain

    page = client.get("/audit/", {"verify": "chain"}).content.decode()
    assert sum(walked) == head - sealed.sealed_seq == 10
    assert f"The chain verifies from seal {sealed.id}" in page
