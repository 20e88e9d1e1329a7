"""What-if replay of speculative proposers on recorded token ids: no engine, no GPU (docs/whatif.md)."""

from specproxy.whatif.ngram import Replay, propose, replay

__all__ = ["Replay", "propose", "replay"]
