"""What the chaos harness's tools record: one JSON line per start and end of each execution of a tool call."""

import json
import os
import time
from pathlib import Path

from app.spec import ThreadState


def record(kind: str, state: ThreadState, **extra: object) -> None:
    execution = state.execution
    assert execution is not None
    line = {
        "kind": kind,
        "thread": state.thread_id,
        "call": execution.tool_call_id,
        "attempt": execution.attempt,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    fd = os.open(Path(os.environ["CHAOS_DIR"]) / "tools.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())  # one write: atomic with O_APPEND
    finally:
        os.close(fd)
