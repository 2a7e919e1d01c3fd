"""The worker's liveness file and what `agents health worker` concludes from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import liveness


def test_a_beating_worker_is_healthy_and_its_file_goes_when_it_stops(tmp_path: Path) -> None:
    path = tmp_path / "run" / "worker.heartbeat"
    pulse = liveness.Pulse(path, "host:1:abc", poll_interval=1.0)
    assert liveness.problem(path)[0] == f"no heartbeat file at {path}: no worker has started (or it stopped)"
    pulse.beat(reached_database=False)
    why, beat = liveness.problem(path)
    assert why == f"worker process {os.getpid()} has not reached the database since it started"
    assert beat is not None and beat.stale_after == liveness.SLACK
    pulse.beat(reached_database=True)  # within EVERY of the last write: the file is left as it is
    assert json.loads(path.read_text())["database_at"] is None
    pulse._written = 0.0
    pulse.beat(reached_database=True)
    assert liveness.problem(path) == (None, liveness.Beat(**json.loads(path.read_text())))
    pulse.remove()
    pulse.remove()
    assert not path.exists()


def test_a_late_beat_is_a_stuck_worker_and_a_lost_database_is_said(tmp_path: Path) -> None:
    path = tmp_path / "w.heartbeat"
    now = time.time()
    path.write_text(
        json.dumps({"pid": os.getpid(), "owner": "o", "at": now - 40, "database_at": now - 40, "stale_after": 30})
    )
    assert liveness.problem(path, now=now)[0] == f"worker process {os.getpid()} is stuck: no beat for 40 s (limit 30 s)"
    assert liveness.problem(path, max_age=60, now=now)[0] is None
    path.write_text(
        json.dumps({"pid": os.getpid(), "owner": "o", "at": now, "database_at": now - 90, "stale_after": 30})
    )
    assert liveness.problem(path, now=now)[0] == f"worker process {os.getpid()} has not reached the database for 90 s"


def test_a_file_whose_writer_is_gone_is_no_worker(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    pid = int(gone.stdout)
    path = tmp_path / "w.heartbeat"
    path.write_text(json.dumps({"pid": pid, "owner": "o", "at": time.time(), "database_at": None, "stale_after": 30}))
    assert liveness.problem(path)[0] == f"worker process {pid} is gone (its last beat was 0 s ago)"
    unreaped = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, unreaped.pid, os.WEXITED | os.WNOWAIT)  # it has exited; nobody has reaped it yet
    path.write_text(
        json.dumps({"pid": unreaped.pid, "owner": "o", "at": time.time(), "database_at": 1, "stale_after": 1})
    )
    assert liveness.problem(path)[0] == f"worker process {unreaped.pid} is gone (its last beat was 0 s ago)"
    unreaped.wait()
    path.write_text("{not json")
    assert "is not one a worker wrote" in str(liveness.problem(path)[0])


def test_a_file_that_cannot_be_written_is_logged_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    liveness.Pulse(blocked / "w.heartbeat", "o", 1.0).beat(reached_database=True)  # a folder that is a file
    assert "cannot write the heartbeat file" in caplog.text
