"""The proxy's addons: each feature beside relaying and recording, one module each (:mod:`.base` says what an addon
is). :data:`REGISTRY` is every addon, in the order their sections appear in ``/specproxy/status`` and their options in
``specproxy proxy --help``; a new feature is a new module here and one line in it."""

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
