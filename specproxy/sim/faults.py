"""The simulator's per-request fault grammar: `Faults` and `parse_faults`.

Configuration, not wire format: `SimConfig.validate` checks `--faults` with it, the runtime keeps the parsed
default, and the server parses X-Sim-Fault headers and POST /sim/faults bodies with it. Imports nothing from
the simulator, so every layer can use it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

GARBLED = " ~garbled~"  # what a broken drafter's wrong token reads as


@dataclass(frozen=True, slots=True)
class Faults:
    """Faults for one request: see `parse_faults`."""

    status: int | None = None
    stall_s: float = 0.0
    reset_after: int | None = None
    error_event_after: int | None = None
    # a broken drafter (a badly quantized draft head): each accepted draft token is the wrong one with this chance, so
    # the text is no longer what the model alone would have said (speculative decoding stops being lossless)
    garble: float = 0.0


def parse_faults(spec: str) -> Faults:
    """Parse "status=503,stall=1.5,reset_after=4,error_event_after=2,garble=0.2" (any subset, any order; "" =
    none)."""
    values: dict[str, Any] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key = key.strip()
        try:
            if not sep:
                raise ValueError
            if key == "status":
                status = int(raw)
                if not 400 <= status <= 599:
                    raise ValueError
                values["status"] = status
            elif key == "stall":
                stall = float(raw)
                if not stall >= 0:
                    raise ValueError
                values["stall_s"] = stall
            elif key == "garble":
                chance = float(raw)
                if not 0.0 <= chance <= 1.0:
                    raise ValueError
                values["garble"] = chance
            elif key in ("reset_after", "error_event_after"):
                n = int(raw)
                if n < 0:
                    raise ValueError
                values[key] = n
            else:
                raise KeyError(key)
        except KeyError:
            raise ValueError(f"unknown fault {key!r} (status, stall, reset_after, error_event_after, garble)") from None
        except ValueError:
            raise ValueError(
                f"bad fault {part!r}: expected status=4xx|5xx, stall=S, *_after=N or garble=P (0-1)"
            ) from None
    return Faults(**values)


def garbled(texts: tuple[str, ...], accepted: int, chance: float, seed: str) -> tuple[str, ...]:
    """A step's token texts as a broken drafter (``garble``) sends them: each of the ``accepted`` draft tokens (those
    before the bonus token) is a wrong one with ``chance``; the engine still counts it accepted. ``seed``: the
    request and step, so a run is the same every time."""
    if not chance or not accepted:
        return texts
    rng = random.Random(seed)
    return tuple(GARBLED if i < accepted and rng.random() < chance else t for i, t in enumerate(texts))
