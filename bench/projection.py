"""The scale-out model of `bench/scaleout.py`: LLM steps/s a set of processes on a number of cores can reach, from the
CPU one step costs each kind of process. Pure arithmetic, so that its assumptions are tested and read in one place:

- a step costs `api` ms of CPU in the API process, `worker` ms in a worker and `postgres` ms in Postgres's processes,
  whatever the number of processes (measured at load, so the per-step share of heartbeats and polls is in it);
- one process uses at most one core (one event loop): the API caps the whole at 1000 / `api` steps/s, n workers at
  n x 1000 / `worker` (the lock on a thread row is per thread, so workers do not wait on each other);
- the processes that share the cores share them perfectly: their CPU per step summed over what the cores give;
- Postgres on cores of its own is capped by what it did per core here (`postgres_per_core`, steps/s per core of
  Postgres CPU, from the replay or from the load's own figures), times its cores: linear, which holds only while
  nothing in it serialises (the claim's queue scan and the WAL's insertion are shared by every connection).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PerStep:
    """CPU ms per LLM step of each kind of process (and of the load's client, where it shares the cores)."""

    api: float
    worker: float
    postgres: float
    client: float = 0.0


@dataclass(frozen=True)
class Ceiling:
    steps_per_s: float
    bound: str  # what caps it: "cores", "api", "workers" or "postgres"
    bounds: dict[str, float]


def ceiling(
    cost: PerStep,
    cores: float,
    workers: int,
    postgres_cores: float | None = None,
    postgres_per_core: float | None = None,
    client_shares: bool = False,
    apis: int = 1,
) -> Ceiling:
    """What `apis` API and `workers` worker processes on `cores` cores reach. `postgres_cores` None: Postgres runs on
    the same cores (its CPU per step adds to theirs); a number: on that many cores of its own, each good for
    `postgres_per_core` steps/s (default: 1000 / `cost.postgres`). `client_shares`: the load's client on them too."""
    if min(cost.api, cost.worker, cost.postgres) <= 0 or cores <= 0 or workers < 1 or apis < 1:
        raise ValueError("CPU per step, cores and processes must be positive")
    shared = cost.api + cost.worker + (cost.client if client_shares else 0.0)
    bounds = {"api": apis * 1000 / cost.api, "workers": workers * 1000 / cost.worker}
    if postgres_cores is None:
        shared += cost.postgres
    else:
        per_core = postgres_per_core if postgres_per_core is not None else 1000 / cost.postgres
        bounds["postgres"] = postgres_cores * per_core
    bounds["cores"] = cores * 1000 / shared
    bound = min(bounds, key=lambda k: bounds[k])
    return Ceiling(bounds[bound], bound, bounds)


def best_split(cost: PerStep, cores: int, postgres_cores: float | None = None) -> tuple[int, int, Ceiling]:
    """The number of API and worker processes, one per core (`cores` in all), that reaches the most steps/s, and
    what it reaches; Postgres as `ceiling` takes it. Ties go to fewer API processes."""
    if cores < 2:
        raise ValueError("an API and a worker need two cores")
    splits = [(a, cores - a, ceiling(cost, cores, cores - a, postgres_cores, apis=a)) for a in range(1, cores)]
    return max(splits, key=lambda s: (round(s[2].steps_per_s, 6), -s[0]))


def per_step(cpu_seconds: float, steps: int) -> float:
    """CPU ms per step of `cpu_seconds` spent over `steps` steps."""
    if steps <= 0:
        raise ValueError("no steps were completed")
    return cpu_seconds * 1000 / steps


def per_core(steps_per_s: float, cpu_cores: float) -> float:
    """Steps/s per core of CPU a process group used to make them (its CPU seconds over the wall seconds)."""
    if cpu_cores <= 0:
        raise ValueError("no CPU was used")
    return steps_per_s / cpu_cores
