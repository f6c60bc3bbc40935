"""The repository speaks only of itself: no pointers a reader of the repository cannot follow.

A reader has the repository and nothing else, so its text names no tracker numbers, no design file
outside it (the design's rules are in docs/design.md), no sibling checkout, no time of work and no
commit in prose. Benchmark results are data: their JSON files keep a git revision and a timestamp.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Anywhere in a text file, code included.
EVERYWHERE: dict[str, re.Pattern[str]] = {
    "a tracker number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a design file outside the repository": re.compile(r"\bDESIGN\.md\b|\bDESIGN items?\b"),
    "a path outside the repository": re.compile(r"\.\./shared\b"),
}

# In prose only (Markdown, comments and docstrings): code and test data may hold dates and hex ids.
PROSE: dict[str, re.Pattern[str]] = {
    "a time of work": re.compile(
        r"\b(?:this|that|yesterday) (?:afternoon|morning|evening|session)\b|\btoday\b|\byesterday\b|\btonight\b",
        re.IGNORECASE,
    ),
    "a date": re.compile(r"(?<![\w.-])20\d\d-[01]\d-[0-3]\d(?![\w-])"),
    # 7-40 hex digits with at least one letter and one digit, standing alone: not part of a uuid, a
    # quoted id, a path or a longer word
    "a commit hash": re.compile(
        r"(?<![\w\"'./:#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w\"'/:-])"
    ),
}

# Dates that are facts about the world, not about when the work was done.
ALLOWED_DATES = {
    "2023-11-16",  # the day the bundled Azure traces were recorded (skewwatch/data/SOURCE.md)
    "2024-01-16",  # a Java release date inside `java -version` output (docs/broker.md)
    "2025-04-15",  # the same in a doctest of skewwatch/broker/java.py
}

# Data, not prose: benchmark results (revision and time are fields), traces, images.
SKIPPED_PREFIXES = ("bench/results/",)
SKIPPED_SUFFIXES = (".csv", ".png", ".jpg", ".gz")
DATA_PREFIXES = ("tests/fixtures/",)  # checked for EVERYWHERE only
SELF = "tests/unit/test_repository_text.py"  # its examples are what the patterns must catch


def tracked_files() -> list[str]:
    """The repository's tracked files (``git ls-files``), or a skip where there is no git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return [name for name in out.decode().split("\0") if name]


def python_prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every bare string statement (docstrings) of Python source."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            end = node.end_lineno or node.lineno
            for number in range(node.lineno, end + 1):
                yield number, lines[number - 1]


def findings(name: str, text: str) -> Iterator[str]:
    """``path:line: what: the line`` for every reference outside the repository in one file."""
    lines = text.splitlines()
    for what, pattern in EVERYWHERE.items():
        for number, line in enumerate(lines, 1):
            if pattern.search(line):
                yield f"{name}:{number}: {what}: {line.strip()}"
    if name.startswith(DATA_PREFIXES) or name.endswith(".json"):
        return
    prose = sorted(set(python_prose(text))) if name.endswith(".py") else list(enumerate(lines, 1))
    for what, pattern in PROSE.items():
        for number, line in prose:
            for match in pattern.finditer(line):
                if what == "a date" and match.group(0) in ALLOWED_DATES:
                    continue
                yield f"{name}:{number}: {what}: {line.strip()}"


def test_the_repository_speaks_only_of_itself() -> None:
    problems: list[str] = []
    for name in tracked_files():
        if name.startswith(SKIPPED_PREFIXES) or name.endswith(SKIPPED_SUFFIXES) or name == SELF:
            continue
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary, or deleted in the working tree
        problems.extend(findings(name, text))
    assert not problems, "references outside the repository:\n" + "\n".join(problems)


def test_python_prose_is_comments_and_docstrings_not_data() -> None:
    source = '"""Doc."""\nx = "issue-free data 2026-12-03"  # why\n'
    assert sorted(python_prose(source)) == [(1, '"""Doc."""'), (2, "# why")]


@pytest.mark.parametrize("line, what", [
    ("See issue 4 for why.", "a tracker number"),
    ("(issues 2 and 3)", "a tracker number"),
    ("DESIGN item 6 says so", "a design file outside the repository"),
    ("read ../shared/data first", "a path outside the repository"),
    ("measured this afternoon", "a time of work"),
    ("the run of 2026-12-03 12:59 UTC", "a date"),
    ("throughput on 20edca8, scale on 8cf9b24", "a commit hash"),
    ("against the decoder of `98f5a05`", "a commit hash"),
])
def test_each_pattern_catches_what_it_is_for(line: str, what: str) -> None:
    assert any(hit.split(": ")[1] == what for hit in findings("x.md", line + "\n"))


@pytest.mark.parametrize("line", [
    "GPU-5f0e2a71-3c1b-8a4e-92d0-7a1c4b6e9f21",  # a uuid
    '"traceId": "5b8efff798038103d269b633813fc60c"',  # a quoted id
    "seed §2.5: P99 > 3 × P50 for 3 consecutive steps",
    "docs/design.md, \"Two stages, two keys\"",
    "the tissue 4 of an example",  # a longer word
    "recorded on 2023-11-16",  # an allowed date
    "1717000000 and 12345678 are numbers, deadbeef a word",
    "aiohttp.ClientSession() as session",
])
def test_ordinary_text_passes(line: str) -> None:
    assert list(findings("x.md", line + "\n")) == []
