"""The walk of one message, measured: the modules of `app/` that a plain message passes through from its `POST` to the
SSE frame of its answer, in order, and how often the walk enters again a module it had already entered.

One process serves the API and a worker (`agents serve` in-process, on a fresh migrated database) with the `bench`
agent (a zero-latency `test` model that answers "ok"). A stream is opened on a new thread and the thread is answered
once (a warm-up, so that first-use caches and imports are not counted); then a profiler is set (`sys.setprofile`),
one message is posted, and the profiler is removed when the stream has read the frame of the answer.

A MOVE is a function of `app/` starting (not a coroutine resuming) whose nearest caller in `app/` is in another
module, or that has no caller in `app/` (a route called by the framework, a task started by the event loop). The
walk is the sequence of moves; a module is ENTERED at its first move, RE-ENTERED at every later one. A module's own
calls to itself are not moves; a callee returning to its caller is not a move either (the walk counts calls, as
the issue that asked for it did).

    .venv/bin/python -m bench.walk [--moves]     # --moves prints every move, with the function and its task
"""

from __future__ import annotations

import argparse
import asyncio
import dis
import json
import sys
import tempfile
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from app.api.app import create_app
from app.catalog import load
from app.settings import Settings
from bench.harness import ROOT, Received, Stream, database, free_port, postgres_server

APP = str(ROOT / "app") + "/"


@dataclass
class Walk:
    moves: list[tuple[str, str, str]] = field(default_factory=list)  # (module, function, task)
    _resume_at: dict[types.CodeType, int] = field(default_factory=dict)

    def _module(self, code: types.CodeType) -> str | None:
        path = code.co_filename
        if not path.startswith(APP):
            return None
        return path[len(APP) :].removesuffix(".py").removesuffix("/__init__")

    def _starts(self, frame: types.FrameType) -> bool:
        """Whether a `call` event is a function starting, not a coroutine or generator resuming."""
        code = frame.f_code
        at = self._resume_at.get(code)
        if at is None:
            at = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
            self._resume_at[code] = at
        return frame.f_lasti <= at

    def profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = self._module(frame.f_code)
        if module is None or not self._starts(frame):
            return
        caller = frame.f_back
        while caller is not None and self._module(caller.f_code) is None:
            caller = caller.f_back
        if caller is not None and self._module(caller.f_code) == module:
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        name = getattr(task.get_coro(), "__qualname__", "?") if task is not None else "-"
        self.moves.append((module, frame.f_code.co_qualname, name))


def summary(walk: Walk) -> tuple[list[str], int, Counter[str]]:
    entered: list[str] = []
    again: Counter[str] = Counter()
    for module, _, _ in walk.moves:
        if module in entered:
            again[module] += 1
        else:
            entered.append(module)
    return entered, sum(again.values()), again


async def measure(url: str) -> Walk:
    settings = Settings(
        database_url=url,
        agents_dir=ROOT / "bench" / "agents",
        data_dir=Path(tempfile.mkdtemp(prefix="bench-walk-")),
        secret_key="bench-" + "k" * 40,
        poll_interval=0.05,
    )
    app = create_app(settings, load(settings.agents_dir), with_worker=True)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    base = f"http://127.0.0.1:{port}"
    walk = Walk()
    async with httpx.AsyncClient(base_url=base) as client:
        while not server.started:  # noqa: ASYNC110 (uvicorn says it only by this flag)
            await asyncio.sleep(0.05)
        thread = (await client.post("/threads", json={"agent": "bench"})).json()["id"]
        stream = Stream(base, f"/threads/{thread}/events")
        reading = asyncio.create_task(stream.run())
        await stream.connected.wait()

        def answer(event: Received) -> bool:
            message = event.data["data"]
            return bool(message.get("role") == "assistant" and message.get("status") == "completed")

        for traced in (False, True):
            start = len(stream.events)
            if traced:
                sys.setprofile(walk.profile)
            try:
                (await client.post(f"/threads/{thread}/messages", json={"content": "hello"})).raise_for_status()
                await stream.until("message_data", answer, start)
            finally:
                sys.setprofile(None)
            await stream.until("thread_status", lambda e: e.data.get("status") == "idle", start)
            await asyncio.sleep(0.5)  # what the execution does after its last commit (its meter, its history)
        reading.cancel()
    server.should_exit = True
    await serving
    return walk


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", action="store_true", help="print every move")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    with postgres_server() as server:
        async with database(server) as url:
            walk = await measure(url)
    entered, again, by_module = summary(walk)
    if args.json:
        print(json.dumps({"entered": entered, "re_entries": again, "by_module": dict(by_module)}))
        return
    if args.moves:
        for module, function, task in walk.moves:
            print(f"{module:<28} {function:<48} {task}")
        print()
    print(" → ".join(f"{m}" for m in entered))
    print(f"\n{len(entered)} modules entered, {again} re-entries, {len(walk.moves)} moves")
    print("re-entered: " + ", ".join(f"{m} {n}" for m, n in by_module.most_common()))


if __name__ == "__main__":
    asyncio.run(main())
