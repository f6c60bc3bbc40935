"""Trace loading: the documented column mapping, both timestamp forms, errors that name the problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skewwatch.sim.trace import ColumnMapping, TraceError, load_trace, read_trace


def test_bundled_azure_traces_load_with_the_default_mapping() -> None:
    conv, code = load_trace("conv"), load_trace("code")
    assert (len(conv), len(code)) == (19366, 8819)  # as SOURCE.md states
    for t in (conv, code):
        assert t.offset_s[0] == 0.0 and np.all(np.diff(t.offset_s) >= 0)
        assert 3000 < t.duration_s < 3700  # one hour each
        assert t.prompt_tokens.min() >= 0 and t.completion_tokens.min() >= 0
    assert 1000 < conv.prompt_tokens.mean() < 1300 and 150 < conv.completion_tokens.mean() < 250
    assert 5.0 < conv.mean_rate < 6.0


def test_any_csv_through_a_column_mapping(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("when,in,out,other\n10.5,100,20,x\n10.0,200,30,y\n12.0,300,40,z\n")
    t = load_trace(path, ColumnMapping.parse("ts=when,prompt=in,completion=out"))
    assert t.offset_s.tolist() == [0.0, 0.5, 2.0]  # sorted by time, relative to the first
    assert t.prompt_tokens.tolist() == [200, 100, 300] and t.completion_tokens.tolist() == [30, 20, 40]


def test_iso_timestamps_with_fractional_seconds() -> None:
    t = read_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    assert t.offset_s[1] == pytest.approx(4.314579, abs=1e-6)


def test_mapping_parse_keeps_defaults_and_rejects_nonsense() -> None:
    assert ColumnMapping.parse("prompt=input_tokens") == ColumnMapping(prompt="input_tokens")
    with pytest.raises(TraceError, match="expected ts=COLUMN"):
        ColumnMapping.parse("latency=foo")


def test_errors_name_the_column_or_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no column 'ContextTokens' for prompt"):
        read_trace("TIMESTAMP,prompt,GeneratedTokens\n0,1,2\n")
    with pytest.raises(TraceError, match="line 3: token counts must be numbers"):
        read_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n0,1,2\n1,many,2\n")
    with pytest.raises(TraceError, match=">= 0"):
        read_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n0,-1,2\n")
    with pytest.raises(TraceError, match="neither numbers nor ISO"):
        read_trace("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n")
    with pytest.raises(TraceError, match="no rows"):
        read_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match="neither a file nor a bundled trace"):
        load_trace(tmp_path / "absent.csv")
