"""The registry of workload formats: what a format module declares, and how a file's format is chosen.

Each format module (native, sharegpt, jsonl, mooncake, azure) declares one `WorkloadFormat`: its name, `sniff`
(does this text look like a file of mine?) and `read` (the text in, a `Workload` out). The loader builds one
`FormatRegistry` from those declarations and asks it, by name when the caller forces a format, else through
`detect`; it never branches on format names itself.

Recognition asks every format. Some formats are special cases of another (a ShareGPT file is also a JSON list; a
Mooncake trace is also JSON lines of records) and say so in `refines`: when both claim a file, the special case
wins. Apart from that, formats claim disjoint sets of files, so the order they are listed in never decides; a file
no format claims goes to the default format, whose reader reports what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specproxy.workloads.corpus import CountTokens, PromptCorpus
from specproxy.workloads.sniff import WorkloadText
from specproxy.workloads.types import Workload, WorkloadError


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What the caller of the loader passes through to a format's reader.

    `count_tokens` measures text (trace prompt lengths, ShareGPT replies); `corpus` supplies the text trace prompts
    are made of, and is called only when a trace is read, because building it reads the built-in workloads;
    `limit` reads only the first items of a large file.
    """

    count_tokens: CountTokens
    corpus: Callable[[CountTokens], PromptCorpus] | None = None
    limit: int | None = None

    def trace_corpus(self, source: str) -> PromptCorpus:
        if self.corpus is None:
            raise WorkloadError(f"{source}: no text to rebuild the trace's prompts from")
        return self.corpus(self.count_tokens)


@dataclass(frozen=True, slots=True)
class WorkloadFormat:
    """One input format. `sniff` must be cheap and must not raise: it sees files of every kind, including broken
    ones. `read` raises `WorkloadError` for anything it cannot use. `refines` names the more general format this
    one is a special case of, if any."""

    name: str
    sniff: Callable[[WorkloadText], bool]
    read: Callable[[WorkloadText, ReadOptions], Workload]
    refines: str | None = None


@dataclass(frozen=True, slots=True)
class FormatRegistry:
    """The known formats, in the order messages list them, and the one a file no format claims is read as."""

    formats: tuple[WorkloadFormat, ...]
    default: str

    def __post_init__(self) -> None:
        names = self.names()
        if len(set(names)) != len(names):
            raise ValueError(f"workload format names must differ: {names}")
        for name in (self.default, *(f.refines for f in self.formats if f.refines is not None)):
            if name not in names:
                raise ValueError(f"workload format {name!r} is named but not registered")

    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.formats)

    def get(self, name: str, source: str) -> WorkloadFormat:
        """The format called `name`; an unknown name is a `WorkloadError` listing the known ones."""
        for f in self.formats:
            if f.name == name:
                return f
        raise WorkloadError(f"{source}: unknown format {name!r}; known formats: {', '.join(self.names())}")

    def claims(self, text: WorkloadText) -> tuple[WorkloadFormat, ...]:
        """The formats whose `sniff` says yes, less those a more specific claimant refines."""
        claimed = tuple(f for f in self.formats if f.sniff(text))
        refined = {f.refines for f in claimed}
        return tuple(f for f in claimed if f.name not in refined)

    def detect(self, text: WorkloadText) -> WorkloadFormat:
        """The format `text` is a file of: the one remaining claimant, else the default."""
        claims = self.claims(text)
        if len(claims) > 1:  # two formats that neither refines the other claim one file: their sniffs overlap
            raise AssertionError(f"{text.source}: claimed by {', '.join(f.name for f in claims)}")
        return claims[0] if claims else self.get(self.default, text.source)
