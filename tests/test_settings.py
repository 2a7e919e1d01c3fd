from __future__ import annotations

import pytest

from app.settings import Settings, is_loopback, normalise_url, plain_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://u:p@h:5432/d", "postgresql+asyncpg://u:p@h:5432/d"),
        ("postgresql://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg://u@h/d"),
    ],
)
def test_urls_are_normalised_to_asyncpg(url: str, expected: str) -> None:
    assert normalise_url(url) == expected
    assert Settings(database_url=url).database_url == expected


def test_plain_url_is_libpq_spelling() -> None:
    assert plain_url("postgresql+asyncpg://u@h/d") == "postgresql://u@h/d"


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("example.org", False),
    ],
)
def test_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_allowed_hosts_read_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOWED_HOSTS", " agents.internal, Box.Lan ,,")
    assert Settings().allowed_hosts == ["agents.internal", "box.lan"]
    monkeypatch.delenv("ALLOWED_HOSTS")
    assert Settings().allowed_hosts == []


def test_cors_origins_read_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORS_ORIGINS", "https://App.example.com/, http://127.0.0.1:5173")
    assert Settings().cors_origins == ["https://app.example.com", "http://127.0.0.1:5173"]
