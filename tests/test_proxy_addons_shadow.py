"""The shadow addon alone (specproxy/proxy/addons/shadow.py): its options' checks, and, given a live request's
meta, the shadow it sends to a candidate (a simulator), recorded into the live recorder's file and shown in its
status section. No relay, no bookkeeper, no command line."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specproxy.core.record import read_records
from specproxy.proxy.addons.base import Context, OptionError, SetupError
from specproxy.proxy.addons.shadow import ShadowAddon
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.shadow import ShadowConfig
from specproxy.recorder.config import RecorderConfig
from specproxy.recorder.recorder import Recorder
from specproxy.recorder.trace import RequestMeta
from tests.simutil import chat_body, running_sim

CTX = Context(upstream="http://127.0.0.1:9", warn=lambda _: None, on_command_line=lambda _: True)


def _values(**given: Any) -> dict[str, Any]:
    values: dict[str, Any] = {o.name: o.default for o in ShadowAddon.options}
    return values | given


def test_without_shadow_the_addon_is_off() -> None:
    assert ShadowAddon.configure(_values(), CTX) is None
    cfg = ShadowAddon.with_settings(ProxyConfig(upstream="http://127.0.0.1:9"), None)
    assert ShadowAddon.create(cfg) is None
    families = list(ShadowAddon.collector(None).collect())  # there for dashboards, empty
    assert families and all(not f.samples for f in families)


def test_the_options_become_its_settings(tmp_path: Path) -> None:
    cred = tmp_path / "cred"
    cred.write_text("Bearer s3cret\n")
    os.chmod(cred, 0o600)
    settings = ShadowAddon.configure(
        _values(shadow=["a=http://127.0.0.1:9", "b=http://127.0.0.1:10/"], shadow_share=0.5, shadow_workload=["code"],
                shadow_credentials_file=[f"b={cred}"]),
        CTX,
    )  # fmt: skip
    assert isinstance(settings, ShadowConfig)
    assert [(t.label, t.url, t.authorization) for t in settings.targets] == [
        ("a", "http://127.0.0.1:9", None),
        ("b", "http://127.0.0.1:10", "Bearer s3cret"),
    ]
    assert settings.share == 0.5 and settings.workloads == frozenset({"code"}) and settings.max_inflight == 4
    assert "s3cret" not in repr(settings)
    cfg = ShadowAddon.with_settings(ProxyConfig(upstream="http://127.0.0.1:9"), settings)
    assert ShadowAddon.settings(cfg) is settings


@pytest.mark.parametrize(
    ("given", "error", "says"),
    [
        ({"shadow_workload": ["code"]}, OptionError, "need --shadow"),
        ({"shadow": ["a=http://h:1", "a=http://h:2"]}, OptionError, "labels must differ"),
        ({"shadow": ["a=http://h:1"], "shadow_share": 1.5}, OptionError, "--shadow-share must be in (0, 1]"),
        ({"shadow": ["a=http://h:1"], "shadow_timeout": 0.0}, OptionError, "--shadow-timeout must be positive"),
        ({"shadow": ["a=http://h:1"], "shadow_credentials_file": ["a=/nonexistent"]}, SetupError, "/nonexistent"),
    ],
)
def test_bad_options_are_one_line_naming_the_option(given: dict[str, Any], error: type[Exception], says: str) -> None:
    with pytest.raises(error) as raised:
        ShadowAddon.configure(_values(**given), CTX)
    assert says in str(raised.value) and "\n" not in str(raised.value)


async def test_a_live_request_offered_is_shadowed_recorded_and_shown(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    async with running_sim() as cand, aiohttp.ClientSession() as session:
        settings = ShadowAddon.configure(_values(shadow=[f"cand={cand.url}"], shadow_share=1.0), CTX)
        rcfg = RecorderConfig(record_path=str(record), finalize_wait_s=3.0)
        addon = ShadowAddon.create(ShadowAddon.with_settings(ProxyConfig(upstream=cand.url, recorder=rcfg), settings))
        assert addon is not None
        live = Recorder(rcfg, session)
        await live.start()
        await addon.start(live)
        try:
            meta = RequestMeta(method="POST", path="/v1/chat/completions", workload="code", model="m",
                               body=chat_body(temperature=0, max_tokens=16), stream_requested=True)  # fmt: skip
            assert addon.request(meta) is True  # greedy: the live text is wanted, to compare with the shadow's
            deadline = asyncio.get_running_loop().time() + 30
            while addon.status()["candidates"]["cand"]["outcomes"].get("ok") != 1:
                assert asyncio.get_running_loop().time() < deadline, addon.status()
                await asyncio.sleep(0.01)
            st = addon.status()
            assert st["offered"] == st["sampled"] == 1 and st["candidates"]["cand"]["sent"] == 1
        finally:
            await addon.stop()
            await live.close()
    (shadow,) = list(read_records(record))
    assert shadow["label"] == "cand" and shadow["shadow_of"] == meta.request_id and shadow["outcome"] == "ok"
