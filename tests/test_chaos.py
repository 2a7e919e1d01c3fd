"""R10, short: the chaos harness (`bench/chaos.py`) on a seeded ~40 s run must end with zero violations.

Real `agents api` + three `agents worker` processes on a Postgres of the harness's own; workers killed with -9 and
SIGTERM and restarted, the database restarted once, threads stopped, continued and terminated, messages posted
mid-turn, SSE clients dropping and resuming, one CPU-bound tool. The long run's figures are in `bench/README.md`.
"""

from __future__ import annotations

import pytest

from bench import chaos

pytestmark = pytest.mark.slow  # a seeded ~40 s chaos run of real processes


async def test_a_short_seeded_chaos_run_breaks_no_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    code = await chaos.main(chaos.parse(["--seed", "7", "--threads", "80", "--duration", "30", "--settle", "90"]))
    report = capsys.readouterr().out
    assert code == 0, report
    assert "violations: 0 — clean" in report
    assert "database restart 1" in report and "kill -9" in report and "SIGTERM" in report
