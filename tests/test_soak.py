"""The soak's verdict (bench/soak_sample.py) on made-up samples: each of the issue's figures can fail."""

from __future__ import annotations

from bench.soak import parse
from bench.soak_sample import Sample, Turn, minute_table, table_table, verdicts


def sample(minute: int, rss: float, turn_s: float, dead: int = 10, live: int = 1000) -> Sample:
    table = {"live": live, "dead": dead, "autovacuums": minute, "vacuums": 0, "updates": 10, "hot_updates": 9,
             "table_bytes": 2**20 * minute, "index_bytes": 2**19}  # fmt: skip
    turns = [Turn(float(minute), turn_s / 3, turn_s + i / 100) for i in range(20)]
    queue = {"waiting": 0, "leased": 3, "effects_due": 0, "db_bytes": 2**20 * (10 + minute)}
    rss_mb = {"api": rss, "worker A": rss, "worker B": 100.0}
    return Sample(float(minute), rss_mb, {"threads": table}, {}, {"active": 5, "idle": 20}, queue, turns)


def judged(samples: list[Sample], window: int = 2) -> dict[str, bool]:
    return {v.what.split(",")[0].split(" (")[0]: v.ok for v in verdicts(samples, window, ["api", "worker A"])}


def test_a_flat_run_passes() -> None:
    samples = [sample(m, rss=200.0, turn_s=3.0) for m in range(1, 7)]
    assert all(judged(samples).values())
    assert "database growth per turn" in judged(samples)


def test_memory_that_creeps_after_the_warm_up_fails() -> None:
    samples = [sample(m, rss=200.0 + (30 if m >= 5 else 0), turn_s=3.0) for m in range(1, 7)]
    assert judged(samples)["RSS of `api` after warm-up within +10 %"] is False
    warm_up_only = [sample(m, rss=100.0 if m == 1 else 200.0, turn_s=3.0) for m in range(1, 7)]
    assert judged(warm_up_only)["RSS of `api` after warm-up within +10 %"] is True  # the warm-up is not judged


def test_latencies_that_drift_fail() -> None:
    samples = [sample(m, rss=200.0, turn_s=3.0 if m <= 4 else 3.9) for m in range(1, 7)]
    verdict = judged(samples)
    assert verdict["turn time p50"] is False
    assert verdict["first output p50"] is False


def test_dead_tuples_that_grow_past_the_autovacuum_trigger_fail() -> None:
    bound = 2 * (50 + 0.2 * 1000)
    assert judged([sample(m, 200.0, 3.0, dead=int(bound)) for m in range(1, 7)])["dead tuples bounded"] is True
    growing = [sample(m, 200.0, 3.0, dead=int(bound) if m < 5 else int(1.5 * bound) + 1) for m in range(1, 7)]
    assert judged(growing)["dead tuples bounded"] is False
    flat = [sample(m, 200.0, 3.0, dead=3 * int(bound)) for m in range(1, 7)]  # above the trigger, not growing
    assert judged(flat)["dead tuples bounded"] is True
    creeping = [sample(m, 200.0, 3.0, dead=(2 + m) * int(bound)) for m in range(1, 7)]
    assert judged(creeping)["dead tuples bounded"] is False


def test_dead_tuples_in_a_sawtooth_are_judged_by_their_level_not_by_one_tooth() -> None:
    """Between two autovacuum runs a hot table's dead tuples climb, then drop to nothing: a sample is wherever the
    tooth was. The same level after the warm-up and at the end passes, whatever one sample shows."""
    teeth = {1: 0, 2: 100, 3: 900, 4: 0, 5: 1400, 6: 0}  # windows of 2: after the warm-up 2-3, the last 5-6
    assert judged([sample(m, 200.0, 3.0, dead=teeth[m]) for m in range(1, 7)])["dead tuples bounded"] is True
    higher = {**teeth, 5: 1400, 6: 400}  # the level grew by more than half
    assert judged([sample(m, 200.0, 3.0, dead=higher[m]) for m in range(1, 7)])["dead tuples bounded"] is False


def test_too_short_a_run_is_not_passed() -> None:
    assert judged([sample(1, 200.0, 3.0)]) == {"enough samples": False}


def test_the_tables_show_each_sample_and_each_table() -> None:
    samples = [sample(m, rss=200.0, turn_s=3.0) for m in (1, 2)]
    rows = minute_table(samples, ["worker A", "worker B"])
    assert len(rows) == 4
    assert rows[2].startswith("| 1.0 | 20 | 1000.0 / 1000.0 | 3090.0 / 3190.0 | 200 / 200 / 100 | 11.0 |")
    assert "| threads | 1.00 → 2.00 | 0.50 → 0.50 | 1000 → 1000 | 10 → 10 | 2 | 10 (90%) |" in table_table(*samples)


def test_the_hour_is_the_default() -> None:
    args = parse([])
    assert (args.minutes, args.clients) == (60, 200)
    assert parse(["--minutes", "4"]).minutes == 4
