"""The command line: check, keys, migrate, and refusing an unsafe start."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests import processes
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "catalog"


def agents(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY", "AGENTS_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_accepts_the_example_agents() -> None:
    result = agents("check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok" in result.stdout


def test_check_explains_a_broken_folder() -> None:
    result = agents("--agents-dir", str(FIXTURES / "bad_missing_model_ref"), "check")
    assert result.returncode == 1
    assert "prompts/" in result.stdout and "model" in result.stdout and "fix:" in result.stdout


def test_serve_refuses_a_broken_folder(tmp_path: Path) -> None:
    result = agents("--agents-dir", str(FIXTURES / "bad_unknown_field"), "serve", env={"DATA_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "refusing to start" in result.stderr and "fix:" in result.stderr


def test_migrate_and_keys(database_url: str) -> None:
    env = {"DATABASE_URL": database_url}
    assert agents("migrate", env=env).returncode == 0
    created = agents("keys", "create", "--user", "alice", "--admin", env=env)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("sa_")
    listed = agents("keys", "list", env=env)
    assert "user=alice" in listed.stdout and "admin=True" in listed.stdout and key not in listed.stdout
    revoked = agents("keys", "revoke", key[:10], env=env)
    assert revoked.returncode == 0 and "revoked 1" in revoked.stdout
    assert agents("keys", "revoke", "nope", env=env).returncode != 0


def test_serve_refuses_a_public_bind_without_keys(database_url: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": database_url, "SECRET_KEY": "x" * 48, "DATA_DIR": str(tmp_path)}
    result = agents("serve", "--host", "0.0.0.0", "--port", "1", env=env)
    assert result.returncode != 0 and "without an API key" in result.stderr


def test_serve_refuses_a_public_bind_without_a_secret_key(database_url: str, tmp_path: Path) -> None:
    result = agents("serve", "--host", "0.0.0.0", env={"DATABASE_URL": database_url, "DATA_DIR": str(tmp_path)})
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr


def test_env_set_list_delete(database_url: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": database_url, "DATA_DIR": str(tmp_path)}
    assert agents("env", "set", "REGION", "eu", env=env).returncode == 0
    secret = agents("env", "set", "--instance", "TOKEN", "cli-s3cret", "--secret", env=env)
    assert secret.returncode == 0 and "cli-s3cret" not in secret.stdout
    assert agents("env", "set", "--user", "alice", "REGION", "us", env=env).returncode == 0
    listed = agents("env", "list", env=env)
    assert listed.returncode == 0 and listed.stdout.splitlines() == ["REGION=eu  (text)", "TOKEN=***  (secret)"]
    assert agents("env", "list", "--user", "alice", env=env).stdout.splitlines() == ["REGION=us  (text)"]
    assert agents("env", "list", "--user", "bob", env=env).stdout == ""
    assert agents("env", "delete", "--user", "alice", "REGION", env=env).returncode == 0
    gone = agents("env", "delete", "--user", "alice", "REGION", env=env)
    assert gone.returncode != 0 and "no variable REGION" in gone.stderr
    bad = agents("env", "set", "1BAD", "x", env=env)
    assert bad.returncode != 0 and "not a variable name" in bad.stderr and "Traceback" not in bad.stderr
    assert agents("env", "set", "--user", "u", "--instance", "X", "y", env=env).returncode != 0


def test_worker_and_api_refuse_to_start_without_a_secret_key_off_loopback(database_url: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": database_url, "DATA_DIR": str(tmp_path), "HOST": "0.0.0.0"}
    for command in ("worker", "api"):
        result = agents(command, env=env)
        assert result.returncode == 1, result.stderr
        assert "SECRET_KEY is missing" in result.stderr and "Traceback" not in result.stderr
    weak = agents("serve", "--host", "0.0.0.0", env={**env, "SECRET_KEY": "changeme"})
    assert weak.returncode == 1 and "SECRET_KEY" in weak.stderr and "Traceback" not in weak.stderr


def test_a_bad_setting_is_named_not_traced() -> None:
    result = agents("check", env={"LOG_LEVEL": "loud", "PORT": "eighty"})
    assert result.returncode == 1
    assert "error: invalid setting:" in result.stderr and "LOG_LEVEL" in result.stderr and "PORT" in result.stderr
    assert "Traceback" not in result.stderr


async def test_the_access_log_and_the_log_level_are_settings(database_url: str, tmp_path: Path) -> None:
    """One line per request by default; `ACCESS_LOG=false` drops them, `LOG_LEVEL=warning` the start-up lines."""
    base_env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR")}
    logs = {}
    for name, extra in (
        ("default", {}),
        ("quiet", {"ACCESS_LOG": "false", "LOG_LEVEL": "warning"}),
        ("json", {"LOG_FORMAT": "json"}),
    ):
        port = processes.free_port()
        log = tmp_path / f"{name}.log"
        env = {**base_env, "DATABASE_URL": database_url, "PORT": str(port), "DATA_DIR": str(tmp_path), **extra}
        proc = processes.start(["api"], env, log)
        try:
            await processes.until_ready(f"http://127.0.0.1:{port}", proc, log)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                assert (await client.get("/agents")).status_code == 200
        finally:
            assert processes.stop(proc) == 0
        logs[name] = log.read_text()
    assert '"GET /agents HTTP/1.1" 200' in logs["default"] and "Application startup complete" in logs["default"]
    assert '"GET /agents' not in logs["quiet"] and "Application startup complete" not in logs["quiet"]
    lines = [json.loads(line) for line in logs["json"].splitlines() if line.strip()]  # every line, uvicorn's too
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert any(line["logger"] == "uvicorn.access" and "GET /agents" in line["message"] for line in lines)
    assert any(line["message"] == "Application startup complete." for line in lines)


async def test_models_whose_key_is_set_nowhere_are_named_at_start(database_url: str, tmp_path: Path) -> None:
    """With `AGENTS_PROVIDER=openai` and no `OPENAI_API_KEY`, the three example models that switch to OpenAI are
    named once at start (by `check`, `api` and `worker`), each with the variable; an instance variable silences it."""
    unset = ("SECRET_KEY", "AGENTS_DIR", "AGENTS_MODEL", "AGENTS_BASE_URL", "OPENAI_API_KEY")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    env = {**base, "DATABASE_URL": database_url, "DATA_DIR": str(tmp_path), "AGENTS_PROVIDER": "openai"}
    expected = "model `{}` (openai) needs an API key in `OPENAI_API_KEY`, which is not set"
    models = ("demo", "haiku_reviewer", "haiku_writer")

    checked = agents("check", env={"AGENTS_PROVIDER": "openai", "OPENAI_API_KEY": " "})  # blank is unset
    assert checked.returncode == 0 and checked.stdout.endswith("ok (3 warning(s))\n"), checked.stdout
    assert all(f"warning: {expected.format(m)}" in checked.stdout for m in models)

    async def started(command: str, name: str) -> str:
        port = processes.free_port()
        log = tmp_path / f"{name}.log"
        proc = processes.start([command], {**env, "PORT": str(port)}, log)
        try:
            if command == "api":
                await processes.until_ready(f"http://127.0.0.1:{port}", proc, log)
            else:
                for _ in range(600):  # 60 s
                    if "started with" in log.read_text():
                        break
                    assert proc.poll() is None, log.read_text()
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError(f"the worker did not start:\n{log.read_text()}")
        finally:
            assert processes.stop(proc) == 0
        return log.read_text()

    for command in ("api", "worker"):
        lines = [line for line in (await started(command, command)).splitlines() if "needs an API key" in line]
        assert len(lines) == 3, lines
        assert all(f"WARNING app: {expected.format(m)}" in line for m, line in zip(models, lines, strict=True))

    assert agents("env", "set", "OPENAI_API_KEY", "sk-instance", "--secret", env=env).returncode == 0
    assert "needs an API key" not in await started("api", "keyed")
