"""``specproxy replay``: re-send a recording's request bodies in their original order and rhythm.

:func:`plan_replay` (pure) turns records into timed requests: ordered by ``started_at``, offsets are the original
inter-arrival times divided by ``speed`` (all zero at max speed), each keeps its workload and points back at the
original ``request_id`` (``replay_of``), so two replays of one recording against two server configurations pair up
request by request. Requests that cannot be re-sent (recorded without a body or with one that is not a JSON object,
not a POST, or with a path that is not a plain absolute path) are counted, and the counts are reported; none is
skipped silently. The path check matters: the URL is the target followed by the path, so a tampered path
(``@host/x``) would send the body elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from specproxy.core.record import Record
from specproxy.core.schedule import scaled_offsets
from specproxy.loadgen.client import Client, open_loop
from specproxy.loadgen.plan import PlannedRequest
from specproxy.loadgen.runner import DriveResult, Reporter, drive
from specproxy.loadgen.target import Target
from specproxy.recorder.recorder import RecorderConfig


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    timed: tuple[tuple[float, PlannedRequest], ...]
    recorded: int  # records read
    no_body: int  # POSTs recorded without a body (--capture none)
    not_post: int  # other methods (GET /v1/models ...): nothing to re-send
    no_time: int  # records without a start time
    bad_path: int  # paths that are not a plain absolute path ("/..."): never sent
    not_json: int  # bodies kept as text: not JSON, or nested too deep to capture

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(e.workload for _, e in self.timed))

    def notes(self) -> list[str]:
        out = []
        if self.no_body:
            out.append(
                f"{self.no_body} of {self.recorded} recorded requests had no body "
                "(recorded with --capture none): not replayed"
            )
        if self.not_json:
            out.append(
                f"{self.not_json} of {self.recorded} recorded requests had a body that is not a JSON object "
                "(text, or nested too deep to capture): not replayed"
            )
        if self.not_post:
            out.append(f"{self.not_post} of {self.recorded} recorded requests were not POSTs: not replayed")
        if self.no_time:
            out.append(f"{self.no_time} of {self.recorded} recorded requests had no started_at: not replayed")
        if self.bad_path:
            out.append(
                f"{self.bad_path} of {self.recorded} recorded requests had a path that does not start with a single "
                "'/' (or holds spaces or control characters): not replayed"
            )
        return out


@dataclass(frozen=True, slots=True)
class _Resend:
    body: dict[str, Any]
    workload: str
    request_id: str
    path: str


def sendable_path(path: str) -> bool:
    """Whether a recorded path can follow the target in a URL and stay on the target: an origin-form request target
    (RFC 9112 3.2.1: it starts with "/"), not "//" (a network-path reference to another host, RFC 3986 4.2), and no
    whitespace, control characters or backslashes (never in a valid path, and read by some clients as separators).
    ``"@evil:80/x"`` after ``http://target:8000`` would make the target userinfo and send the body to evil."""
    return (
        path.startswith("/")
        and not path.startswith("//")
        and not any(c.isspace() or c == "\\" or ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in path)
    )


def plan_replay(records: Iterable[Record], *, speed: float | None, model: str | None = None) -> ReplayPlan:
    """``speed`` None: as fast as the concurrency cap allows. ``model`` replaces every body's model when given.

    ``records`` may be a stream: of each record only what is re-sent is kept (start time, body, path, workload, id),
    never its chunk timeline or response text, so a plan costs what its bodies cost."""
    recorded = no_body = not_post = no_time = bad_path = not_json = 0
    keep: list[tuple[float, _Resend]] = []
    for rec in records:
        recorded += 1
        started = rec["started_at"]
        if rec["method"].upper() != "POST":
            not_post += 1
        elif rec["request"] is None:
            no_body += 1
        elif not isinstance(rec["request"], dict):
            not_json += 1
        elif rec["path"] and not sendable_path(rec["path"]):
            bad_path += 1
        elif started is None:
            no_time += 1
        else:
            keep.append((float(started), _Resend(rec["request"], rec["workload"], rec["request_id"], rec["path"])))
    keep.sort(key=lambda tr: tr[0])  # stable: equal start times keep the file's order
    offsets = scaled_offsets([t for t, _ in keep], speed) if speed is not None else [0.0] * len(keep)
    timed: list[tuple[float, PlannedRequest]] = []
    for i, (offset, (_, resend)) in enumerate(zip(offsets, keep, strict=True)):
        body = dict(resend.body)
        if model is not None:
            body["model"] = model
        entry = PlannedRequest(
            index=i,
            workload=resend.workload,
            item_id=resend.request_id,
            path=resend.path or "/v1/chat/completions",
            body=body,
            replay_of=str(resend.request_id),
        )
        timed.append((offset, entry))
    return ReplayPlan(tuple(timed), recorded, no_body, not_post, no_time, bad_path, not_json)


async def run_replay(
    plan: ReplayPlan,
    *,
    target: Target,
    recorder_cfg: RecorderConfig,
    cap: int | None = None,
    reporter: Reporter | None = None,
    handle_signals: bool = True,
) -> DriveResult:
    async def send(client: Client) -> None:
        await open_loop(client, iter(plan.timed), repeat=None, cap=cap)

    return await drive(
        target=target,
        recorder_cfg=recorder_cfg,
        workloads=plan.workloads,
        send=send,
        reporter=reporter,
        handle_signals=handle_signals,
    )
