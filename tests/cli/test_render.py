"""How figures read in `show`, `ls` and `report`."""

from __future__ import annotations

from fasta_sm.render import format_us, human_age


def test_a_duration_that_rounds_to_a_thousand_microseconds_reads_in_milliseconds():
    assert format_us(999.996) == "1.000 ms" and format_us(999.99) == "999.99 µs"


def test_an_age_reads_in_whole_units_rounded_down():
    assert [human_age(s) for s in (59.7, 3599, 86399, 90000)] == ["59s", "59m", "23h", "1d"]
