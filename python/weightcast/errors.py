"""The exceptions of weightcast; each carries the Go side's text, which names
the group, the rank and the bucket where they apply."""

import builtins


class Error(Exception):
    """A weightcast failure. ``code`` is the C library's status code."""

    def __init__(self, text, code=-1):
        super().__init__(text)
        self.code = code


class ConfigError(Error, ValueError):
    """Bad options or input (also: a closed Sender or Receiver): change them.
    ``field`` is the keyword at fault ("bucket"), or None."""

    def __init__(self, text, code=-2, field=None):
        super().__init__(text, code)
        self.field = field


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran past its deadline (the ``timeout`` option)."""


class PeerGoneError(Error):
    """Another rank died or left; the text names it."""


class ChecksumError(Error):
    """A received bucket's bytes did not match the checksum the sender sent."""


# C status codes (weightcast.h) to classes.
_BY_CODE = {
    -2: ConfigError,
    -3: TimeoutError,
    -4: PeerGoneError,
    -5: ChecksumError,
    -6: ConfigError,
}


# The library names a setting by its field (the JSON key, as C callers
# write it); Python names it as the keyword, `bucket=`. The keywords of
# Sender and Receiver are the fields' names; those that are not keywords
# are named as the library names them.
_KEYWORDS = {"quantize_include": None, "quantize_exclude": None, "direct": None, "turns": None}


def keyword(field, value):
    """How Python names field given value: ``bucket=100``, or the field
    alone where it is no keyword or its value is not repeated."""
    if _KEYWORDS.get(field, field) is None or not value:
        return field + (" " + value if value else "")
    return f"{field}={value}"


def from_code(code, text, detail=None):
    """The exception of a status code, its text naming a configuration
    field (detail, from the library) as Python's keyword."""
    cls = _BY_CODE.get(code, Error)
    if detail and issubclass(cls, ConfigError):
        text = detail["prefix"] + keyword(detail["field"], detail["value"]) + detail["problem"]
        return cls(text, code, detail["field"])
    return cls(text, code)
