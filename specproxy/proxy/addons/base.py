"""What an addon is: a feature of the proxy beside relaying and recording, in one module.

An addon declares its options (each with its type, default and help; its ``group`` heads them in ``specproxy proxy
--help``), turns their values into its settings (:meth:`Addon.configure`, which checks them), and, in the
bookkeeper, runs: it hears every record and every inference request, may keep a task of its own, adds its section
to ``/specproxy/status`` and its families to the proxy's ``/metrics``. The bookkeeper knows addons only through this
class; the command line only through :class:`Option` and :meth:`Addon.configure`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Self

from prometheus_client.registry import Collector

from specproxy.core.record import Record
from specproxy.proxy.config import ProxyConfig
from specproxy.recorder.trace import RequestMeta

if TYPE_CHECKING:
    from specproxy.recorder.recorder import Recorder


class OptionError(ValueError):
    """An option's value that cannot be taken: one line that names the option (a usage error)."""


class SetupError(ValueError):
    """An option that names something unusable, such as a file that cannot be read: one line."""


@dataclass(frozen=True, slots=True)
class Option:
    """One command-line option of an addon, also a key of a ``--config`` file (its flag without the dashes)."""

    flag: str  # e.g. "--shadow-share"
    type: Any  # str, int, float, bool, pathlib.Path, or list[str] for a repeatable option
    default: Any
    help: str
    show_default: bool = True

    @property
    def name(self) -> str:
        """The value's key in what :meth:`Addon.configure` is given: the flag as a Python name."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True, slots=True)
class Context:
    """What an addon's options are checked against: the upstream's URL, where warnings go, and whether an option
    was given on the command line (where every local user can read it) rather than in a ``--config`` file."""

    upstream: str
    warn: Callable[[str], None]
    on_command_line: Callable[[str], bool]


class Addon:
    """A feature of the proxy. The class declares and configures it; an instance is the feature running in the
    bookkeeper (:meth:`create`), and its event methods do nothing unless the addon overrides them."""

    name: ClassVar[str]  # its section in /specproxy/status, and its settings' key in ProxyConfig.addons
    group: ClassVar[str]  # its options' heading in --help
    options: ClassVar[tuple[Option, ...]] = ()

    # -- the command line --------------------------------------------------------------------------------------------
    @classmethod
    def configure(cls, values: dict[str, Any], ctx: Context) -> object | None:
        """The addon's settings from its options' values (by :attr:`Option.name`), checked; None: the addon is off.
        Raises :class:`OptionError` or :class:`SetupError`."""
        return None

    @classmethod
    def settings(cls, cfg: ProxyConfig) -> object | None:
        """The addon's settings in ``cfg`` (None: off)."""
        return cfg.addons.get(cls.name)

    @classmethod
    def with_settings(cls, cfg: ProxyConfig, settings: object | None) -> ProxyConfig:
        """``cfg`` holding the addon's settings (what :meth:`configure` returned)."""
        if settings is None:
            return cfg
        return replace(cfg, addons={**cfg.addons, cls.name: settings})

    # -- in the bookkeeper -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, cfg: ProxyConfig) -> Self | None:
        """The running addon for ``cfg``, or None where it is off."""
        raise NotImplementedError

    @classmethod
    def collector(cls, running: Self | None) -> Collector | None:
        """Its families in the proxy's ``/metrics`` (also while it is off, so that dashboards find them)."""
        return None

    def observe(self, rec: Record) -> None:
        """Every record, once written."""

    def request(self, meta: RequestMeta) -> bool:
        """An inference request began (its body parsed, its workload known): whether its response text is wanted
        (then :meth:`response_text` hears it before its record)."""
        return False

    def response_text(self, request_id: str, text: str) -> None:
        """The text of a response whose request asked for it."""

    async def start(self, recorder: Recorder) -> None:
        """The bookkeeper starts, with its recorder (whose sink may take the addon's own records)."""

    async def stop(self) -> None:
        """The proxy stops; the recorder still takes records."""

    async def close(self) -> None:
        """The last record is written."""

    def status(self) -> dict[str, Any] | None:
        """Its section of ``/specproxy/status`` (None: none)."""
        return None
