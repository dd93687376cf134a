"""The exceptions of weightcast; each carries the Go side's text, which names
the group, the rank and the bucket where they apply."""

import builtins


class Error(Exception):
    """A weightcast failure. ``code`` is the C library's status code."""

    def __init__(self, text, code=-1):
        super().__init__(text)
        self.code = code


class ConfigError(Error, ValueError):
    """Bad options or input (also: a closed Sender or Receiver): change them."""


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


def from_code(code, text):
    return _BY_CODE.get(code, Error)(text, code)
