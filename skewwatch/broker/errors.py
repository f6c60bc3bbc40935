"""The broker's one error type, and how a tool's output becomes the one line it quotes."""

from __future__ import annotations

import re


class BrokerError(RuntimeError):
    """The broker cannot be fetched, started or reached; the message says what to do, in one line."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def last_error_line(output: str) -> str:
    """The last line of ``output`` that looks like an error (else its last line), without colours.

    >>> last_error_line("[INFO] ok\\n[ERROR] Failed to resolve\\n[INFO] done")
    '[ERROR] Failed to resolve'
    """
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if "ERROR" in line or "Exception" in line or "Error" in line]
    return (errors or lines or ["no output"])[-1][:400]


__all__ = ["BrokerError", "last_error_line"]
