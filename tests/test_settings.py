from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app import errors
from app.settings import Settings, is_loopback


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://u:p@h:5432/d", "postgresql+asyncpg://u:p@h:5432/d"),
        ("postgresql://u@h/d?sslmode=require", "postgresql+asyncpg://u@h/d?sslmode=require"),
        ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg://u@h/d"),
    ],
)
def test_database_url_is_read_in_the_asyncpg_spelling(url: str, expected: str) -> None:
    assert Settings(database_url=url).database_url == expected


def test_a_database_url_that_is_not_postgres_is_refused_when_settings_are_read() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(database_url="mysql://u:hunter2@h/d")
    assert "mysql://" in str(refused.value) and "is not Postgres" in str(refused.value)
    assert "hunter2" not in errors.problems(refused.value.errors())


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


@pytest.mark.parametrize(
    ("host", "value", "enabled"),
    [
        ("127.0.0.1", None, True),
        ("::1", None, True),
        ("0.0.0.0", None, False),
        ("0.0.0.0", "true", True),
        ("127.0.0.1", "false", False),
    ],
)
def test_the_playground_is_on_by_default_on_loopback_only(
    monkeypatch: pytest.MonkeyPatch, host: str, value: str | None, enabled: bool
) -> None:
    monkeypatch.setenv("HOST", host)
    if value is not None:
        monkeypatch.setenv("PLAYGROUND", value)
    assert Settings().playground_enabled is enabled


@pytest.mark.parametrize(
    ("env", "with_worker", "kept"),
    [
        ({}, True, "full"),  # `agents serve` on loopback: the playground's developer
        ({}, False, "brief"),  # `agents api`: its workers run elsewhere
        ({"HOST": "0.0.0.0"}, True, "brief"),  # served to a network: production
        ({"PLAYGROUND": "false"}, True, "brief"),
        ({"LOG_REQUESTS": "brief"}, True, "brief"),
        ({"LOG_REQUESTS": "full", "HOST": "0.0.0.0"}, False, "full"),
    ],
)
def test_log_requests_is_full_by_default_only_where_agents_serve_serves_the_playground(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], with_worker: bool, kept: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings().serving(with_worker).log_requests == kept


def test_public_url_is_an_http_base_without_a_trailing_slash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBLIC_URL", "https://agents.example.com/api/")
    assert Settings().public_url == "https://agents.example.com/api"
    monkeypatch.setenv("PUBLIC_URL", "")
    assert Settings().public_url is None  # compose passes an unset variable as ""
    for bad in ("agents.example.com", "ftp://agents.example.com", "https://agents.example.com/?x=1", "https://"):
        monkeypatch.setenv("PUBLIC_URL", bad)
        with pytest.raises(ValidationError, match="http\\(s\\) URL"):
            Settings()


def test_origin_says_whether_a_value_came_from_the_environment_or_the_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sa_" + "f" * 40
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ADMIN_API_KEY", raising=False)
    (tmp_path / ".env").write_text(f"ADMIN_API_KEY={key}\n")
    from_file = Settings()
    assert from_file.admin_api_key is not None and from_file.admin_api_key.get_secret_value() == key
    assert from_file.origin("admin_api_key") == str(tmp_path / ".env")
    monkeypatch.setenv("ADMIN_API_KEY", key)
    assert Settings().origin("admin_api_key") == "the environment"  # the environment wins over the file
