"""Canonical JSON, so that a hash or signature over a document means one thing.

The encoding follows RFC 8785 (JSON Canonicalization Scheme): object keys sorted by
their UTF-16 code units, no insignificant whitespace, strings as UTF-8 with only the
mandatory escapes, and numbers written the way ECMAScript writes a double (shortest
round-trip digits), so an auditor can recompute a hash with any JCS library.  NaN and
infinities have no JSON form and are refused rather than written ambiguously.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

GENESIS_HASH = "0" * 64


class CanonicalError(ValueError):
    """A value has no canonical JSON form."""


def canonical_json(value: Any) -> str:
    """The RFC 8785 text of ``value`` (dicts, lists, tuples, str, int, float, bool, None)."""
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def canonical_bytes(value: Any) -> bytes:
    return canonical_json(value).encode("utf-8")


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def canonical_hash(value: Any) -> str:
    """sha256 hex of the canonical UTF-8 bytes of ``value``."""
    return sha256_hex(canonical_bytes(value))


def canonical_time(moment: datetime) -> str:
    """An aware datetime as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC (naive is refused)."""
    if moment.tzinfo is None:
        raise CanonicalError("naive datetime: attach a time zone before hashing it")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(format_number(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise CanonicalError(f"object keys must be strings, got {type(key).__name__}")
        out.append("{")
        for index, key in enumerate(sorted(value, key=lambda k: k.encode("utf-16-be"))):
            if index:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise CanonicalError(f"no canonical JSON form for {type(value).__name__}")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(text: str) -> str:
    chunks = ['"']
    for char in text:
        if char in _ESCAPES:
            chunks.append(_ESCAPES[char])
        elif ord(char) < 0x20:
            chunks.append(f"\\u{ord(char):04x}")
        elif 0xD800 <= ord(char) <= 0xDFFF:
            raise CanonicalError("lone surrogate in string")
        else:
            chunks.append(char)
    chunks.append('"')
    return "".join(chunks)


def format_number(number: float) -> str:
    """ECMAScript Number::toString of a finite double (RFC 8785 section 3.2.2.3)."""
    if math.isnan(number) or math.isinf(number):
        raise CanonicalError("NaN and infinity have no JSON form")
    if number == 0:
        return "0"  # also -0.0
    if number < 0:
        return "-" + format_number(-number)
    # Shortest round-trip digits d1..dk and exponent n with value = 0.d1..dk * 10^n.
    _, digit_tuple, exponent = Decimal(repr(number)).as_tuple()
    if not isinstance(exponent, int):  # pragma: no cover - finite numbers only reach here
        raise CanonicalError("not a finite number")
    all_digits = "".join(map(str, digit_tuple))
    digits = all_digits.rstrip("0")
    n = exponent + len(all_digits)
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    exp = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{mantissa}e{'+' if exp >= 0 else '-'}{abs(exp)}"
