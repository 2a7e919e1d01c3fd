"""The statements of a few tool runs, as Postgres logged them, made into a pgbench script that does the same work again.

Capture: `log_statement = all` on the benchmark's own Postgres while one client runs a few tool runs; every
statement our database received (the API's, the claim's, the worker's, in the order they were sent) comes back from
the log with its parameters (`parse_log`). Replay: one pgbench "transaction" is those runs, statement after
statement on one connection, each captured transaction kept together (`in_blocks`), the parameters written in as
literals. So that N clients can run it at once and again and again without colliding, `script` changes three things
and nothing else:

- every UUID parameter (the thread, the messages, the log rows, the lease's token) becomes a value of this iteration
  (`md5(:r || '#k')::uuid`), and each iteration starts with a fresh copy of the captured thread's row: a replayed run
  reads and writes a thread of its own, as a run of another user would;
- the claim takes that thread and gives it that token (the captured claim takes the oldest runnable thread and makes
  a token in SQL: N clients would claim each other's threads);
- the guard of the one-statement answers, `xmin = $n` (the row's version the execution last saw), becomes true: the
  replay's row versions are not the captured ones, and a failed guard would write nothing.

Each iteration also inserts that thread row: one INSERT more than the real runs (a small over-estimate of the cost).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# a log line's prefix, as `capture_settings` sets it: `<pid> <database> <LOG|DETAIL|…>:  <message>`
PREFIX = "%p %d "
_LINE = re.compile(r"^(\d+) (\S+) (LOG|DETAIL|ERROR|STATEMENT|WARNING|HINT|CONTEXT):  (.*)$")
_STATEMENT = re.compile(r"^(?:statement|execute [^:]*): (.*)$", re.S)
_PARAMETER = re.compile(r"\$(\d+) = (NULL|'(?:[^']|'')*')", re.S)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PLACEHOLDER = re.compile(r"\$(\d+)\b")
_XMIN_GUARD = re.compile(r"\bxmin = \$\d+")
CANDIDATES = "WHERE t.runnable_since IS NOT NULL"  # the claim's (app/queue.py, _CLAIM)
MARK = "scaleout capture"  # the statement that opens and closes the captured window: SELECT 'scaleout capture'


@dataclass
class Statement:
    pid: int
    sql: str
    params: dict[int, str | None]  # $n -> its text, None for NULL


def capture_settings() -> dict[str, str]:
    """What the server is set to while it captures (ALTER SYSTEM, then reloaded); `log_statement` is set apart."""
    return {"log_line_prefix": PREFIX, "log_parameter_max_length": "-1", "log_min_duration_statement": "-1"}


def _unquote(value: str) -> str | None:
    return None if value == "NULL" else value[1:-1].replace("''", "'")


def parse_log(text: str, database: str) -> list[Statement]:
    """The statements `database` received between its two `SELECT 'scaleout capture'` marks, in the log's order,
    each with its parameters (from the DETAIL line that follows an `execute`). Lines of other databases are skipped;
    a message's continuation lines (a multi-line statement) are joined to it."""
    entries: list[tuple[int, str, str, str]] = []  # pid, database, level, message
    for line in text.splitlines():
        found = _LINE.match(line)
        if found:
            pid, db, level, message = found.groups()
            entries.append((int(pid), db, level, message))
        elif entries:
            pid, db, level, message = entries[-1]
            entries[-1] = (pid, db, level, message + "\n" + line)
    out: list[Statement] = []
    inside = False
    last: Statement | None = None  # the statement of the entry just before, which a DETAIL line belongs to
    for pid, db, level, message in entries:
        before, last = last, None
        if db != database:
            continue
        if level == "DETAIL" and message.lower().startswith("parameters: ") and before and before.pid == pid:
            before.params = {int(n): _unquote(v) for n, v in _PARAMETER.findall(message)}
            continue
        found = _STATEMENT.match(message) if level == "LOG" else None
        if not found:
            continue
        sql = found.group(1).strip().rstrip(";").strip()
        if MARK in sql:
            inside = not inside
        elif inside:
            last = Statement(pid, sql, {})
            out.append(last)
    return out


def _begins(sql: str) -> bool:
    return sql.upper().startswith("BEGIN")


def _ends(sql: str) -> bool:
    return sql.upper() in ("COMMIT", "ROLLBACK")


def whole(statements: list[Statement]) -> list[Statement]:
    """The statements without the transactions the window cut: a connection's statements up to a COMMIT whose BEGIN
    came before the window, and those from a BEGIN whose COMMIT came after it."""
    dropped: set[int] = set()
    open_at: dict[int, int] = {}  # pid -> index of its BEGIN in the window
    first: dict[int, int] = {}  # pid -> index of its first statement in the window
    for i, s in enumerate(statements):
        first.setdefault(s.pid, i)
        if _begins(s.sql):
            open_at[s.pid] = i
        elif _ends(s.sql):
            start = open_at.pop(s.pid, None)
            if start is None:  # begun before the window: all of it that the window holds goes
                dropped.update(j for j in range(first[s.pid], i + 1) if statements[j].pid == s.pid)
    for pid, start in open_at.items():
        dropped.update(j for j in range(start, len(statements)) if statements[j].pid == pid)
    return [s for i, s in enumerate(statements) if i not in dropped]


