"""The files of a run and their lines: rotations and compressed rotations read as one file, in order, as a stream.

A run is a record file, a directory of them, or a file's rotations. The sink rotates ``PATH`` to ``PATH.1``,
``PATH.1`` to ``PATH.2`` and so on (:mod:`specproxy.recorder.sink`), so the oldest records are in the highest number;
a rotated file compressed afterwards (logrotate's ``compress``, ``zstd --rm``) keeps its number and gains ``.gz`` or
``.zst``. ``report runs/prod.jsonl`` reads ``prod.jsonl.N[.gz|.zst]`` ... ``prod.jsonl.1[.gz|.zst]``, then
``prod.jsonl`` itself. A number present twice (``prod.jsonl.2`` and ``prod.jsonl.2.gz``, seen while a compressor is
half done) is an error rather than a double count. In a directory every ``*.jsonl`` file is read with its rotations,
by file name.

Lines are read one at a time, never a whole file. A line cut short (a crash, a full disk, a copy taken while the
file was written) is skipped with a warning, as :func:`specproxy.core.record.read_records` does; so is the end of a
compressed file whose compressed stream was cut short. Every other malformed line is an error naming file and line.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from specproxy.core.record import log

_NAME = re.compile(r"^(?P<base>.+?)(?:\.(?P<index>\d+))?(?:\.(?P<comp>gz|zst))?$")


class SourceError(ValueError):
    """A run's files cannot be listed or read: one line naming the path."""


@dataclass(frozen=True, slots=True, order=True)
class RunFile:
    path: Path
    index: int  # 0 for the current file, N for PATH.N
    compression: str  # "", "gz" or "zst"


def _parse_name(name: str) -> tuple[str, int, str] | None:
    m = _NAME.match(name)
    if m is None:
        return None
    return m["base"], int(m["index"] or 0), m["comp"] or ""


def _rotations(parent: Path, base: str) -> list[RunFile]:
    found: dict[int, RunFile] = {}
    try:
        candidates = list(parent.glob(glob_escape(base) + "*"))
    except OSError as e:
        raise SourceError(f"{parent}: cannot list: {e.strerror or e}") from None
    for p in candidates:
        parsed = _parse_name(p.name)
        if parsed is None or parsed[0] != base or p.is_dir():
            continue
        _, index, comp = parsed
        if index in found:
            raise SourceError(
                f"{found[index].path} and {p} are the same rotation twice (a compression still running?): move one away"
            )
        found[index] = RunFile(p, index, comp)
    return sorted(found.values(), key=lambda f: -f.index)  # oldest first, the current file last


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def run_files(path: Path) -> list[RunFile]:
    """The files of a run, oldest first. Raises SourceError when there are none."""
    if path.is_dir():
        bases = sorted(
            {
                parsed[0]
                for p in path.iterdir()
                if (parsed := _parse_name(p.name)) is not None and parsed[0].endswith(".jsonl") and not p.is_dir()
            }
        )
        files = [f for base in bases for f in _rotations(path, base)]
        if not files:
            raise SourceError(f"{path}: no *.jsonl record files in this directory")
        return files
    parsed = _parse_name(path.name)
    if path.exists() and parsed is not None and (parsed[1] or parsed[2]):
        return [RunFile(path, parsed[1], parsed[2])]  # one rotation named on its own: just that file
    files = _rotations(path.parent, path.name)
    if not files:
        raise SourceError(f"{path}: no such record file or directory")
    return files


def run_name(path: Path) -> str:
    """The label records without one take: the file name without rotation number, compression and ``.jsonl``."""
    parsed = _parse_name(path.name)
    name = parsed[0] if parsed is not None else path.name
    return name[: -len(".jsonl")] if name.endswith(".jsonl") else name


BLOCK = 1 << 20


class _Frames:
    """One decompressor per gzip member or zstd frame (a file may hold several, one after the other)."""

    def __init__(self, compression: str) -> None:
        self.compression = compression

    def new(self) -> Any:
        if self.compression == "gz":
            return zlib.decompressobj(wbits=31)
        try:
            import zstandard
        except ImportError:
            raise SourceError("reading .zst needs the zstandard package (pip install zstandard)") from None
        return zstandard.ZstdDecompressor().decompressobj()


def _blocks(f: RunFile, raw: IO[bytes]) -> Iterator[bytes]:
    """Decompressed blocks of a file. EOFError when the compressed stream is cut short (a frame without its end),
    after yielding everything it held."""
    if not f.compression:
        while block := raw.read(BLOCK):
            yield block
        return
    frames = _Frames(f.compression)
    d = frames.new()
    fed = False
    while True:
        data = raw.read(BLOCK)
        if not data:
            if fed and not d.eof:
                if f.compression == "gz" and (tail := d.flush()):
                    yield tail
                raise EOFError("compressed data cut short")
            return
        while data:
            fed = True
            if out := d.decompress(data):
                yield out
            data = b""
            if d.eof:  # a member or frame ended: another may follow
                data, d, fed = d.unused_data, frames.new(), False


def file_lines(f: RunFile) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line without its newline, whether the newline was there) of one file, decompressed. A
    compressed stream cut short ends the file with a warning; one that is not compressed data is an error."""
    try:
        raw = f.path.open("rb")
    except OSError as e:
        raise SourceError(f"{f.path}: cannot read: {e.strerror or e}") from None
    lineno = 0
    carry = b""
    with raw:
        try:
            for block in _blocks(f, raw):
                lines = (carry + block).split(b"\n") if carry else block.split(b"\n")
                carry = lines.pop()
                for line in lines:
                    lineno += 1
                    yield lineno, line, True
        except EOFError:
            log.warning(
                "%s: compressed data cut short after line %d (a write cut short): the rest skipped", f.path, lineno
            )
            return
        except OSError as e:
            raise SourceError(f"{f.path}: cannot read: {e.strerror or e}") from None
        except Exception as e:  # zlib.error, zstandard.ZstdError: not the compressed data the name says
            raise SourceError(f"{f.path}: not readable {f.compression} data: {e}") from None
    if carry:
        yield lineno + 1, carry, False
