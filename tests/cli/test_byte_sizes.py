"""The one byte formatter (corral/units.py): binary units, as the settings are written."""

from __future__ import annotations

from corral.units import fmt_bytes


def test_binary_units_one_decimal() -> None:
    assert fmt_bytes(0) == "0 B"
    assert fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(1024) == "1.0 KiB"
    assert fmt_bytes(2000) == "2.0 KiB"
    assert fmt_bytes(512 * 1024 * 1024) == "512.0 MiB"
    assert fmt_bytes(1.5 * 1024**3) == "1.5 GiB"
    assert fmt_bytes(3 * 1024**5) == "3072.0 TiB"  # nothing above TiB


def test_a_value_that_rounds_up_to_the_next_unit_is_written_in_it() -> None:
    assert fmt_bytes(1024 * 1024 - 1) == "1.0 MiB"  # not "1024.0 KiB"
    assert fmt_bytes(1024 * 1024 - 52) == "1023.9 KiB"
