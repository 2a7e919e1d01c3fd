"""Where a B4 turn's time goes, from the server's own traces: the phases between the model's calls and the tools.

Run the peer benchmark with the server's spans printed to its log (OpenTelemetry's console exporter), then read them:

    OTEL_TRACES_EXPORTER=console BENCH_TMP=/tmp/peer-b4 REPS=1 B1=0 B2_SECONDS=10 B2_CLIENTS=20 GRAPHS=stream \\
        bash bench/peers/run.sh sa
    python3 bench/peers/spans.py /tmp/peer-b4/sa-sa.log

Each trace of one posted message whose execution made B4's turn (two steps, two model calls, the tools of the first
answer) gives one sample of every phase; the table shows their percentiles in milliseconds. The phases that are not
the model's or the tools' own time are the server's overhead: the message waiting to be claimed, the step's opening,
the answer's close and the tools' start, the results and the next opening, the last close. Standard library only.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from datetime import datetime
from typing import Any

Span = dict[str, Any]


def spans(text: str) -> list[Span]:
    """The spans the console exporter printed (indented JSON objects) among the log's other lines."""
    found: list[Span] = []
    decoder = json.JSONDecoder()
    at = text.find('{\n    "name"')
    while at >= 0:
        span, end = decoder.raw_decode(text, at)
        found.append(span)
        at = text.find('{\n    "name"', end)
    return found


def _t(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _start(span: Span) -> float:
    return _t(span["start_time"])


def _end(span: Span) -> float:
    return _t(span["end_time"])


def phases(found: list[Span]) -> dict[str, list[float]]:
    """Per phase, its duration (ms) in every complete B4 turn among `found`."""
    traces: dict[str, list[Span]] = defaultdict(list)
    for span in found:
        traces[span["context"]["trace_id"]].append(span)
    out: dict[str, list[float]] = defaultdict(list)
    for members in traces.values():
        named = sorted(members, key=_start)
        posts = [s for s in named if s["name"] == "POST /threads/{thread_id}/messages"]
        executes = [s for s in named if s["name"] == "execute"]
        steps = [s for s in named if s["name"].startswith("step ")]
        chats = [s for s in named if s["name"].startswith("chat ")]
        tools = [s for s in named if s["name"].startswith("execute_tool ")]
        if len(posts) != 1 or len(executes) != 1 or len(steps) != 2 or len(chats) != 2 or not tools:
            continue  # not one B4 turn (another graph, or a turn cut by the end of the log)
        post, execute = posts[0], executes[0]
        first_tool, last_tool = min(map(_start, tools)), max(map(_end, tools))
        for name, seconds in (
            ("POST → its execution starts (the claim)", _start(execute) - _start(post)),
            ("execution → step 1 (the opening)", _start(steps[0]) - _start(execute)),
            ("model call 1", _end(chats[0]) - _start(chats[0])),
            ("answer 1 → first tool starts (the close)", first_tool - _end(chats[0])),
            ("the tools, first start → last end", last_tool - first_tool),
            ("last tool → step 2 (results, next opening)", _start(steps[1]) - last_tool),
            ("model call 2", _end(chats[1]) - _start(chats[1])),
            ("answer 2 → execution ends (the close)", _end(execute) - _end(chats[1])),
            ("POST → execution ends", _end(execute) - _start(post)),
        ):
            out[name].append(seconds * 1000)
    return out


def table(measured: dict[str, list[float]]) -> str:
    turns = max((len(v) for v in measured.values()), default=0)
    lines = [f"{turns} turns", "", "| phase | p50 ms | p90 ms | max ms |", "| --- | --- | --- | --- |"]
    for name, values in measured.items():
        ordered = sorted(values)
        p50, p90 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        lines.append(f"| {name} | {p50:.1f} | {p90:.1f} | {ordered[-1]:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="the server's log, with the console exporter's spans in it")
    args = parser.parse_args()
    with open(args.log, encoding="utf-8", errors="replace") as f:
        print(table(phases(spans(f.read()))))


if __name__ == "__main__":
    main()
