"""`agents <command>`: serve | api | worker | migrate | check | health | keys | env — argument parsing and dispatch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import httpx
import uvicorn
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app import (
    __version__,
    admin,
    catalog,
    crypto,
    db,
    dsn,
    environment,
    errors,
    keys,
    liveness,
    llm,
    logconfig,
    migrations,
    postgres,
    tables,
    tokens,
)
from app.catalog import Catalog
from app.settings import MAKE_A_KEY, Settings

if TYPE_CHECKING:  # imported by the commands that serve (`_serve`, `_worker`): the others start without them
    from fastapi import FastAPI

    from app.runtime import Runtime

log = logging.getLogger("app")

UNUSABLE_DATABASE = 2  # the exit code when DATABASE_URL is not a Postgres URL, or no connection to it opens


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[Settings]:
    """Settings pointing at `DATABASE_URL`, or at an embedded Postgres started for the block."""
    if settings.database_url:
        yield settings
        return
    with postgres.embedded(settings) as url:
        embedded = settings.model_copy(update={"database_url": url})
        asyncio.run(_migrate(embedded))  # the embedded database is ours: keep it current
        yield embedded


def load_catalog(settings: Settings) -> Catalog:
    """The catalog, or exit with every problem listed."""
    try:
        loaded = catalog.load(settings.agents_dir)
    except catalog.CatalogError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        raise SystemExit(f"refusing to start: {len(exc.problems)} problem(s) in {settings.agents_dir}") from exc
    for warning in loaded.warnings:
        log.warning("%s", warning)
    return loaded


class NoSession(Exception):
    """A LISTEN on the URL for sessions hears nothing: a pooler in transaction mode; the message says what to set."""


async def _check_session(settings: Settings) -> None:
    """Refuse to start when the URL that LISTENs (`DATABASE_DIRECT_URL`, else `DATABASE_URL`) hears no NOTIFY: a
    pooler in transaction mode, where streams would never go live and workers would hear of nothing."""
    url = settings.session_url
    assert url
    if await db.hears(url):
        return
    if settings.pooled:
        raise NoSession(
            f"DATABASE_DIRECT_URL ({dsn.redacted(url)}) is not a direct connection: a LISTEN there hears no NOTIFY "
            "(a pooler in transaction mode?); set it to the database server's own host and port"
        )
    raise NoSession(
        f"DATABASE_URL ({dsn.redacted(url)}) is a connection pooler in transaction mode: a LISTEN there hears no "
        "NOTIFY, so streams and workers would wait in silence; keep DATABASE_URL on the pooler and set "
        "DATABASE_DIRECT_URL to a direct connection to the same database (LISTEN and migrations use it); see "
        'docs/deployment.md, "Behind a connection pooler"'
    )


async def _migrate(settings: Settings) -> migrations.Schema:
    assert settings.session_url
    engine = db.create_engine(settings.session_url, 1)  # a session of its own: never through a pooler
    try:
        return await migrations.upgrade(engine)
    finally:
        await engine.dispose()


async def _bootstrap(settings: Settings, session: AsyncSession) -> tuple[tables.ApiKey, str] | None:
    """Store `ADMIN_API_KEY`'s key if it is set and not stored yet; its row, and what became of it."""
    if settings.admin_api_key is None:
        return None
    row, created = await keys.bootstrap(session, settings.admin_api_key.get_secret_value())
    if row.revoked_at is not None:
        return row, (
            f"ADMIN_API_KEY's key {row.prefix}… was revoked on {row.revoked_at:%Y-%m-%d} and stays revoked: "
            "choose another ADMIN_API_KEY, or unset it"
        )
    said = f"ADMIN_API_KEY's admin key {row.prefix}… for user {row.user_id} {'stored' if created else 'is stored'}"
    return row, said


async def _migrate_and_bootstrap(settings: Settings) -> tuple[migrations.Schema, str | None]:
    found = await _migrate(settings)
    assert settings.database_url
    engine = db.create_engine(settings.database_url, 1, pooled=settings.pooled)
    try:
        async with db.sessionmaker(engine)() as session, session.begin():
            stored = await _bootstrap(settings, session)
    finally:
        await engine.dispose()
    return found, stored[1] if stored else None


