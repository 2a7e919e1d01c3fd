"""The scale-out benchmark's pure parts (bench/scaleout.py): Postgres's log made into a replay script
(bench/replay.py), pgbench's summary, and the projection's arithmetic (bench/projection.py)."""

from __future__ import annotations

import os

import pytest

from bench import projection, replay
from bench.scaleout import own_cpu, tree_cpu

THREAD = "11111111-1111-4111-8111-111111111111"
TOKEN = "22222222-2222-4222-8222-222222222222"
MESSAGE = "33333333-3333-4333-8333-333333333333"
DB = "agents_bench_x"

LOG = f"""\
7 {DB} LOG:  execute __s1__: SELECT 'not yet'
7 {DB} DETAIL:  parameters: $1 = 'before the window'
9 {DB} LOG:  statement: SELECT 'scaleout capture'
5 {DB} LOG:  execute __s2__: WITH candidate AS (SELECT t.id FROM threads t WHERE t.runnable_since IS NOT NULL
\t  LIMIT $1), leased AS (INSERT INTO leases SELECT id, gen_random_uuid() FROM candidate) SELECT 1
5 {DB} DETAIL:  parameters: $1 = '1'
6 {DB} LOG:  statement: BEGIN ISOLATION LEVEL READ COMMITTED;
6 {DB} LOG:  execute __s3__: SELECT * FROM threads t WHERE t.id = $1 AND t.lease_token = $2 FOR UPDATE
6 {DB} DETAIL:  parameters: $1 = '{THREAD}', $2 = '{TOKEN}'
8 other LOG:  execute x: SELECT 'another database'
5 {DB} LOG:  execute __s4__: SELECT 'a claim poll'
6 {DB} LOG:  execute __s5__: INSERT INTO messages (id, thread_id, content, at) VALUES ($1, $2, $3, $4)
6 {DB} DETAIL:  parameters: $1 = '{MESSAGE}', $2 = '{THREAD}', $3 = 'it''s 10:30', $4 = NULL
6 {DB} LOG:  statement: COMMIT
6 {DB} LOG:  execute __s6__: UPDATE messages SET status = 'done' WHERE id = $1 AND xmin = $3 AND lease_token = $2
6 {DB} DETAIL:  parameters: $1 = '{MESSAGE}', $2 = '{TOKEN}', $3 = '812'
9 {DB} LOG:  statement: SELECT 'scaleout capture'
6 {DB} LOG:  execute __s7__: SELECT 'after the window'
"""


def test_the_log_gives_the_windows_statements_of_the_database_with_their_parameters() -> None:
    found = replay.parse_log(LOG, DB)
    assert [s.pid for s in found] == [5, 6, 6, 5, 6, 6, 6]
    claim = found[0]
    assert claim.sql.startswith("WITH candidate AS") and "LIMIT $1)" in claim.sql  # the continuation line joined
    assert claim.params == {1: "1"}
    assert found[1].sql == "BEGIN ISOLATION LEVEL READ COMMITTED"  # its `;` dropped
    assert found[2].params == {1: THREAD, 2: TOKEN}
    assert found[3].params == {}  # a statement without parameters takes none of another's
    assert found[4].params == {1: MESSAGE, 2: THREAD, 3: "it's 10:30", 4: None}
    assert all("window" not in s.sql and "another" not in s.sql for s in found)


def test_a_transaction_is_kept_together_and_what_others_sent_meanwhile_follows_it() -> None:
    ordered = [s.sql.split(" ")[0] + f"@{s.pid}" for s in replay.in_blocks(replay.parse_log(LOG, DB))]
    assert ordered == ["WITH@5", "BEGIN@6", "SELECT@6", "INSERT@6", "COMMIT@6", "SELECT@5", "UPDATE@6"]


def test_a_literal_hides_colons_from_pgbench_and_keeps_quotes_and_backslashes() -> None:
    assert replay.literal(None) == "NULL"
    assert replay.literal("it's 10:30 \\n") == "E'it''s 10\\x3a30 \\\\n'"


def test_the_script_gives_each_iteration_its_own_thread_token_and_rows() -> None:
    text = replay.script(replay.parse_log(LOG, DB), THREAD)
    lines = text.splitlines()
    thread, token, message = (f"md5(:r::text || '#{i}')::uuid" for i in range(3))
    assert lines[0] == "\\set r random(1, 1000000000000)"
    assert f"jsonb_build_object('id', {thread})" in lines[1] and f"WHERE t.id = '{THREAD}'" in lines[1]
    claim = lines[2]
    assert f"WHERE t.id = {thread} AND t.runnable_since IS NOT NULL" in claim  # its own thread
    assert f"SELECT id, {token} FROM candidate" in claim  # the token the fence checks next
    assert "LIMIT E'1'" in claim
    assert lines[4] == f"SELECT * FROM threads t WHERE t.id = {thread} AND t.lease_token = {token} FOR UPDATE;"
    assert f"VALUES ({message}, {thread}, E'it''s 10\\x3a30', NULL);" in lines[5]
    assert lines[8] == f"UPDATE messages SET status = 'done' WHERE id = {message} AND xmin IS NOT NULL AND " + (
        f"lease_token = {token};"
    )
    assert THREAD not in "\n".join(lines[2:]) and TOKEN not in text and MESSAGE not in text


