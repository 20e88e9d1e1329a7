"""``--shadow``: a share of live requests also sent to candidate servers, each pair compared (docs/shadow.md).

The sending, recording and comparing are :class:`~specproxy.proxy.shadow.Shadower`'s; this addon declares the
options, checks them, and hands the Shadower the bookkeeper's events.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Self

from prometheus_client.registry import Collector

from specproxy.core.record import Record
from specproxy.proxy.addons.base import Addon, Context, Option, OptionError, SetupError
from specproxy.proxy.config import CredentialsError, ProxyConfig, read_credentials_file
from specproxy.proxy.shadow import ShadowCollector, ShadowConfig, Shadower, parse_target
from specproxy.recorder.recorder import Recorder
from specproxy.recorder.trace import RequestMeta


class ShadowAddon(Addon):
    name = "shadow"
    group = "Shadow candidates"
    options = (
        Option(
            "--shadow",
            list[str] | None,
            None,
            "LABEL=URL: a candidate server (same model, another speculative configuration) that also gets a share of "
            "live requests; compared per workload in /specproxy/status (repeatable; docs/shadow.md).",
        ),
        Option("--shadow-share", float, 0.05, "Share of live requests shadowed (0-1)."),
        Option("--shadow-max-inflight", int, 4, "Shadows in flight per candidate at most; past it, none is sent."),
        Option("--shadow-seed", int, 0, "Seed of the draw of shadowed requests."),
        Option(
            "--shadow-timeout", float, 300.0, "Seconds without a byte from a candidate before a shadow is given up."
        ),
        Option(
            "--shadow-workload",
            list[str] | None,
            None,
            "Shadow only this workload's requests (repeatable; default: all).",
        ),
        Option(
            "--shadow-credentials-file",
            list[str] | None,
            None,
            "LABEL=PATH: the Authorization a candidate's shadows carry, from a file as --upstream-credentials-file "
            "reads it (repeatable).",
        ),
    )

    def __init__(self, shadower: Shadower) -> None:
        self.shadower = shadower

    @classmethod
    def configure(cls, values: dict[str, Any], ctx: Context) -> ShadowConfig | None:
        specs: list[str] = values["shadow"] or []
        workloads: list[str] = values["shadow_workload"] or []
        credentials: list[str] = values["shadow_credentials_file"] or []
        if not specs:
            if workloads or credentials:
                raise OptionError("--shadow-workload and --shadow-credentials-file need --shadow")
            return None
        try:
            targets = tuple(parse_target(s) for s in specs)
        except ValueError as e:
            raise OptionError(str(e)) from None
        labels = [t.label for t in targets]
        if len(set(labels)) != len(labels):
            raise OptionError(f"--shadow labels must differ, got {', '.join(labels)}")
        for spec in credentials:
            label, sep, path = spec.partition("=")
            if not sep or label not in labels:
                raise OptionError(f"--shadow-credentials-file wants LABEL=PATH with a --shadow label, got {spec!r}")
            try:
                auth = read_credentials_file(path)
            except CredentialsError as e:
                raise SetupError(str(e)) from None
            targets = tuple(replace(t, authorization=auth) if t.label == label else t for t in targets)
        share, max_inflight, timeout = values["shadow_share"], values["shadow_max_inflight"], values["shadow_timeout"]
        if not 0.0 < share <= 1.0:
            raise OptionError(f"--shadow-share must be in (0, 1], got {share}")
        if max_inflight < 1:
            raise OptionError(f"--shadow-max-inflight must be at least 1, got {max_inflight}")
        if timeout <= 0:
            raise OptionError(f"--shadow-timeout must be positive, got {timeout}")
        return ShadowConfig(
            targets, share, max_inflight, values["shadow_seed"], timeout, workloads=frozenset(workloads)
        )

    @classmethod
    def create(cls, cfg: ProxyConfig) -> Self | None:
        settings = cls.settings(cfg)
        return None if not isinstance(settings, ShadowConfig) else cls(Shadower(settings, cfg.recorder))

    @classmethod
    def collector(cls, running: Self | None) -> Collector:
        return ShadowCollector(running.shadower if running is not None else None)

    def request(self, meta: RequestMeta) -> bool:
        return self.shadower.offer(meta)  # a greedy pair's live text is compared with its shadow's

    def response_text(self, request_id: str, text: str) -> None:
        self.shadower.live_text(request_id, text)

    def observe(self, rec: Record) -> None:
        self.shadower.live_record(rec)

    async def start(self, recorder: Recorder) -> None:
        await self.shadower.start(recorder.sink)  # its candidates' records go to the proxy's record file

    async def stop(self) -> None:
        await self.shadower.close()  # shadows in flight are cut; their records go in before the sink closes

    def status(self) -> dict[str, Any]:
        return self.shadower.status()
