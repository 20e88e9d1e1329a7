"""The memory-bandwidth ceiling of decoding, and how much of it a measurement reaches.

At batch 1 every decode step streams the active weights once, so

    ceiling tok/s = bandwidth / bytes read per token = bandwidth / (active_params * bytes_per_param + extra_bytes)

where ``extra_bytes`` is whatever else is read per token (KV cache, activations), 0 unless given; an MoE counts its
active parameters only.
Speculative decoding emits several tokens per weight read, so a measurement can exceed 100% of this ceiling.
When the engine reported bytes read (vLLM's ``vllm:estimated_read_bytes_per_gpu_total``, recorded per request as
``read_bytes_per_token``), that measured figure replaces the estimate. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_BIN = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}
_NUM = r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*"
_COUNT_RE = re.compile(_NUM + r"([kmbgtp]?)\s*", re.IGNORECASE)
_BYTES_RE = re.compile(_NUM + r"([kmgtp]i?)?\s*(b(?:ytes?)?)?\s*(/\s*s(?:ec)?)?\s*", re.IGNORECASE)


def parse_count(text: str) -> float:
    """``27B``, ``3e9``, ``350M``, ``1.5T``, ``27000000000`` -> a number of parameters. ValueError otherwise."""
    m = _COUNT_RE.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a parameter count (e.g. 27B, 3e9, 350M)")
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{text!r} must be positive")
    return value


def parse_bytes(text: str, *, rate: bool = False) -> float:
    """``1.7TB/s``, ``1700GB/s``, ``1.7e12``, ``900GiB/s`` (``rate``) or ``5GB``, ``2e9`` -> bytes (per second)."""
    m = _BYTES_RE.fullmatch(text)
    what = "a bandwidth (e.g. 1.7TB/s, 1700GB/s, 1.7e12)" if rate else "a byte size (e.g. 5GB, 2e9)"
    if not m or (m.group(4) and not rate):
        raise ValueError(f"{text!r} is not {what}")
    prefix = (m.group(2) or "").lower()
    scale = _BIN[prefix] if prefix in _BIN else _SUFFIX[prefix]
    value = float(m.group(1)) * scale
    if value < 0 or (rate and value == 0):
        raise ValueError(f"{text!r} must be positive")
    return value


@dataclass(frozen=True, slots=True)
class Roofline:
    params: float
    active_params: float
    bytes_per_param: float
    extra_bytes_per_token: float
    bandwidth_bytes_s: float

    @property
    def bytes_per_token(self) -> float:
        return self.active_params * self.bytes_per_param + self.extra_bytes_per_token

    @property
    def ceiling_tok_s(self) -> float:
        return self.bandwidth_bytes_s / self.bytes_per_token

    def fraction(self, measured_tok_s: float) -> float:
        return measured_tok_s / self.ceiling_tok_s


def roofline(
    params: float,
    bytes_per_param: float,
    bandwidth_bytes_s: float,
    active_params: float | None = None,
    extra_bytes_per_token: float = 0.0,
) -> Roofline:
    """Validated :class:`Roofline`. ``active_params`` defaults to ``params`` (a dense model)."""
    active = params if active_params is None else active_params
    if not (params > 0 and active > 0 and bandwidth_bytes_s > 0):
        raise ValueError("params, active params and bandwidth must be positive")
    if active > params:
        raise ValueError("active params cannot exceed params")
    if not 0 < bytes_per_param <= 8:
        raise ValueError(f"bytes per param must be in (0, 8], got {bytes_per_param}")
    if extra_bytes_per_token < 0:
        raise ValueError("extra bytes per token must be >= 0")
    return Roofline(params, active, bytes_per_param, extra_bytes_per_token, bandwidth_bytes_s)
