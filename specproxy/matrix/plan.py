"""The one request list every configuration is measured with, derived once from the matrix and the workloads.

Each workload contributes exactly ``requests`` requests per repeat whatever the number of prompts its file holds:
its items in the load generator's order (file order, or shuffled per pass with the seed), cycling when the file
holds fewer. Warm-up requests are the first ``warmup`` entries of the load generator's mixed plan over all
workloads. The model in each body is left empty here and filled per configuration (each may serve its model under
another name); nothing else in a body differs between configurations. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import islice

import orjson

from specproxy.loadgen.plan import BodyOptions, PlannedRequest, iter_plan
from specproxy.matrix.spec import MatrixSpec
from specproxy.workloads import Workload


@dataclass(frozen=True, slots=True)
class MatrixPlan:
    warmup: tuple[PlannedRequest, ...]
    per_workload: tuple[tuple[str, tuple[PlannedRequest, ...]], ...]  # (workload name, its requests per repeat)
    repeats: int
    concurrency: int

    @property
    def measured(self) -> int:
        """Measured requests per configuration, over all repeats."""
        return self.repeats * sum(len(reqs) for _, reqs in self.per_workload)

    def fingerprint(self) -> str:
        """A hash of every request body and the order they go in: equal plans, equal fingerprints."""
        h = hashlib.sha256()
        h.update(f"{self.repeats}\0{self.concurrency}\0".encode())
        for entry in self.warmup:
            h.update(b"w" + orjson.dumps(entry.body, option=orjson.OPT_SORT_KEYS))
        for name, reqs in self.per_workload:
            h.update(name.encode() + b"\0")
            for entry in reqs:
                h.update(entry.path.encode() + orjson.dumps(entry.body, option=orjson.OPT_SORT_KEYS))
        return h.hexdigest()[:16]


def build_plan(spec: MatrixSpec, workloads: Sequence[Workload]) -> MatrixPlan:
    opts = BodyOptions(model="", endpoint=spec.endpoint, max_tokens=spec.max_tokens)
    warm = tuple(islice(iter_plan(workloads, opts, spec.seed), spec.warmup))
    per = tuple(
        (wl.name, tuple(islice(iter_plan([wl], opts, spec.seed), spec.requests))) for wl in workloads
    )  # one workload at a time: exactly `requests` of it, cycling through its items
    return MatrixPlan(warmup=warm, per_workload=per, repeats=spec.repeats, concurrency=spec.concurrency)


def with_model(entries: Sequence[PlannedRequest], model: str) -> list[PlannedRequest]:
    """The same requests addressed to ``model``."""
    return [replace(e, body={**e.body, "model": model}) for e in entries]