async def _before_serving(settings: Settings) -> None:
    """Store `ADMIN_API_KEY`'s key if it is new; then, bound beyond loopback, the API needs at least one key (and a
    real `SECRET_KEY`)."""
    crypto.server_key(settings)
    assert settings.database_url
    engine = db.create_engine(settings.database_url, 1, pooled=settings.pooled)
    try:
        async with db.sessionmaker(engine)() as session, session.begin():
            if stored := await _bootstrap(settings, session):
                log.info("%s", stored[1])
            count = await keys.active_count(session)
            hidden = await keys.open_threads(session) if count else 0
    finally:
        await engine.dispose()
    if count and settings.loopback:  # not the open mode a developer on this machine may expect: say why, loudly
        log.warning("%s", _keys_required(settings, count, stored[0] if stored else None))
    if hidden:
        log.warning("%s", admin.hidden_threads(hidden, "<id>"))
    if count == 0 and not settings.loopback:
        raise SystemExit(
            f"refusing to serve on {settings.host} without an API key: set ADMIN_API_KEY to a key you choose "
            f"(make one with: {MAKE_A_KEY}), or create one with `agents keys create --user <id>` "
            "(in compose: `docker compose run --rm api agents keys create --user <id>`), or bind to 127.0.0.1"
        )


def _keys_required(settings: Settings, count: int, admin: tables.ApiKey | None) -> str:
    """Why a server on loopback is not open: what each request needs, where the admin key came from, and how to
    serve open again."""
    said = (
        f"API keys are REQUIRED ({count} active key(s)): every request needs `Authorization: Bearer <key>` "
        "(the playground: paste one at the top), else 401."
    )
    how = "revoke the active keys (`agents keys list`, `agents keys revoke <id>`)"
    if admin is not None and admin.revoked_at is None:
        where = settings.origin("admin_api_key")
        said += f" The admin key {admin.prefix}… is ADMIN_API_KEY from {where}."
        unset = "unset it" if where == "the environment" else f"remove it from {where}"
        how = f"{unset} and revoke its key: `agents keys revoke {admin.prefix}…`" + (
            " (and the other keys: `agents keys list`)" if count > 1 else ""
        )
    return f"{said} To serve open on loopback again, {how}."


def _listen(settings: Settings) -> socket.socket:
    """The API's listening socket, bound before anything is served: a port someone else holds is said in one line."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart need not wait
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        why = "another process is listening on it" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise SystemExit(
            f"error: cannot listen on {settings.host}:{settings.port} ({why}): "
            "pick another port with --port <n> or PORT=<n>"
        ) from None
    return sock


async def _warn_missing_keys(settings: Settings, catalog: Catalog) -> None:
    """Warn, once at start, of each model whose key is set neither in the environment nor as an instance variable
    (nor in an agent's or prompt's `env`): its calls would fail, and only then say why."""
    assert settings.database_url
    engine = db.create_engine(settings.database_url, 1, pooled=settings.pooled)
    try:
        async with db.sessionmaker(engine)() as session:
            _, instance = await environment.public(session, "instance", environment.INSTANCE)
    finally:
        await engine.dispose()
    for warning in llm.missing_keys(catalog, _set_variables(settings) | set(instance)):
        log.warning("%s", warning)


def _set_variables(settings: Settings) -> set[str]:
    """The process environment's variables that hold a value (an empty key is no key)."""
    return {name for name, value in settings.process_env.items() if value.strip()}


def _serve(settings: Settings, with_worker: bool, migrate: bool) -> None:
    from app.api.app import create_app

    catalog = load_catalog(settings)
    settings = settings.serving(with_worker)
    with database(settings) as settings:
        asyncio.run(_check_session(settings))
        if migrate and settings.migrate_on_start:
            asyncio.run(_migrate(settings))
        asyncio.run(_before_serving(settings))
        sock = _listen(settings)
        asyncio.run(_warn_missing_keys(settings, catalog))
        app = create_app(settings, catalog, with_worker=with_worker)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            access_log=settings.access_log,
            log_config=None if settings.log_format == "json" else logconfig.uvicorn_text(),  # json: ours
            timeout_graceful_shutdown=5,
            timeout_keep_alive=settings.keep_alive_seconds,  # uvicorn's 5 s equals httpx's expiry: a race (bench/burst)
        )
        tokens.mask_logs()  # after the Config: it sets uvicorn's handlers up
        _settle()
        _Server(config, app).run(sockets=[sock])


def _settle() -> None:
    """Move what start-up made (modules, models, the catalog) out of the collector's sight: a full collection then
    walks only what serving creates, so 1,000 open streams do not cost pauses of hundreds of ms (bench/P4)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class _Server(uvicorn.Server):
    """uvicorn, but a SIGTERM/SIGINT ends `run()` normally so the embedded Postgres is stopped after it; the socket
    bound beforehand (`_listen`) is announced as uvicorn announces its own; and the app's runtime is told at once
    (`Runtime.stopping`) so that requests still waiting (`?wait=`) answer within the grace period."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._tell_stopping)  # from a signal handler: through the loop

    def _tell_stopping(self) -> None:
        runtime: Runtime | None = getattr(self._app.state, "runtime", None)  # None until the lifespan has opened it
        if runtime is not None:
            runtime.stopping.set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets and self.started:
            self._log_started_message(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handlers = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


async def _worker(settings: Settings) -> None:
    from app.runtime import Runtime

    catalog = load_catalog(settings)
    await _check_session(settings)
    await _schema_fits(settings)
    await _warn_missing_keys(settings, catalog)
    async with Runtime.open(settings, catalog, api=False, worker=True) as runtime:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runtime.stopping.set)
        _settle()
        await runtime.until_stopped()


