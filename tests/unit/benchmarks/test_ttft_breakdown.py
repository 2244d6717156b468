"""benchmarks/ttft_breakdown.py: segments from the probe's marks, the client's marks joined in
by the t0 header, and a probe that could not hook in stops the run with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.ttft_breakdown import SEGMENTS, format_breakdown, read_probe_rows, segment_stats


def test_each_segment_is_measured_over_the_rows_that_have_both_marks() -> None:
    native = {"t0": 0.0, "headers": 0.002, "asgi": 0.003, "triton_call": 0.010,
              "client_first": 0.030}  # fmt: skip
    direct = {"t0": 1.0, "triton_call": 1.0, "first_response": 1.004, "client_first": 1.004}
    stats = {stat.segment: stat for stat in segment_stats([native, direct])}
    headers = stats["client send -> uvicorn parsed the headers"]
    assert headers.requests == 1 and headers.p50_ms == pytest.approx(2.0)
    ttft = stats["time to first token (the client's)"]
    assert ttft.requests == 2
    assert ttft.mean_ms == pytest.approx(17.0) and ttft.p50_ms == pytest.approx(17.0)
    middlewares = stats["BentoML's middlewares -> ours"]
    assert middlewares.requests == 0 and middlewares.p50_ms is None


def test_segments_chain_from_the_client_send_to_its_first_byte() -> None:
    """The path's segments (all but the total) follow each other without a gap, so their means
    add up to the mean time to first token."""
    path = SEGMENTS[:-1]
    assert path[0][1] == "t0" and path[-1][2] == "client_first"
    for (_, _, end), (_, start, _) in zip(path, path[1:], strict=False):
        assert end == start
    assert SEGMENTS[-1][1:] == ("t0", "client_first")


def test_probe_rows_get_the_client_first_byte_by_their_t0(tmp_path: Path) -> None:
    log = tmp_path / "probe.jsonl"
    rows = [{"t0": "10.5", "headers": 10.51, "first_body": 10.6},
            {"t0": "11.25", "headers": 11.3}]  # fmt: skip
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = read_probe_rows(log, {"10.5": 10.61})
    assert read[0] == {"t0": 10.5, "headers": 10.51, "first_body": 10.6, "client_first": 10.61}
    assert "client_first" not in read[1]  # its first byte was not seen: left out of that segment


def test_a_probe_that_could_not_hook_in_stops_the_run(tmp_path: Path) -> None:
    log = tmp_path / "probe.jsonl"
    log.write_text(json.dumps({"probe_error": "AttributeError('on_headers_complete')"}) + "\n")
    with pytest.raises(RuntimeError, match="could not hook into the service"):
        read_probe_rows(log, {})


def test_the_table_has_a_row_per_segment_and_a_column_per_target() -> None:
    native = {"t0": 0.0, "headers": 0.001, "client_first": 0.02}
    table = format_breakdown({"native": segment_stats([native]), "direct gRPC": segment_stats([])})
    lines = table.splitlines()
    assert "native p50/mean ms" in lines[0] and "direct gRPC p50/mean ms" in lines[0]
    assert len(lines) == 2 + len(SEGMENTS)
    assert "20.0 /" in lines[-1]  # native's time to first token
