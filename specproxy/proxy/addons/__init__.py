"""The proxy's addons: each feature beside relaying and recording, one module each (:mod:`.base` says what an addon
is). :data:`REGISTRY` is every addon, in the order their sections appear in ``/specproxy/status`` and their options
in ``specproxy proxy --help``.

A new feature is a module here with a subclass of :class:`~specproxy.proxy.addons.base.Addon` (its ``name``,
``group`` and ``options``; :meth:`~.base.Addon.configure` to check them, :meth:`~.base.Addon.create` to run it, and
the events it needs), and its class added to :data:`REGISTRY`. Nothing else changes: its options join the command
line under its group, and may come from ``--config``; its settings travel in ``ProxyConfig.addons`` under its name,
to the bookkeeper's process too; its status section and metrics join the proxy's own.
"""

from __future__ import annotations

from specproxy.proxy.addons.advice import AdviceAddon
from specproxy.proxy.addons.base import Addon
from specproxy.proxy.addons.buffering import BufferingAddon
from specproxy.proxy.addons.otlp import OtlpAddon
from specproxy.proxy.addons.shadow import ShadowAddon
from specproxy.proxy.addons.slo import SloAddon

REGISTRY: tuple[type[Addon], ...] = (
    SloAddon,
    OtlpAddon,
    BufferingAddon,
    AdviceAddon,
    ShadowAddon,
)
