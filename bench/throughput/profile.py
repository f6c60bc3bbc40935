"""Where the worker's time goes: a summary of py-spy's collapsed stacks (``--format raw``).

Each line of the file is ``frame;frame;...;leaf COUNT`` with frames like
``apply (skewwatch/pipeline/window.py:412)``. A function's *inclusive* share is the fraction of
samples with it anywhere on the stack (counted once per sample), its *self* share the fraction
with it as the leaf. Frames are named ``function (file)`` without line numbers, the file cut to
its path below ``site-packages/`` or the repository, so one function is one row.

With py-spy's ``--threads`` each stack starts with ``thread (ID): NAME``: the shares are then of the
main thread's samples (the event loop, where the pipeline runs), and ``threads`` gives every
thread's share of all samples (the worker's Faust app keeps a consumer thread that mostly waits).

>>> text = "main (app.py:1);decode (skewwatch/schemas/requests/decode.py:9) 3\\nmain (app.py:1);apply (w.py:2) 1\\n"
>>> s = summarise(text)
>>> s["samples"], s["inclusive"][0], s["self"][0]
(4, ('main (app.py)', 1.0), ('decode (skewwatch/schemas/requests/decode.py)', 0.75))
>>> s = summarise("thread (1): MainThread;run (x.py:1) 3\\nthread (2): Thread-1;select (selectors.py:4) 1\\n")
>>> s["samples"], s["threads"], s["self"]
(3, {'MainThread': 0.75, 'Thread-1': 0.25}, [('run (x.py)', 1.0)])
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::\d+)?\)$")
# Frames that sit under everything (the event loop, the CLI, the supervisor, the probe): left out
# of the inclusive ranking, where they would only fill the top rows with ~100 %.
_PLUMBING = ("asyncio/", "click/", "<frozen runpy>", "mode/", "throughput/probe.py", "skewwatch/agents/app.py",
             "skewwatch/cli.py", "faust/")


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match.group('func')} ({path})"


def summarise(text: str, top: int = 25) -> dict[str, Any]:
    """Inclusive and self shares of the ``top`` functions (see the module docstring)."""
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw = stack.split(";")
        if raw[0].startswith("thread ("):
            thread = raw[0].split(": ", 1)[-1]
            threads[thread] += count
            raw = raw[1:]
            if thread != "MainThread" or not raw:
                continue
        frames = [_short(f) for f in raw]
        total += count
        for name in set(frames):
            if not any(marker in name for marker in _PLUMBING):
                inclusive[name] += count
        leaf[frames[-1]] += count
    all_samples = sum(threads.values())
    shares = {name: round(n / all_samples, 3) for name, n in threads.most_common()} if all_samples else {}
    if not total:
        return {"samples": 0, "threads": shares, "inclusive": [], "self": []}
    return {
        "samples": total,
        "threads": shares,
        "inclusive": [(name, round(n / total, 3)) for name, n in inclusive.most_common(top)],
        "self": [(name, round(n / total, 3)) for name, n in leaf.most_common(top)],
    }


def format_summary(summary: dict[str, Any], title: str) -> str:
    lines = [f"{title}: {summary['samples']} samples of the main thread"]
    if summary.get("threads"):
        lines.append("  threads: " + ", ".join(f"{name} {share:.0%}" for name, share in summary["threads"].items()))
    lines.append("  inclusive (on the stack)")
    lines += [f"    {share:6.1%}  {name}" for name, share in summary["inclusive"]]
    lines.append("  self (leaf)")
    lines += [f"    {share:6.1%}  {name}" for name, share in summary["self"]]
    return "\n".join(lines)
