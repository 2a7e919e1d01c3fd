"""`DATABASE_URL` as managed Postgres providers hand it out: checked when settings are read, and translated into
what asyncpg connects with (SQLAlchemy's asyncpg dialect would pass the query's parameters to `asyncpg.connect` as
keyword arguments, which it refuses)."""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass

# Every spelling a provider or a SQLAlchemy user writes; each means the same server, reached through asyncpg.
SCHEMES = ("postgres", "postgresql", "postgresql+asyncpg", "postgresql+psycopg", "postgresql+psycopg2")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")  # libpq's, with its meanings
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
FILES = ("sslrootcert", "sslcert", "sslkey")
# libpq's connection parameters the runtime takes from the query. asyncpg reads `ssl*`, `target_session_attrs`,
# `host` and `port` itself and sends `application_name` and `options` in the start-up packet, as libpq does;
# `connect_timeout` becomes asyncpg's `timeout`.
PARAMETERS = (
    "sslmode",
    *FILES,
    "application_name",
    "options",
    "target_session_attrs",
    "connect_timeout",
    "host",
    "port",
)


@dataclass(frozen=True)
class Target:
    """What asyncpg is given for a URL: a libpq DSN, `connect_timeout` in seconds (None: not set), and the files its
    `sslrootcert`, `sslcert` and `sslkey` name (to say which one cannot be read: the ssl module does not)."""

    dsn: str
    timeout: float | None
    files: tuple[tuple[str, str], ...] = ()


def normalise(url: str) -> str:
    """The URL spelled `postgresql+asyncpg://`, once its scheme and query are checked; a `ValueError` says what is
    wrong in one line and never repeats the URL (it may hold a password)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("is not a URL: expected postgresql://user:password@host:port/database")
    if scheme.lower() not in SCHEMES:
        raise ValueError(
            f"the scheme {scheme}:// is not Postgres: use postgresql:// (postgres:// and postgresql+asyncpg:// "
            "are accepted too)"
        )
    _check(_query(url))
    return "postgresql+asyncpg://" + rest


def target(url: str) -> Target:
    """How asyncpg connects to a `DATABASE_URL` (any accepted spelling): the one translation every connection, pool
    and migration goes through."""
    rest = normalise(url).partition("://")[2]
    query = _query(url)
    timeout = next((float(v) for k, v in reversed(query) if k == "connect_timeout"), None)
    kept = urllib.parse.urlencode([(k, v) for k, v in query if k != "connect_timeout"], quote_via=urllib.parse.quote)
    base = rest.partition("?")[0]
    files = tuple((k, v) for k, v in query if k in FILES)
    return Target(f"postgresql://{base}{'?' + kept if kept else ''}", timeout or None, files)  # libpq: 0 waits for ever


def redacted(url: str) -> str:
    """The URL to show in a message: user, hosts, ports and database; no password, no query."""
    rest = url.partition("://")[2].partition("?")[0]
    netloc, _, database = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    user = urllib.parse.unquote(userinfo.partition(":")[0]) + at
    socket = "" if hosts else next((f"?host={v}" for k, v in _query(url) if k == "host"), "")  # a Unix socket
    return f"postgresql://{user}{hosts}/{database}{socket}"


def _query(url: str) -> list[tuple[str, str]]:
    return urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True)


def _check(query: list[tuple[str, str]]) -> None:
    unknown = sorted({k for k, _ in query} - set(PARAMETERS))
    if unknown:
        raise ValueError(
            f"unknown query parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"(accepted: {', '.join(PARAMETERS)})"
        )
    for name, value in query:
        if name == "sslmode" and value not in SSLMODES:
            raise ValueError(f"sslmode={value} is not one of {', '.join(SSLMODES)}")
        if name == "target_session_attrs" and value not in SESSION_ATTRS:
            raise ValueError(f"target_session_attrs={value} is not one of {', '.join(SESSION_ATTRS)}")
        if name == "connect_timeout" and not _seconds(value):
            raise ValueError(f"connect_timeout={value} is not a number of seconds")
        if name == "port" and not all(p.isdigit() for p in value.split(",")):
            raise ValueError(f"port={value} is not a port number")


def _seconds(value: str) -> bool:
    try:
        return math.isfinite(float(value)) and float(value) >= 0
    except ValueError:
        return False
