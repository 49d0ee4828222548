"""Parsing of the unit strings scenarios use: "250ms", "20%", "10mbit", "64kb".

Every parser takes a string (or a number, read in the base unit) and returns a float in
the base unit (seconds, fraction 0..1, bits per second, bytes). Errors name the value and
the accepted form; ambiguous units (``kbps``: bits or bytes?) are refused.
"""
from __future__ import annotations

import math
import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_RATE_UNITS = {
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
    "bps": 8, "kibps": 8 * 1024,  # tc's "bps" is bytes per second
}
_SIZE_UNITS = {"b": 1, "kb": 1000, "k": 1000, "kib": 1024, "mb": 1e6, "m": 1e6, "mib": 1024**2}

DURATION_FORM = 'a duration such as "250ms", "1.5s", "2m" (units: us, ms, s, m, h)'
PERCENT_FORM = 'a percentage such as "20%" or "0.5%" (0% to 100%)'
RATE_FORM = 'a rate such as "10mbit", "500kbit", "1gbit" (bits per second; "bps" = bytes/s as in tc)'
SIZE_FORM = 'a size such as "32kb", "1mib", "1500b"'


def _split(text: str, form: str) -> tuple[float, str]:
    match = re.fullmatch(_NUMBER + r"\s*([a-zA-Z%]*)", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not {form}")
    return float(match.group(1)), match.group(2).lower()


def parse_duration(value: str | float | int) -> float:
    """Seconds from "250ms" / "1.5s" / a bare number of seconds. Negative values are refused."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not {DURATION_FORM}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        if value.strip().startswith("-"):
            raise ValueError(f"{value!r} is negative; expected {DURATION_FORM}")
        number, unit = _split(value, DURATION_FORM)
        if unit == "":
            unit = "s"
        if unit not in _DURATION_UNITS:
            raise ValueError(f"{value!r}: unknown unit {unit!r}; expected {DURATION_FORM}")
        seconds = number * _DURATION_UNITS[unit]
    if not math.isfinite(seconds):  # YAML's .inf / .nan, or "1e999s"
        raise ValueError(f"{value!r} is not a finite time; expected {DURATION_FORM}")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative; expected {DURATION_FORM}")
    return seconds


def parse_percent(value: str | float | int) -> float:
    """A fraction in [0, 1] from "20%". Bare numbers are refused: is 0.2 20% or 0.2%?"""
    if not isinstance(value, str) or not value.strip().endswith("%"):
        raise ValueError(f"{value!r} is not {PERCENT_FORM}")
    number, _ = _split(value.strip()[:-1], PERCENT_FORM)
    if not 0.0 <= number <= 100.0:
        raise ValueError(f"{value!r} is out of range; expected {PERCENT_FORM}")
    return number / 100.0


def parse_rate(value: str) -> float:
    """Bits per second from "10mbit". "kbps"/"mbps" are refused as ambiguous."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not {RATE_FORM}")
    number, unit = _split(value, RATE_FORM)
    if unit in {"kbps", "mbps", "gbps"}:
        raise ValueError(f"{value!r} is ambiguous (bits or bytes?); write it as "
                         f"\"{number:g}{unit[0]}bit\"; expected {RATE_FORM}")
    if unit not in _RATE_UNITS:
        raise ValueError(f"{value!r}: unknown unit {unit!r}; expected {RATE_FORM}")
    bits = number * _RATE_UNITS[unit]
    if bits <= 0:
        raise ValueError(f"{value!r} must be positive; expected {RATE_FORM}")
    return bits


def parse_size(value: str | int) -> int:
    """Bytes from "32kb" or a bare integer of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), "b"
    elif isinstance(value, str):
        number, unit = _split(value, SIZE_FORM)
        unit = unit or "b"
    else:
        raise ValueError(f"{value!r} is not {SIZE_FORM}")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"{value!r}: unknown unit {unit!r}; expected {SIZE_FORM}")
    size = int(number * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"{value!r} must be positive; expected {SIZE_FORM}")
    return size


def format_duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.3g}s"
