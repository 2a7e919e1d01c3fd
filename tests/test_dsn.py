"""`app/dsn.py`: `DATABASE_URL` as providers hand it out, checked and translated for asyncpg (the TLS behaviour on a
server that speaks it is `tests/test_tls.py`)."""

from __future__ import annotations

import pytest

from app import dsn

PROVIDED = "postgres://u:hunter2@db.example.com:6543/app?sslmode=require&application_name=my%20app"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://u:p@h:5432/d", "postgresql+asyncpg://u:p@h:5432/d"),  # Heroku's scheme
        ("postgresql://u@h/d?sslmode=verify-full", "postgresql+asyncpg://u@h/d?sslmode=verify-full"),
        ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("POSTGRESQL://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("postgresql+psycopg2://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("postgresql://postgres@/postgres?host=/tmp/pg", "postgresql+asyncpg://postgres@/postgres?host=/tmp/pg"),
    ],
)
def test_postgres_urls_are_spelled_for_asyncpg(url: str, expected: str) -> None:
    assert dsn.normalise(url) == expected


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mysql://u:hunter2@h/d", "the scheme mysql:// is not Postgres"),
        ("sqlite:///tmp/hunter2.db", "the scheme sqlite:// is not Postgres"),
        ("hunter2", "is not a URL"),
        ("postgresql://u:hunter2@h/d?sslmod=require&pool=5", "unknown query parameters pool, sslmod (accepted: "),
        ("postgresql://u:hunter2@h/d?ssl=true", "unknown query parameter ssl (accepted: sslmode,"),
        ("postgresql://u:hunter2@h/d?sslmode=on", "sslmode=on is not one of disable, allow, prefer, require,"),
        ("postgresql://u:hunter2@h/d?target_session_attrs=master", "target_session_attrs=master is not one of"),
        ("postgresql://u:hunter2@h/d?connect_timeout=soon", "connect_timeout=soon is not a number of seconds"),
        ("postgresql://u:hunter2@h/d?connect_timeout=-1", "connect_timeout=-1 is not a number of seconds"),
        ("postgresql://u:hunter2@h/d?port=x", "port=x is not a port number"),
    ],
)
def test_what_cannot_be_used_is_said_in_one_line_without_the_password(url: str, said: str) -> None:
    with pytest.raises(ValueError, match=r".") as refused:
        dsn.normalise(url)
    assert said in str(refused.value) and "hunter2" not in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("mode", dsn.SSLMODES)
def test_every_libpq_sslmode_is_accepted(mode: str) -> None:
    assert dsn.target(f"postgresql://h/d?sslmode={mode}").dsn == f"postgresql://h/d?sslmode={mode}"


def test_the_query_goes_to_asyncpg_in_its_dsn_and_connect_timeout_becomes_its_timeout() -> None:
    url = (
        "postgres://u:p%40ss@h1:5432,h2:5433/db?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslcert=/c&sslkey=/k"
        "&options=-c%20search_path%3Dapp&application_name=my+app&target_session_attrs=read-write&connect_timeout=7"
    )
    target = dsn.target(url)
    assert target.timeout == 7.0
    assert target.dsn == (
        "postgresql://u:p%40ss@h1:5432,h2:5433/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&sslcert=%2Fc"
        "&sslkey=%2Fk&options=-c%20search_path%3Dapp&application_name=my%20app&target_session_attrs=read-write"
    )
    assert dsn.target(dsn.normalise(url)) == target  # the settings' spelling translates alike


def test_no_query_no_timeout_and_a_zero_timeout_waits_as_libpq_does() -> None:
    assert dsn.target("postgresql+asyncpg://u@h/d") == dsn.Target("postgresql://u@h/d", None)
    assert dsn.target("postgresql://u@h/d?connect_timeout=0") == dsn.Target("postgresql://u@h/d", None)


def test_a_provider_url_is_shown_without_its_password_or_query() -> None:
    assert dsn.redacted(PROVIDED) == "postgresql://u@db.example.com:6543/app"
    assert dsn.redacted("postgresql+asyncpg://postgres@/postgres?host=/tmp/pg") == (
        "postgresql://postgres@/postgres?host=/tmp/pg"
    )
    assert dsn.redacted("postgresql://h/d") == "postgresql://h/d"
