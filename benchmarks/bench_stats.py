"""Per-request records of a streaming load test, their summary per target, and the report table.

Kept free of any client or process code so the numbers can be unit-tested on their own.

Definitions (the same for every target, so ratios compare like with like):
- TTFT: request sent → first response that carries output (a token, or a non-empty text chunk);
- ITL: per request, (last output − first output) / (output tokens − 1), as genai-perf counts it;
  avg/p50/p99 are taken over requests;
- tokens/s and requests/s: totals of the measured requests over the wall time of the run;
- short: a request that ended without error but with fewer tokens (or less text) than expected;
- CPU µs/token: CPU time (user + system) of the process that serves the stream, over the measured
  requests, per output token. For grpc_direct it is the benchmark's own gRPC client, i.e. what any
  client pays to receive Triton's responses; for the services, their BentoML processes
  (tritonserver excluded). Triton's own generate_stream has no separate serving process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

REFERENCE_TARGET = "grpc_direct"


@dataclass(slots=True)
class RequestRecord:
    """What one streamed request did; times are time.perf_counter() seconds."""

    start: float
    end: float
    first_output: float | None = None
    last_output: float | None = None
    tokens: int = 0
    expected_tokens: int = 0
    error: str | None = None
    short: bool = False
    mismatch: bool = False  # complete length but different text (reported, not counted short)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_output is None else self.first_output - self.start

    @property
    def itl_s(self) -> float | None:
        if self.first_output is None or self.last_output is None or self.tokens < 2:
            return None
        return (self.last_output - self.first_output) / (self.tokens - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(slots=True)
class Distribution:
    """avg / p50 / p99 in milliseconds (None when nothing was measured)."""

    avg: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of_seconds(cls, values: Iterable[float]) -> Distribution:
        ms = [v * 1000.0 for v in values]
        return cls(_mean(ms), percentile(ms, 50), percentile(ms, 99))


@dataclass(slots=True)
class TargetSummary:
    """One target measured in one cell (ITL, concurrency)."""

    target: str
    cell: str
    concurrency: int
    requests: int
    completed: int
    errors: int
    short: int
    mismatched: int
    wall_s: float
    output_tokens: int
    requests_per_s: float
    tokens_per_s: float
    ttft_ms: Distribution
    itl_ms: Distribution
    first_error: str | None = None
    cpu_us_per_token: float | None = None
    ratios: dict[str, float | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    target: str,
    cell: str,
    concurrency: int,
    records: Sequence[RequestRecord],
    wall_s: float,
    cpu_s: float | None = None,
) -> TargetSummary:
    """Aggregate the records of one run; errors count as requests but not as output.

    cpu_s: CPU seconds the serving process spent on the run (None: not measured).
    """
    ok = [r for r in records if r.error is None]
    errors = [r for r in records if r.error is not None]
    tokens = sum(r.tokens for r in ok)
    wall = max(wall_s, 1e-9)
    return TargetSummary(
        target=target,
        cell=cell,
        concurrency=concurrency,
        requests=len(records),
        completed=len(ok),
        errors=len(errors),
        short=sum(1 for r in ok if r.short),
        mismatched=sum(1 for r in ok if r.mismatch),
        wall_s=wall_s,
        output_tokens=tokens,
        requests_per_s=len(ok) / wall,
        tokens_per_s=tokens / wall,
        ttft_ms=Distribution.of_seconds(t for r in ok if (t := r.ttft_s) is not None),
        itl_ms=Distribution.of_seconds(t for r in ok if (t := r.itl_s) is not None),
        first_error=errors[0].error if errors else None,
        cpu_us_per_token=cpu_s * 1e6 / tokens if cpu_s is not None and tokens else None,
    )


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def _difference(value: float | None, reference: float | None) -> float | None:
    return None if value is None or reference is None else value - reference


def add_ratios(summaries: Sequence[TargetSummary], reference: str = REFERENCE_TARGET) -> None:
    """Fill each summary's ratios to the reference target of the same cell (in place).

    tokens_per_s and requests_per_s are ratios (higher is better); ttft_p50/ttft_p99/itl_p50 are
    ratios too (lower is better) and ttft_p50_delta_ms is the difference in milliseconds.
    """
    by_cell = {s.cell: s for s in summaries if s.target == reference}
    for summary in summaries:
        base = by_cell.get(summary.cell)
        if base is None:
            summary.ratios = {}
            continue
        summary.ratios = {
            "tokens_per_s": _ratio(summary.tokens_per_s, base.tokens_per_s),
            "requests_per_s": _ratio(summary.requests_per_s, base.requests_per_s),
            "ttft_p50": _ratio(summary.ttft_ms.p50, base.ttft_ms.p50),
            "ttft_p99": _ratio(summary.ttft_ms.p99, base.ttft_ms.p99),
            "itl_p50": _ratio(summary.itl_ms.p50, base.itl_ms.p50),
            "ttft_p50_delta_ms": _difference(summary.ttft_ms.p50, base.ttft_ms.p50),
        }


def format_number(value: float | None, digits: int = 1) -> str:
    """A number for the table, "-" when not measured."""
    return "-" if value is None else f"{value:.{digits}f}"


def _dist(d: Distribution) -> str:
    return f"{format_number(d.avg)}/{format_number(d.p50)}/{format_number(d.p99)}"


COLUMNS = (
    "target", "req/s", "tok/s", "x tok/s", "TTFT ms avg/p50/p99", "x TTFT p50", "ITL ms avg/p50/p99",
    "CPU us/tok", "err", "short",
)  # fmt: skip


def table_rows(summaries: Sequence[TargetSummary]) -> list[list[str]]:
    rows = []
    for s in summaries:
        rows.append(
            [
                s.target,
                format_number(s.requests_per_s, 2),
                format_number(s.tokens_per_s, 0),
                format_number(s.ratios.get("tokens_per_s"), 2),
                _dist(s.ttft_ms),
                format_number(s.ratios.get("ttft_p50"), 2),
                _dist(s.itl_ms),
                format_number(s.cpu_us_per_token, 0),
                str(s.errors),
                str(s.short),
            ]
        )
    return rows


def format_table(summaries: Sequence[TargetSummary]) -> str:
    """A plain-text table, one block per cell, in the order the summaries were measured."""
    cells: dict[str, list[TargetSummary]] = {}
    for summary in summaries:
        cells.setdefault(summary.cell, []).append(summary)
    blocks = []
    for cell, members in cells.items():
        rows = [list(COLUMNS), *table_rows(members)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        lines = [f"== {cell} =="]
        for index, row in enumerate(rows):
            cells_text = [
                text.ljust(width) if column == 0 else text.rjust(width)
                for column, (text, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells_text).rstrip())
            if index == 0:
                lines.append("  ".join("-" * width for width in widths))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


@dataclass(slots=True)
class InterleavedRounds:
    """A bare gRPC client and the service's native stream measured in alternating rounds against
    the same tritonserver (the service's own), so that the slow phases of a shared machine hit
    both alike. Each figure is the median over rounds of one round's pair."""

    cell: str
    client: list[TargetSummary] = field(default_factory=list)
    service: list[TargetSummary] = field(default_factory=list)

    def _paired_median(
        self, value: Callable[[TargetSummary, TargetSummary], float | None]
    ) -> float | None:
        pairs = zip(self.client, self.service, strict=True)
        values = [v for c, s in pairs if (v := value(c, s)) is not None]
        return percentile(values, 50)

    @property
    def rounds(self) -> int:
        return len(self.service)

    @property
    def client_us(self) -> list[float | None]:
        return [summary.cpu_us_per_token for summary in self.client]

    @property
    def service_us(self) -> list[float | None]:
        return [summary.cpu_us_per_token for summary in self.service]

    @property
    def client_median(self) -> float | None:
        return percentile([v for v in self.client_us if v is not None], 50)

    @property
    def service_median(self) -> float | None:
        return percentile([v for v in self.service_us if v is not None], 50)

    @property
    def added_median(self) -> float | None:
        """The service's CPU per token minus the bare client's."""
        return self._paired_median(lambda c, s: _difference(s.cpu_us_per_token, c.cpu_us_per_token))

    @property
    def tokens_ratio_median(self) -> float | None:
        """The service's output tokens/s over the bare client's."""
        return self._paired_median(lambda c, s: _ratio(s.tokens_per_s, c.tokens_per_s))

    @property
    def ttft_delta_median(self) -> float | None:
        """The service's TTFT p50 minus the bare client's, in ms."""
        return self._paired_median(lambda c, s: _difference(s.ttft_ms.p50, c.ttft_ms.p50))

    def as_dict(self) -> dict[str, Any]:
        def round_figures(summary: TargetSummary) -> dict[str, float | None]:
            return {
                "tokens_per_s": summary.tokens_per_s,
                "ttft_p50_ms": summary.ttft_ms.p50,
                "cpu_us_per_token": summary.cpu_us_per_token,
            }

        return {
            "cell": self.cell,
            "client": [round_figures(summary) for summary in self.client],
            "service": [round_figures(summary) for summary in self.service],
            "added_median_us": self.added_median,
            "tokens_ratio_median": self.tokens_ratio_median,
            "ttft_p50_delta_median_ms": self.ttft_delta_median,
        }


@dataclass(frozen=True, slots=True)
class Goal:
    """One of the streaming goals, checked against a run (informational, never fails the run)."""

    name: str
    cell: str
    passed: bool | None  # None: the cell or a target was not measured
    detail: str


def _find(summaries: Sequence[TargetSummary], cell: str, target: str) -> TargetSummary | None:
    return next((s for s in summaries if s.cell == cell and s.target == target), None)


def _ratio_goal(name: str, cell: str, ratio: float | None, minimum: float, digits: int) -> Goal:
    """A goal met when a throughput ratio reaches `minimum`."""
    return Goal(
        name, cell, ratio is not None and ratio >= minimum, f"{format_number(ratio, digits)}x"
    )


def _paired_ratio_goal(
    name: str, cell: str, minimum: float, digits: int,
    paired: InterleavedRounds | None, separate: float | None,
) -> Goal | None:  # fmt: skip
    """A throughput-ratio goal judged on the median of `paired`'s rounds when there is one (the
    separate figure goes in the detail), else on `separate`; None if neither was measured."""
    if paired is not None and paired.tokens_ratio_median is not None:
        goal = _ratio_goal(name, cell, paired.tokens_ratio_median, minimum, digits)
        how = (
            f" (median of {paired.rounds} interleaved rounds; "
            f"separate runs {format_number(separate, digits)}x)"
        )
        return Goal(goal.name, goal.cell, goal.passed, goal.detail + how)
    return None if separate is None else _ratio_goal(name, cell, separate, minimum, digits)


def check_goals(
    summaries: Sequence[TargetSummary],
    native: str,
    openai: str,
    high_itl_cell: str,
    zero_cell: str,
    interleaved_rounds: Sequence[InterleavedRounds] = (),
    baseline_rounds: Sequence[InterleavedRounds] = (),
) -> list[Goal]:
    """The streaming goals (docs/performance.md, "Goals"), evaluated on this run's numbers.

    The goals that compare the native stream with direct gRPC (throughput and TTFT at high ITL,
    serving-layer CPU) use a cell's interleaved rounds when there are any, else the two targets'
    separate measurements (minutes apart, each against its own tritonserver). The 2x-baseline
    goal likewise uses `baseline_rounds` (client: the baseline proxy, service: native) if any.
    """
    goals: list[Goal] = []
    rounds = {interleaved.cell: interleaved for interleaved in interleaved_rounds}
    direct = _find(summaries, high_itl_cell, REFERENCE_TARGET)
    nat = _find(summaries, high_itl_cell, native)
    paired = rounds.get(high_itl_cell)
    separate_ratio = _ratio(nat.tokens_per_s, direct.tokens_per_s) if direct and nat else None
    separate_delta = nat.ratios.get("ttft_p50_delta_ms") if direct and nat else None
    tokens_goal = _paired_ratio_goal(
        "native tok/s >= 0.97x direct", high_itl_cell, 0.97, 3, paired, separate_ratio
    )
    if paired is not None and paired.tokens_ratio_median is not None:
        delta = paired.ttft_delta_median
        delta_detail = (
            f" (median of {paired.rounds} interleaved rounds; "
            f"separate runs {format_number(separate_delta)} ms)"
        )
    else:
        delta, delta_detail = separate_delta, ""
    if tokens_goal is not None:
        goals.append(tokens_goal)
        goals.append(
            Goal(
                "native TTFT p50 <= direct + 5 ms",
                high_itl_cell,
                delta is not None and delta <= 5.0,
                f"{format_number(delta)} ms{delta_detail}",
            )  # fmt: skip
        )
    else:
        goals.append(Goal("native tok/s >= 0.97x direct", high_itl_cell, None, "not measured"))
    nat0 = _find(summaries, zero_cell, native)
    gen0 = _find(summaries, zero_cell, "triton_generate_stream")
    base0 = _find(summaries, zero_cell, "baseline_proxy")
    if nat0 and gen0:
        ok = nat0.tokens_per_s >= gen0.tokens_per_s
        goals.append(
            Goal(
                "native tok/s >= Triton generate_stream",
                zero_cell,
                ok,
                f"{format_number(nat0.tokens_per_s, 0)} vs {format_number(gen0.tokens_per_s, 0)}",
            )  # fmt: skip
        )
    separate_base = _ratio(nat0.tokens_per_s, base0.tokens_per_s) if nat0 and base0 else None
    paired_base = next((r for r in baseline_rounds if r.cell == zero_cell), None)
    base_goal = _paired_ratio_goal(
        "native tok/s >= 2x baseline", zero_cell, 2.0, 2, paired_base, separate_base
    )
    if base_goal is not None:
        goals.append(base_goal)
    for cell in (zero_cell, high_itl_cell):
        # What the proxy adds on top of receiving Triton's responses, which any gRPC client
        # pays (grpc_direct's client); both absolute figures are in the detail.
        comparison = rounds.get(cell)
        nat_c = _find(summaries, cell, native)
        floor = _find(summaries, cell, REFERENCE_TARGET)
        if comparison is not None and comparison.added_median is not None:
            added = comparison.added_median
            service_us, client_us = comparison.service_median, comparison.client_median
            how = f", median of {comparison.rounds} interleaved rounds"
        elif nat_c and floor and nat_c.cpu_us_per_token and floor.cpu_us_per_token:
            added = nat_c.cpu_us_per_token - floor.cpu_us_per_token
            service_us, client_us = nat_c.cpu_us_per_token, floor.cpu_us_per_token
            how = ""
        else:
            continue
        goals.append(
            Goal(
                "serving-layer CPU <= 25 us/token over a bare gRPC client",
                cell,
                added <= 25.0,
                f"{added:.0f} us (service {format_number(service_us, 0)}, "
                f"bare gRPC client {format_number(client_us, 0)}{how})",
            )
        )
    for cell in (zero_cell, high_itl_cell):
        nat_c = _find(summaries, cell, native)
        oai = _find(summaries, cell, openai)
        if nat_c and oai:
            goals.append(
                _ratio_goal(
                    "OpenAI tok/s within 10% of native",
                    cell,
                    _ratio(oai.tokens_per_s, nat_c.tokens_per_s),
                    0.9,
                    3,
                )
            )
    return goals


def format_goals(goals: Sequence[Goal]) -> str:
    marks = {True: "PASS", False: "MISS", None: "n/a "}
    return "\n".join(f"[{marks[g.passed]}] {g.name} ({g.cell}): {g.detail}" for g in goals)
