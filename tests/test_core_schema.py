"""The record's field table (core/schema.py) against what it describes: the TypedDict, the export's columns and the
table in docs/records.md. A field added to one and not the others fails here."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from specproxy.analysis.export import COLUMNS
from specproxy.core.record import Record
from specproxy.core.schema import FIELDS, by_name, markdown_table

DOCS = Path(__file__).resolve().parent.parent / "docs" / "records.md"


def _kinds(hint: Any) -> tuple[set[str], bool]:
    """The JSON kinds a type hint allows, and whether it allows null."""
    args = get_args(hint) if get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds: set[str] = set()
    for a in args:
        if a is type(None):
            continue
        origin = get_origin(a) or a
        if a is Any:
            kinds |= {"any"}
        elif origin in (list, tuple):
            kinds.add("list")
        elif origin is dict or typing.is_typeddict(a):
            kinds.add("object")
        else:
            kinds.add({int: "int", float: "float", str: "str", bool: "bool"}[origin])
    return kinds, type(None) in args or Any in args


def test_every_field_of_the_record_has_a_row_in_order() -> None:
    assert [n for f in FIELDS for n in f.names] == list(Record.__annotations__)


def test_the_types_in_the_table_are_the_types_in_code() -> None:
    hints = get_type_hints(Record)
    bad = []
    for name, hint in hints.items():
        if get_origin(hint) is typing.NotRequired:
            (hint,) = get_args(hint)
        kinds, nullable = _kinds(hint)
        doc = by_name()[name].type
        said = doc.split(" or ")[0].split(",")[0].split(" of ")[0]  # "list of [offset_s, tokens]" -> "list"
        said = {"object": "object", "list": "list"}.get(said, said)
        if "any" not in kinds and said not in kinds:
            bad.append((name, doc, kinds))
        if "or null" in doc and not nullable:
            bad.append((name, doc, "says null, the type has no None"))
    assert bad == []


def test_every_export_column_belongs_to_a_field_and_every_field_says_how_it_is_exported() -> None:
    columns = [name for name, _, _ in COLUMNS]
    claimed = [c for f in FIELDS if isinstance(f.export, tuple) for c in f.export]
    assert sorted(claimed) == sorted(columns)
    for f in FIELDS:
        if isinstance(f.export, str):
            assert f.export.strip(), f.names  # a reason, not an empty string
    # the scalar fields are columns of their own name
    for f in FIELDS:
        if isinstance(f.export, tuple) and f.type.split(" or ")[0] in ("int", "float", "str", "bool"):
            assert set(f.names) <= set(f.export), f


def test_the_docs_table_is_the_table_in_code() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert markdown_table() in text, "regenerate: python -m specproxy.core.schema, into docs/records.md's table"