def in_blocks(statements: list[Statement]) -> list[Statement]:
    """The statements in an order one connection can run them: a transaction's statements together (from its BEGIN
    to its COMMIT), the statements other connections sent meanwhile after it; otherwise the log's order."""
    out: list[Statement] = []
    waiting = list(statements)
    while waiting:
        first = waiting.pop(0)
        out.append(first)
        if not _begins(first.sql):
            continue
        rest: list[Statement] = []
        for i, s in enumerate(waiting):
            if s.pid != first.pid:
                rest.append(s)
                continue
            out.append(s)
            if _ends(s.sql):
                rest.extend(waiting[i + 1 :])
                break
        waiting = rest
    return out


def literal(value: str | None) -> str:
    """A parameter's text as an SQL literal pgbench passes through untouched: an escape string with no `:` (which
    pgbench would read as a variable) and no bare backslash."""
    if value is None:
        return "NULL"
    escaped = value.replace("\\", "\\\\").replace("'", "''").replace(":", "\\x3a")
    return f"E'{escaped}'"


def _token(s: Statement) -> str | None:
    """The lease token a statement checks (`lease_token = $2`: the fence, the guard), if it checks one."""
    value = s.params.get(2)
    return value if "lease_token = $2" in s.sql and value else None


def claim_tokens(ordered: list[Statement]) -> dict[int, str]:
    """For each claim (by its index in `ordered`), the token it made: the one the next statement that checks a
    token checks."""
    out: dict[int, str] = {}
    for i, s in enumerate(ordered):
        if CANDIDATES in s.sql and "gen_random_uuid()" in s.sql:
            found = next((t for later in ordered[i + 1 :] if (t := _token(later))), None)
            if found:
                out[i] = found
    return out


def script(statements: list[Statement], thread: str) -> str:
    """The pgbench script of the captured runs (see the module's docstring): one line per statement."""
    ids: dict[str, str] = {}

    def fresh(value: str) -> str:
        return ids.setdefault(value, f"md5(:r::text || '#{len(ids)}')::uuid")

    thread_id = fresh(thread)
    lines = [
        "\\set r random(1, 1000000000000)",
        f"INSERT INTO threads SELECT (jsonb_populate_record(t, jsonb_build_object('id', {thread_id}))).* "  # noqa: S608
        f"FROM threads t WHERE t.id = '{thread}';",
    ]
    ordered = in_blocks(whole(statements))
    made = claim_tokens(ordered)
    for i, s in enumerate(ordered):
        sql = _XMIN_GUARD.sub("xmin IS NOT NULL", s.sql)
        if i in made:
            sql = sql.replace(CANDIDATES, f"WHERE t.id = {thread_id} AND t.runnable_since IS NOT NULL")
            sql = sql.replace("gen_random_uuid()", fresh(made[i]))

        def value(match: re.Match[str], s: Statement = s) -> str:
            text = s.params.get(int(match.group(1)))
            return fresh(text) if text is not None and _UUID.match(text) else literal(text)

        sql = _PLACEHOLDER.sub(value, sql)
        lines.append(" ".join(sql.split()) + ";")
    return "\n".join(lines) + "\n"


@dataclass
class Bench:
    clients: int
    tps: float  # pgbench "transactions" (script runs) per second
    failed: int


_TPS = re.compile(r"^tps = ([\d.]+) \(without initial connection time\)", re.M)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.M)


def parse_pgbench(output: str, clients: int) -> Bench:
    """pgbench's summary: script runs per second (without the connections' start), failed runs (pgbench ≥ 15)."""
    tps = _TPS.search(output)
    if tps is None:
        raise ValueError(f"no tps in pgbench's output:\n{output[-2000:]}")
    failed = _FAILED.search(output)
    return Bench(clients, float(tps.group(1)), int(failed.group(1)) if failed else 0)


def pgbench(binary: Path, url: str, path: Path, clients: int, seconds: int) -> Bench:
    """Run `path` on `url` with `clients` connections (one thread each, up to 4 pgbench threads) for `seconds`."""
    done = subprocess.run(
        [str(binary), "-n", "-M", "prepared", "-f", str(path), "-c", str(clients), "-j", str(min(clients, 4)),
         "-T", str(seconds), url],
        capture_output=True, text=True, check=False, timeout=seconds + 60,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return parse_pgbench(done.stdout, clients)
