"""A worker's liveness file (`WORKER_HEARTBEAT_FILE`), and the check `agents health worker` makes of it.

The worker's claim loop rewrites the file as it goes round (every poll interval at most): a process that is gone, or
whose loop is stuck (a blocked event loop, a statement that never returns), stops rewriting it, and one that cannot
reach the database says so in it. The file names the process, so a check does not trust a file its writer left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EVERY = 2.0  # seconds between rewrites at most
SLACK = 30.0  # seconds a beat may be late before the worker counts as stuck (at least 3 poll intervals)


@dataclass(frozen=True)
class Beat:
    """What the file holds: who wrote it, when, and when its loop last reached the database (unix times)."""

    pid: int
    owner: str
    at: float
    database_at: float | None
    stale_after: float  # seconds after `at` the beat is too old (the writer knows its poll interval)


class Pulse:
    """Rewrites the file of one worker process (atomically: a reader sees a whole file or the previous one)."""

    def __init__(self, path: Path, owner: str, poll_interval: float) -> None:
        self._path = path
        self._owner = owner
        self._stale_after = max(SLACK, 3 * poll_interval)
        self._written = 0.0
        self.database_at: float | None = None

    def beat(self, reached_database: bool) -> None:
        now = time.time()
        if reached_database:
            self.database_at = now
        if now - self._written < EVERY:
            return
        beat = Beat(os.getpid(), self._owner, now, self.database_at, self._stale_after)
        part = self._path.with_name(self._path.name + ".part")
        self._written = now  # a failure too: it is said once per beat, not once per loop
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            part.write_text(json.dumps(asdict(beat)))
            part.replace(self._path)
        except OSError as exc:
            log.warning("cannot write the heartbeat file %s: %s", self._path, exc)

    def remove(self) -> None:
        """The worker stops: no beat is left behind to look alive."""
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()


def problem(path: Path, max_age: float | None = None, now: float | None = None) -> tuple[str | None, Beat | None]:
    """Why the worker writing `path` is not healthy (None when it is), and its last beat if there is one."""
    try:
        beat = Beat(**json.loads(path.read_text()))
    except FileNotFoundError:
        return f"no heartbeat file at {path}: no worker has started (or it stopped)", None
    except OSError as exc:
        return f"the heartbeat file {path} cannot be read: {exc.strerror}", None
    except (ValueError, TypeError) as exc:
        return f"the heartbeat file {path} is not one a worker wrote ({exc})", None
    now = time.time() if now is None else now
    limit = beat.stale_after if max_age is None else max_age
    if not _running(beat.pid):
        return f"worker process {beat.pid} is gone (its last beat was {now - beat.at:.0f} s ago)", beat
    if now - beat.at > limit:
        return f"worker process {beat.pid} is stuck: no beat for {now - beat.at:.0f} s (limit {limit:.0f} s)", beat
    if beat.database_at is None or now - beat.database_at > limit:
        since = "since it started" if beat.database_at is None else f"for {now - beat.database_at:.0f} s"
        return f"worker process {beat.pid} has not reached the database {since}", beat
    return None, beat


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    with contextlib.suppress(OSError):  # a process that exited but was not reaped yet is no worker
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
