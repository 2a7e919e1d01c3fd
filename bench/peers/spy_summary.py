#!/usr/bin/env python3
"""Summarise a `py-spy record --format raw` profile: top functions by own and by total samples, and own time
by package (the package of the innermost Python frame of each sample).

usage: python3 bench/peers/spy_summary.py profile.raw [TOP_OWN] [TOP_TOTAL]

Samples of idle pool threads (a thread waiting on its queue: `Condition.wait` under `WorkerThread.run`/`Queue.get`)
are dropped: py-spy counts them although they hold no CPU. SQLAlchemy's async layer runs ORM code in greenlets,
which py-spy reports as separate stacks rooted at the ORM call (`Session.execute`, `Session.flush`, ...): their
samples count for their own frames but not for the app frames that awaited them, so "total" under-states the app
functions that use the ORM; the by-package view does not depend on it. Samples of other threads than the event loop's
(rooted at `Thread._bootstrap`: the heartbeat's, pool threads at work) are counted apart, by their thread's function,
and left out of the rest: py-spy takes a thread that waits in its own event loop for a busy one.
"""

from __future__ import annotations

import collections
import re
import sys

PACKAGES = [  # (substring of the frame's file, name)
    ("sqlalchemy/", "SQLAlchemy"),
    ("asyncpg/", "asyncpg"),
    ("pydantic_core/", "pydantic"),
    ("pydantic/", "pydantic"),
    ("sse_starlette/", "SSE (sse_starlette)"),
    ("starlette/", "starlette"),
    ("fastapi/", "fastapi"),
    ("uvicorn/", "uvicorn"),
    ("anyio/", "anyio"),
    ("httpx/", "httpx"),
    ("greenlet/", "greenlet"),
    ("(json/", "json (stdlib)"),
    ("(logging/", "logging"),
    ("(asyncio/", "asyncio (stdlib; leaf = uvloop C loop)"),
    ("(app/", "app (our code)"),
    ("(agents/", "bench agents"),
]
IDLE = ("Condition.wait (threading.py", "Queue.get (queue.py")


def package(frame: str) -> str:
    for key, name in PACKAGES:
        if key in frame:
            return name
    return "stdlib / other" if frame else "(no Python frame)"


def short(f: str) -> str:
    return re.sub(r"\((?:[^()]*/)?(site-packages|lib/python3\.\d+)/", "(", f)


def main() -> None:
    path = sys.argv[1]
    top_own = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    top_total = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    own: collections.Counter[str] = collections.Counter()
    tot: collections.Counter[str] = collections.Counter()
    pkg_own: collections.Counter[str] = collections.Counter()
    pkg_tot: collections.Counter[str] = collections.Counter()
    active = idle = 0
    threads: collections.Counter[str] = collections.Counter()  # other threads' samples, by the function they run
    with open(path) as fh:
        lines = [line.rstrip("\n") for line in fh]
    for line in lines:
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [f for f in stack.split(";") if f]
        if (
            frames
            and frames[-1].startswith(IDLE)
            and any("WorkerThread.run" in f or "Thread._bootstrap" in f for f in frames)
        ):
            idle += n
            continue
        if any("Thread._bootstrap" in f for f in frames):
            entry = [f for f in frames if not f.startswith(("Thread._bootstrap", "Thread.run ("))]
            threads[short(entry[0]) if entry else "(unknown)"] += n
            continue
        active += n
        leaf = frames[-1] if frames else "(no Python frame)"
        own[leaf] += n
        for f in set(frames) or {leaf}:
            tot[f] += n
        pkg_own[package(frames[-1] if frames else "")] += n
        for p in {package(f) for f in frames}:
            pkg_tot[p] += n

    def pct(n: int) -> str:
        return f"{100 * n / active:5.1f}%"

    print(f"{active} active samples of the event loop's thread (idle pool-thread samples dropped: {idle}); % of them\n")
    if threads:
        print(
            f"other threads ({sum(threads.values())} samples, apart): "
            + ", ".join(f"{name} {n}" for name, n in threads.most_common(5))
            + "\n"
        )
    print(f"## top {top_own} functions by own samples (the innermost Python frame; C code it calls counts here)\n")
    for f, n in own.most_common(top_own):
        print(f"{pct(n)}  {short(f)}")
    print(f"\n## top {top_total} functions by total samples (on the stack)\n")
    for f, n in tot.most_common(top_total):
        print(f"{pct(n)}  {short(f)}")
    print("\n## own samples by package (innermost Python frame)  |  samples with the package anywhere on the stack\n")
    for p, n in pkg_own.most_common():
        print(f"{pct(n)}  {p:42s} | {pct(pkg_tot[p])}")


if __name__ == "__main__":
    main()
