"""Figures read off a runtime trace (`sbp-run --trace`, Chrome JSON).

- busy and idle time of each rank's compute stream between the first and
  the last event of the whole run: in a pipeline, the idle share is the
  bubble (stages waiting for activations or gradients), plus any wait for
  communication that did not overlap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sbpc.runtime.executor import STREAMS


@dataclass
class TraceStats:
    span_us: float
    busy_us: dict[int, float]
    """Per rank: microseconds its compute stream was running a kernel."""

    @property
    def idle_fraction(self) -> dict[int, float]:
        return {rank: 1.0 - busy / self.span_us for rank, busy in self.busy_us.items()} if self.span_us else {}

    @property
    def bubble_fraction(self) -> float:
        """Mean over ranks of the compute stream's idle share of the run."""
        idle = self.idle_fraction
        return sum(idle.values()) / len(idle) if idle else 0.0


def load_events(path: str) -> list[dict]:
    with open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def stats(events: list[dict]) -> TraceStats:
    if not events:
        return TraceStats(0.0, {})
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    busy: dict[int, float] = {}
    for e in events:
        busy.setdefault(e["pid"], 0.0)
        if e["tid"] == STREAMS["compute"]:
            busy[e["pid"]] += e["dur"]
    return TraceStats(end - start, busy)
