"""Test helpers: run ``skewwatch`` commands as a user does, and check their one-line errors."""

from __future__ import annotations

import subprocess
import time

from tests.integration.listening import listening_addresses


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The whole of stderr is one ``Error: ...`` line holding ``words``, with no traceback and no
    "Unclosed ..." warning, and the exit code is ``code`` (skewwatch/errors.py). Returns the line."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def wait_listening(process: subprocess.Popen[bytes] | subprocess.Popen[str], port: int,
                   address: str | None = None, timeout: float = 60) -> None:
    """Until ``port`` is listening (on ``address``, if given) while ``process`` runs."""
    deadline = time.monotonic() + timeout
    while True:
        found = listening_addresses(port)
        if found and (address is None or found == {address}):
            return
        assert process.poll() is None, f"exited with {process.returncode}"
        assert time.monotonic() < deadline, f"nothing listens on {port} after {timeout:.0f} s"
        time.sleep(0.2)
