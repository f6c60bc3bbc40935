"""How a long-running command that is not a Faust worker stops: SIGTERM and SIGINT end it cleanly.

A Kubernetes pod or a systemd unit is stopped with SIGTERM; Python's default for it kills the process
at once (exit status 143), before its Kafka clients close. :func:`run_until_stopped` runs the command's
coroutine on the main thread's event loop and turns the first SIGTERM or SIGINT into a cancellation of
it: its ``finally`` blocks close the clients, and the command exits 0, whatever its peers are doing
(a cancelled connect or retry sleep ends at once). A second signal is the default again (kill, or
KeyboardInterrupt), so a stop that hangs can still be forced.

>>> run_until_stopped(asyncio.sleep(0, result="done"))
'done'
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _until_signal(coroutine: Coroutine[Any, Any, T]) -> T | None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        for sig in STOP_SIGNALS:  # the next signal acts as it would without us
            loop.remove_signal_handler(sig)
        task.cancel()

    installed = []
    for sig in STOP_SIGNALS:
        # not on the main thread (a test calling the command inside its own loop) or on Windows:
        # signals keep their defaults
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop)
            installed.append(sig)
    try:
        return await coroutine
    except asyncio.CancelledError:
        if stopped:
            return None
        raise
    finally:
        if not stopped:
            for sig in installed:
                loop.remove_signal_handler(sig)


def run_until_stopped(coroutine: Coroutine[Any, Any, T]) -> T | None:
    """Run ``coroutine`` to its end, or until SIGTERM / SIGINT cancels it (then None).

    Called where an event loop already runs in this thread (a test), it runs on a helper thread's
    loop instead (:func:`~skewwatch.kafka_client.run_blocking`), without signal handling.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_until_signal(coroutine))
    from skewwatch.kafka_client import run_blocking

    return run_blocking(_until_signal(coroutine))


__all__ = ["STOP_SIGNALS", "run_until_stopped"]
