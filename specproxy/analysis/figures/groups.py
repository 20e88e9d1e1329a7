"""Records in groups by the fields a user names (``--by``), groups in the order each field's value first appeared, so
labels keep the order the runs were given. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from specproxy.analysis.figures.records import key_value
from specproxy.core.record import Record

GROUP_FIELDS = ("workload", "label", "model", "run_id", "repeat", "turn", "path", "method", "engine")
DEFAULT_GROUP_BY = ("workload", "label")
T = TypeVar("T")


class Grouping(Generic[T]):
    """Accumulators per group of records, keys in order of each field's first appearance."""

    def __init__(self, by: Sequence[str], make: Callable[[], T]) -> None:
        unknown = [f for f in by if f not in GROUP_FIELDS]
        if unknown or not by:
            raise ValueError(
                f"cannot group by {','.join(unknown) or '(nothing)'}; choose from {','.join(GROUP_FIELDS)}"
            )
        self.by = tuple(by)
        self.make = make
        self.groups: dict[tuple[str, ...], T] = {}
        self.first_seen: list[dict[str, int]] = [{} for _ in by]

    def get(self, rec: Record) -> T:
        key = tuple(key_value(rec, f) for f in self.by)
        acc = self.groups.get(key)
        if acc is None:
            for seen, v in zip(self.first_seen, key, strict=True):
                seen.setdefault(v, len(seen))
            acc = self.groups[key] = self.make()
        return acc

    def ordered(self) -> list[tuple[tuple[str, ...], T]]:
        return sorted(self.groups.items(), key=lambda kv: [s[v] for s, v in zip(self.first_seen, kv[0], strict=True)])


def group_records(records: Iterable[Record], by: Sequence[str]) -> dict[tuple[str, ...], list[Record]]:
    """Records per key, in :class:`Grouping`'s order, for the models that need a group's records themselves."""
    grouping: Grouping[list[Record]] = Grouping(by, list)
    for rec in records:
        grouping.get(rec).append(rec)
    return dict(grouping.ordered())
