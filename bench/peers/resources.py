"""B3's resource sampler: RSS / PSS and CPU of process trees, read from /proc (Linux)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any


def read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_text(f"/proc/{name}/stat")
            if stat:
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(name))
    return kids


def _tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _mem_kb(pid: int, key: str) -> int:
    src = "smaps_rollup" if key == "Pss" else "status"
    for line in read_text(f"/proc/{pid}/{src}").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    stat = read_text(f"/proc/{pid}/stat")
    if not stat:
        return 0.0
    f = stat.rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """Samples RSS (server, redis) and PSS (postgres, whose shared buffers RSS would double count).

    A group is one pid or a list of pids (e.g. an API process and a worker process); each pid counts with its
    children, every process once."""

    def __init__(self, groups: dict[str, tuple[int | list[int], str]], interval: float = 0.5) -> None:
        self.groups = {k: v for k, v in groups.items() if v[0]}
        self.interval = interval
        self.samples: dict[str, list[int]] = {k: [] for k in self.groups}
        self.cpu0: dict[str, float] = {}
        self.cpu1: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._dead_cpu: dict[str, float] = {}

    def _snapshot(self) -> tuple[dict[str, int], dict[str, float]]:
        kids = _children_map()
        mem, cpu = {}, {}
        for name, (roots, key) in self.groups.items():
            pids = {p for root in (roots if isinstance(roots, list) else [roots]) for p in _tree(root, kids)}
            mem[name] = sum(_mem_kb(p, key) for p in pids)
            cpu[name] = sum(_cpu_s(p) for p in pids)
        return mem, cpu

    async def _loop(self) -> None:
        while True:
            mem, cpu = self._snapshot()
            for k, v in mem.items():
                self.samples[k].append(v)
            self.cpu1 = cpu
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        _, self.cpu0 = self._snapshot()
        self.wall0 = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> dict[str, Any]:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        mem, self.cpu1 = self._snapshot()
        wall = time.perf_counter() - self.wall0
        out: dict[str, Any] = {}
        for k in self.groups:
            s = self.samples[k] or [mem[k]]
            # CPU of processes that exited during the window (postgres backends) is not counted.
            cpu = max(0.0, self.cpu1.get(k, 0) - self.cpu0.get(k, 0))
            out[k] = {
                "mem_kind": self.groups[k][1],
                "mem_mb_start": round(s[0] / 1024, 1),
                "mem_mb_max": round(max(s) / 1024, 1),
                "mem_mb_median": round(statistics.median(s) / 1024, 1),
                "mem_mb_end": round(mem[k] / 1024, 1),
                "cpu_s": round(cpu, 2),
                "cpu_cores": round(cpu / wall, 2) if wall > 0 else None,
            }
        return out