def test_a_claim_without_a_later_token_is_left_as_captured() -> None:
    only_claim = [s for s in replay.parse_log(LOG, DB) if s.sql.startswith("WITH")]
    assert replay.claim_tokens(only_claim) == {}
    assert "gen_random_uuid()" in replay.script(only_claim, THREAD)


PGBENCH = """\
transaction type: run.sql
scaling factor: 1
number of clients: 4
duration: 5 s
number of transactions actually processed: 661
number of failed transactions: 2 (0.301%)
latency average = 30.292 ms
initial connection time = 12.400 ms
tps = 132.047891 (without initial connection time)
"""


def test_pgbenchs_summary_gives_its_rate_and_failures() -> None:
    bench = replay.parse_pgbench(PGBENCH, 4)
    assert (bench.clients, bench.tps, bench.failed) == (4, 132.047891, 2)
    with pytest.raises(ValueError, match="no tps"):
        replay.parse_pgbench("pgbench: error: connection refused", 4)


COST = projection.PerStep(api=3.0, worker=9.0, postgres=5.0, client=6.0)


def test_the_cores_cap_processes_that_share_them() -> None:
    shared = projection.ceiling(COST, 2, 2, client_shares=True)
    assert shared.bound == "cores" and shared.steps_per_s == pytest.approx(2000 / 23)
    assert shared.bounds["api"] == pytest.approx(1000 / 3) and shared.bounds["workers"] == pytest.approx(2000 / 9)
    without_client = projection.ceiling(COST, 2, 2)
    assert without_client.steps_per_s == pytest.approx(2000 / 17)


def test_one_api_process_caps_many_workers_and_postgres_apart_is_capped_by_its_cores() -> None:
    eight = projection.ceiling(COST, 8, 8, postgres_cores=8)
    assert eight.bound == "api" and eight.steps_per_s == pytest.approx(1000 / 3)
    assert eight.bounds["cores"] == pytest.approx(8000 / 12) and eight.bounds["postgres"] == pytest.approx(1600)
    small = projection.ceiling(COST, 8, 8, postgres_cores=0.5, postgres_per_core=400, apis=3)
    assert small.bound == "postgres" and small.steps_per_s == pytest.approx(200)
    same_cores = projection.ceiling(COST, 8, 8, apis=2)
    assert same_cores.bound == "cores" and same_cores.steps_per_s == pytest.approx(8000 / 17)


def test_the_best_split_of_cores_between_api_and_workers() -> None:
    apis, workers, best = projection.best_split(COST, 8, postgres_cores=8)
    # 2 + 6: api 667, workers 667, cores 667; 1 + 7: api 333; 3 + 5: workers 556
    assert (apis, workers) == (2, 6) and best.steps_per_s == pytest.approx(8000 / 12)
    with pytest.raises(ValueError, match="two cores"):
        projection.best_split(COST, 1)


def test_bad_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        projection.ceiling(projection.PerStep(0, 1, 1), 2, 1)
    with pytest.raises(ValueError, match="no steps"):
        projection.per_step(1.0, 0)
    with pytest.raises(ValueError, match="no CPU"):
        projection.per_core(100, 0)
    assert projection.per_step(0.5, 100) == pytest.approx(5.0)
    assert projection.per_core(300, 1.5) == pytest.approx(200)


def test_cpu_is_read_for_this_process_and_its_tree() -> None:
    sum(i * i for i in range(200_000))  # some CPU of its own
    own, _reaped = own_cpu()
    assert own > 0
    assert tree_cpu([os.getpid()]) >= own
    assert tree_cpu([2**22 + 1]) == 0.0  # no such process


def test_transactions_the_window_cut_are_left_out() -> None:
    def at(pid: int, sql: str) -> replay.Statement:
        return replay.Statement(pid, sql, {})

    window = [
        at(1, "UPDATE a"),  # inside a transaction begun before the window
        at(2, "SELECT 1"),
        at(1, "COMMIT"),
        at(1, "SELECT 2"),
        at(3, "BEGIN"),
        at(3, "INSERT b"),
        at(2, "BEGIN"),
        at(2, "SELECT 3"),
        at(2, "COMMIT"),
        at(3, "UPDATE c"),  # its COMMIT came after the window
    ]
    assert [s.sql for s in replay.whole(window)] == ["SELECT 1", "SELECT 2", "BEGIN", "SELECT 3", "COMMIT"]
    assert "BEGIN;\nINSERT b" not in replay.script([*window[4:6]], THREAD)
