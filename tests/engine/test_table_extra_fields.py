"""The format: "keep the reader strict about the fields below and lenient about extra fields"."""

from __future__ import annotations

import copy
import json
import math

import pytest

from fasta_sm.backends.replay import load_table
from fasta_sm.errors import TableError


@pytest.mark.parametrize("where", ["top", "row", "nested"])
def test_a_key_repeated_inside_an_extra_field_does_not_refuse_the_table(where, tmp_path, table_data):
    text = json.dumps(table_data)
    if where == "top":  # another recorder's metadata, written twice
        text = text.replace('"kernel": ', '"note": "a", "note": "b", "kernel": ', 1)
    elif where == "row":
        text = text.replace('"duration_us": ', '"note": 1, "note": 2, "duration_us": ', 1)
    else:
        text = text.replace('"kernel": ', '"env": {"HOST": "a", "HOST": "b"}, "kernel": ', 1)
    path = tmp_path / "extra_twice.json"
    path.write_text(text)
    assert len(load_table(path).configs) == len(table_data["configs"])


def test_a_key_repeated_in_a_documented_field_is_still_refused_naming_file_row_and_key(tmp_path, table_data):
    text = json.dumps(table_data).replace('"BLOCK_M": ', '"BLOCK_M": 8, "BLOCK_M": ', 1)
    path = tmp_path / "kwargs_twice.json"
    path.write_text(text)
    with pytest.raises(TableError, match=r"key 'BLOCK_M' appears twice in configs\[0\]"):
        load_table(path)


@pytest.mark.parametrize("where", ["top", "row"])
def test_an_extra_field_holding_an_escaped_byte_does_not_refuse_the_table(where, tmp_path, table_data):
    """Python's json writes a surrogate-escaped byte (a non-UTF-8 path in argv, say) as "\\udcff"."""
    data = copy.deepcopy(table_data)
    if where == "top":
        data["command"] = "record --out /tmp/\udcff"
    else:
        data["configs"][0]["note"] = "\udcff"
    path = tmp_path / "extra_escape.json"
    path.write_text(json.dumps(data))  # ensure_ascii: the file is ASCII, valid UTF-8
    assert len(load_table(path).configs) == len(table_data["configs"])


def test_a_rows_options_written_twice_is_refused(tmp_path, table_data):
    text = json.dumps(table_data).replace(
        '"duration_us": ', '"options": {"num_ctas": 2}, "options": {"num_ctas": 1}, "duration_us": ', 1)
    path = tmp_path / "options_twice.json"
    path.write_text(text)
    with pytest.raises(TableError, match="'options' appears twice"):
        load_table(path)


def test_a_table_written_with_a_utf8_byte_order_mark_loads_as_without_one(tmp_path, table_data):
    path = tmp_path / "with_bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(table_data).encode())
    assert len(load_table(path).configs) == len(table_data["configs"])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_or_infinity_literal_in_shape_is_refused_naming_file_and_field(literal, tmp_path, table_data):
    """`shape` is a documented field and the file is JSON, which has no such literal: the recorder refuses
    to write one there, so the reader must not take one."""
    data = copy.deepcopy(table_data)
    data["shape"] = {"M": 64, "alpha": "X"}
    path = tmp_path / "nan_shape.json"
    path.write_text(json.dumps(data).replace('"X"', literal))
    with pytest.raises(TableError, match=rf"nan_shape\.json: shape holds {literal}"):
        load_table(path)


def test_a_nan_literal_in_an_extra_field_does_not_refuse_the_table(tmp_path, table_data):
    """Python's json writes NaN by default: another recorder's metadata may hold one."""
    path = tmp_path / "nan_extra.json"
    path.write_text(json.dumps({**table_data, "timing": {"warmup_ms": math.nan}}))
    assert len(load_table(path).configs) == len(table_data["configs"])
