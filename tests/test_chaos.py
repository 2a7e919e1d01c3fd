"""R10, short: the chaos harness (`bench/chaos.py`) on a seeded ~40 s run must end with zero violations.

Real `agents api` + three `agents worker` processes on a Postgres of the harness's own; workers killed with -9 and
SIGTERM and restarted, the database restarted once, threads stopped, continued and terminated, messages posted
mid-turn, SSE clients dropping and resuming, one CPU-bound tool; once more with the processes behind Debian's PgBouncer
in transaction mode (`--pooler`). The long run's figures are in `bench/README.md`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import chaos

pytestmark = pytest.mark.slow  # a seeded ~40 s chaos run of real processes


async def test_a_short_seeded_chaos_run_breaks_no_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    code = await chaos.main(chaos.parse(["--seed", "7", "--threads", "80", "--duration", "30", "--settle", "90"]))
    report = capsys.readouterr().out
    assert code == 0, report
    assert "violations: 0 — clean" in report
    assert "database restart 1" in report and "kill -9" in report and "SIGTERM" in report


async def test_the_short_run_through_pgbouncer_in_transaction_mode_breaks_no_invariant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").is_file():
        pytest.skip("needs Debian's pgbouncer (apt-get install -y pgbouncer; .ci/run installs it)")
    argv = ["--seed", "7", "--threads", "80", "--duration", "30", "--settle", "90", "--pooler"]
    code = await chaos.main(chaos.parse(argv))
    report = capsys.readouterr().out
    assert code == 0, report
    assert "violations: 0 — clean" in report and "PgBouncer, transaction mode" in report
    assert "database restart 1" in report and "kill -9" in report
