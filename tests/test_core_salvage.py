"""Whole records inside a damaged line of a record file (specproxy.core.salvage.glued_tail)."""

from __future__ import annotations

import orjson

from specproxy.core.salvage import MAX_STARTS, RECORD_START, glued_tail

WHOLE = b'{"schema_version":4,"request_id":"b","x":[1,2]}'


def test_the_whole_record_behind_a_cut_one_is_found() -> None:
    line = b'{"schema_version":4,"request_id":"a","x":[1,' + WHOLE + b"\n"
    assert glued_tail(line) == WHOLE
    assert orjson.loads(glued_tail(line) or b"")["request_id"] == "b"


def test_behind_several_cut_records_the_last_whole_one_is_found() -> None:
    line = b'{"schema_version":4,"request_id":"a",' + b'{"schema_version":4,"request_id":"c","x":' + WHOLE
    assert glued_tail(line) == WHOLE


def test_a_whole_line_or_one_that_is_not_a_record_gives_none() -> None:
    assert glued_tail(WHOLE) is None  # the record itself is no tail (starts are tried after the first byte)
    assert glued_tail(b"") is None
    assert glued_tail(b"garbage " + WHOLE) is None  # does not start like JSON
    assert glued_tail(b'{"schema_version":4,"request_id":"a"') is None  # cut short, nothing behind it


def test_a_tail_that_parses_but_is_no_record_gives_none() -> None:
    assert glued_tail(b'{"a":' + RECORD_START + b"4}") is None  # no request_id
    assert glued_tail(b'{"a":' + RECORD_START + b'4,"request_id":"x"}}') is None  # not JSON: one brace too many


def test_the_starts_tried_per_line_are_bounded() -> None:
    cut = b'{"schema_version":4,"x":'
    assert glued_tail(cut * (MAX_STARTS - 1) + WHOLE) == WHOLE
    assert glued_tail(cut * (MAX_STARTS + 1) + WHOLE) is None