async def _schema_fits(settings: Settings) -> None:
    """A worker waits while the database is behind this release and exits on a schema it does not run on."""
    assert settings.database_url
    engine = db.create_engine(settings.database_url, 1, pooled=settings.pooled)
    try:
        await migrations.until_runs(engine)
    finally:
        await engine.dispose()


def _check(settings: Settings) -> int:
    try:
        loaded = catalog.load(settings.agents_dir)
    except catalog.CatalogError:
        problems = catalog.check(settings.agents_dir)  # the errors with the warnings, in file order
        for problem in problems:
            print(problem)
        errors_found = [p for p in problems if p.severity == "error"]
        print(f"\n{len(errors_found)} error(s) in {settings.agents_dir}", file=sys.stderr)
        return 1
    warnings = [str(p) for p in loaded.warnings]
    warnings += [
        f"warning: {w} (instance variables not consulted)" for w in llm.missing_keys(loaded, _set_variables(settings))
    ]
    for warning in warnings:
        print(warning)
    print(f"{settings.agents_dir}: ok ({len(warnings)} warning(s))")
    return 0


def _health(settings: Settings, args: argparse.Namespace) -> int:
    """`agents health api|worker`: exit 0 when it is healthy, else 1 with why (for container health checks)."""
    if args.health_command == "worker":
        if settings.worker_heartbeat_file is None:
            raise SystemExit("error: WORKER_HEARTBEAT_FILE is not set, so no worker writes a heartbeat to check")
        why, beat = liveness.problem(settings.worker_heartbeat_file, args.max_age)
        if why is not None:
            raise SystemExit(f"error: {why}")
        assert beat is not None
        print(f"worker process {beat.pid} is alive ({beat.owner})")
        return 0
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.host, settings.host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{settings.port}/ready"
    try:
        answer = httpx.get(url, timeout=args.timeout)
    except httpx.HTTPError as exc:
        raise SystemExit(f"error: nothing answers at {url} ({type(exc).__name__})") from None
    if answer.status_code != 200:
        raise SystemExit(f"error: {url} answered {answer.status_code}: {answer.text[:200]}")
    print(f"api at {url} is ready")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agents", description="The Standard Agents runtime.")
    p.add_argument("--version", action="version", version=f"agents {__version__}", help="print the version and exit")
    p.add_argument("--agents-dir", type=Path, help="agents folder (default: AGENTS_DIR or ./agents)")
    p.add_argument(
        "-v", "--verbose", action="store_true", help="also log what the libraries say (pgserver, initdb, alembic)"
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("serve", "API and a worker pool in one process"), ("api", "the API alone")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--host", help="address to listen on (default: HOST or 127.0.0.1)")
        s.add_argument("--port", type=int, help="port to listen on (default: PORT or 8000)")
        if name == "serve":
            s.add_argument("--concurrency", type=int, help="concurrent thread executions (default: WORKER_CONCURRENCY)")
            s.add_argument("--no-migrate", action="store_true", help="do not migrate at start")
    w = sub.add_parser("worker", help="a worker pool alone")
    w.add_argument("--concurrency", type=int, help="concurrent thread executions (default: WORKER_CONCURRENCY)")
    sub.add_parser("migrate", help="upgrade the database to the latest migration")
    sub.add_parser("check", help="validate the agents folder")
    h = sub.add_parser("health", help="exit 0 when a local api or worker is healthy (for container health checks)")
    hs = h.add_subparsers(dest="health_command", required=True)
    ha = hs.add_parser("api", help="GET /ready on HOST:PORT answers 200")
    ha.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    hw = hs.add_parser(
        "worker", help="the worker writing WORKER_HEARTBEAT_FILE is alive, not stuck, and reaches the database"
    )
    hw.add_argument("--max-age", type=float, help="seconds a beat may be old (default: what the worker wrote)")
    k = sub.add_parser("keys", help="API keys")
    ks = k.add_subparsers(dest="keys_command", required=True)
    kc = ks.add_parser("create", help="print a new key, alone on stdout (what else it says goes to stderr)")
    kc.add_argument("--user", required=True, help="the user the key acts as")
    kc.add_argument("--admin", action="store_true", help="an admin key: it sees every user's threads")
    kc.add_argument(
        "--adopt-local", action="store_true", help="give the user the threads and user variables made in open mode"
    )
    ka = ks.add_parser("adopt-local", help="give a user the threads and user variables made in open mode")
    ka.add_argument("--user", required=True, help="the user who takes them")
    kl = ks.add_parser("list", help="list keys (never the keys themselves)")
    kl.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    kr = ks.add_parser("revoke", help="revoke a key by its id or the prefix `keys list` shows")
    kr.add_argument("key", help="the key's id, or its prefix as `keys list` shows it (`…` optional)")
    e = sub.add_parser("env", help="instance and user variables (threads of every user inherit instance ones)")
    es = e.add_subparsers(dest="env_command", required=True)
    for name, text in (("set", "set a value"), ("list", "list values (secrets masked)"), ("delete", "remove a value")):
        c = es.add_parser(name, help=text)
        whose = c.add_mutually_exclusive_group()
        whose.add_argument("--instance", action="store_true", help="the instance's values (the default)")
        whose.add_argument("--user", help="this user's values")
        if name == "list":
            c.add_argument("--json", action="store_true", help='{"env": ..., "env_types": ...} as the API answers')
        else:
            c.add_argument("name", help="the variable's name (letters, digits, `_`; not starting with a digit)")
        if name == "set":
            c.add_argument("value", help="its value")
            c.add_argument("--secret", action="store_true", help="encrypt it; it is never shown again")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        read = Settings()
    except ValidationError as exc:
        print(f"error: invalid setting: {errors.problems(exc.errors(), spell=str.upper)}", file=sys.stderr)
        url_refused = any(e["loc"] in (("database_url",), ("database_direct_url",)) for e in exc.errors())
        raise SystemExit(UNUSABLE_DATABASE if url_refused else 1) from None
    if read.database_direct_url and not read.database_url:
        print(
            "error: DATABASE_DIRECT_URL is set but DATABASE_URL is not: set DATABASE_URL to the pooler's URL "
            "(or unset DATABASE_DIRECT_URL)",
            file=sys.stderr,
        )
        raise SystemExit(UNUSABLE_DATABASE)
    serving = args.command in ("serve", "api", "worker")  # the others' output is what they print
    logconfig.configure(read.log_level, read.log_format == "json", verbose=args.verbose, quiet=not serving)
    overrides: dict[str, object] = {}
    for field, attr in (
        ("agents_dir", "agents_dir"),
        ("host", "host"),
        ("port", "port"),
        ("worker_concurrency", "concurrency"),
    ):
        value = getattr(args, attr, None)
        if value is not None:
            overrides[field] = value
    if getattr(args, "no_migrate", False):
        overrides["migrate_on_start"] = False
    settings = read.model_copy(update=overrides)
    try:
        if args.command == "check":
            return _check(settings)
        if args.command == "health":
            return _health(settings, args)
        if args.command in ("serve", "api", "worker"):
            crypto.server_key(settings)  # before anything starts: a missing key off loopback refuses start-up
        if args.command in ("serve", "api"):
            _serve(settings, with_worker=args.command == "serve", migrate=args.command == "serve")
            return 0
        with database(settings) as settings:
            if args.command == "migrate":
                asyncio.run(_check_session(settings))
                found, said = asyncio.run(_migrate_and_bootstrap(settings))
                if found.fit is migrations.Fit.NEWER:
                    print(
                        f"database is at migration {found.at}, newer than this release's {found.head}, which runs on it"
                    )
                else:
                    print("database is at the latest migration")
                if said:
                    print(said)
            elif args.command == "worker":
                asyncio.run(_worker(settings))
            elif args.command == "keys":
                asyncio.run(admin.keys_command(settings, args))
            elif args.command == "env":
                asyncio.run(admin.env_command(settings, args))
    except errors.AgentsError as exc:
        raise SystemExit(f"error: {exc.message}") from exc
    except NoSession as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(UNUSABLE_DATABASE) from None
    except db.Unreachable as exc:
        where = f"DATABASE_URL ({dsn.redacted(read.database_url)})" if read.database_url else "the embedded Postgres"
        direct = read.database_direct_url
        if direct and read.database_url and exc.dsn not in ("", dsn.target(read.database_url).dsn):
            where = f"DATABASE_DIRECT_URL ({dsn.redacted(direct)})"  # the only other URL a command connects to
        print(f"error: cannot connect to {where}: {exc}", file=sys.stderr)
        raise SystemExit(UNUSABLE_DATABASE) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
