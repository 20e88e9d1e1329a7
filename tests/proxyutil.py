"""Start the proxy on port 0 in the test's event loop (or as its own process), against any upstream URL."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from specproxy.core.record import read_records
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.server import ProxyHandle, start_proxy
from specproxy.recorder.recorder import Recorder, RecorderConfig


class RunningProxy:
    """A proxy started as ``specproxy proxy`` starts it (its front doors, the fast lane's and aiohttp's), its
    bookkeeper on this loop; ``server.app`` is its app."""

    def __init__(self, handle: ProxyHandle, record: Path) -> None:
        self.handle = handle
        self.server = handle.runner
        self.record = record

    @property
    def url(self) -> str:
        return self.handle.url

    @property
    def recorder(self) -> Recorder:
        return self.handle.recorder

    async def flush(self) -> None:
        """Wait until no request is in flight and every record is written."""
        import asyncio

        rec = self.recorder
        for _ in range(500):
            if rec.idle:
                return
            await asyncio.sleep(0.01)

    def records(self) -> list[dict[str, object]]:
        return list(read_records(self.record)) if self.record.exists() else []


@asynccontextmanager
async def running_proxy(
    upstream: str, tmp_path: Path, *, metrics: bool = True, **overrides: object
) -> AsyncIterator[RunningProxy]:
    record = tmp_path / "records.jsonl"
    rec_over = {k[4:]: v for k, v in overrides.items() if k.startswith("rec_")}
    cfg_over = {k: v for k, v in overrides.items() if not k.startswith("rec_")}
    rcfg = RecorderConfig(
        record_path=str(record), metrics_url=upstream + "/metrics" if metrics else None, finalize_wait_s=3.0
    )
    cfg = ProxyConfig(upstream=upstream, port=0, recorder=replace(rcfg, **rec_over), **cfg_over)  # type: ignore[arg-type]
    handle = await start_proxy(cfg)
    try:
        yield RunningProxy(handle, record)
    finally:
        await handle.close()


@asynccontextmanager
async def proxy_process(upstream: str, record: Path, *args: str) -> AsyncIterator[tuple[str, object]]:
    """``specproxy proxy`` as a user runs it, in its own process; yields (its URL, the process)."""
    import asyncio
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specproxy",
        "proxy",
        "--upstream",
        upstream,
        "--listen",
        "127.0.0.1:0",
        "--record",
        str(record),
        *args,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 20)
        assert line.startswith(b"specproxy proxy: http://"), line
        yield line.split()[2].decode(), proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        if proc.stderr is not None and not proc.stderr.at_eof():
            # what it logged and nobody read: read to the end, so that the pipe (paused once its buffer filled)
            # sees its end and closes, instead of being found open when collected in a later test
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.stderr.read(), 10)


@asynccontextmanager
async def started_proxy(upstream: str, tmp_path: Path, **overrides: object) -> AsyncIterator[ProxyHandle]:
    """The proxy as ``specproxy proxy`` sets it up (its own site, so the request head's deadline too), in this event
    loop on port 0; closed (drained, records written) on leaving."""
    cfg = ProxyConfig(
        upstream=upstream,
        port=0,
        recorder=RecorderConfig(record_path=str(tmp_path / "records.jsonl"), finalize_wait_s=3.0),
        **overrides,  # type: ignore[arg-type]
    )
    handle = await start_proxy(cfg)
    try:
        yield handle
    finally:
        await handle.close()


async def raw_exchange(url: str, data: bytes, *, within_s: float = 5.0) -> bytes:
    """Send ``data`` as is on a new connection to ``url`` and read until the server closes it (or ``within_s``)."""
    import asyncio

    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), within_s)
    finally:
        writer.close()
