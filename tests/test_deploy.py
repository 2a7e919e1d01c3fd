"""The deployment files and the README's promises stay true."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from dotenv import dotenv_values

from app import __main__
from tests import processes
from tests.conftest import ROOT, wait_for


def _readme_commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_starts_with_exactly_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_two = _readme_commands()[:2]
    assert len(first_two) == 2 and all("\n" not in c for c in first_two)
    serve, test = first_two
    assert serve.endswith("agents serve") and "pip install -e ." in serve
    assert test.endswith("pytest && .venv/bin/pytest -m slow") and '".[dev]"' in test  # the fast set, then the slow
    assert text.index(serve) < text.index("## ")  # both come before any section


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci
    assert 'PYTEST_ADDOPTS="--durations=15"' in ci  # each step names its slowest tests


def test_a_plain_pytest_leaves_the_slow_set_out_and_the_marker_is_declared() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    addopts = options["addopts"]
    assert addopts[addopts.index("-m") + 1] == "not slow" and "--strict-markers" in addopts
    assert [m for m in options["markers"] if m.startswith("slow:")]


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def _start_order(services: dict[str, Any]) -> list[str]:
    """The services in the order compose starts them (each after everything it depends on)."""
    order: list[str] = []
    while len(order) < len(services):
        ready = [n for n, s in services.items() if n not in order and set(s.get("depends_on", {})) <= set(order)]
        assert ready, f"a depends_on cycle among {set(services) - set(order)}"
        order.append(sorted(ready)[0])
    return order


SECRETS = "deploy.env"  # the compose services' `env_file`: kept apart from the `.env` that `agents serve` reads
IMAGE = "standard-agents:local"  # the one image of `migrate`, `api` and `worker`


def _deploy_blocks() -> list[str]:
    """The `sh` blocks of the README's Deploying section and of docs/deployment.md's docker compose section."""
    readme = (ROOT / "README.md").read_text().split("\n## Deploying\n", 1)[1].split("\n## ", 1)[0]
    guide = (ROOT / "docs" / "deployment.md").read_text().split("\n## docker compose\n", 1)[1].split("\n## ", 1)[0]
    return [block for text in (readme, guide) for block in re.findall(r"```sh\n(.+?)\n```", text, re.S)]


def _write_secrets(folder: Path) -> dict[str, str]:
    """Run the README's deploy commands that write files (not `docker` or `curl`) in `folder`, as pasted; what the
    compose services then read from `deploy.env`."""
    [block] = _deploy_blocks()[:1]
    script = "\n".join(line for line in block.splitlines() if not line.startswith(("docker ", "curl ")))
    subprocess.run(["bash", "-euc", script], cwd=folder, check=True, timeout=60)
    return {k: v for k, v in dotenv_values(folder / SECRETS).items() if v is not None}


def test_the_deploy_commands_keep_their_secrets_out_of_dotenv() -> None:
    """`agents serve` reads `.env` in its folder: a deploy step that wrote `ADMIN_API_KEY` there made every request of
    the development server a 401. The documented commands write `deploy.env`, which only compose reads, which git and
    the image's build context leave out."""
    blocks = _deploy_blocks()
    assert len(blocks) == 2
    for block in blocks:
        assert not re.search(r"(?<![\w.-])\.env\b", block), block  # never `.env` (`deploy.env` is another file)
        assert f">> {SECRETS}" in block and f"chmod 600 {SECRETS}" in block
        assert "export " not in block  # nor the shell: the next terminal would not have them
    assert SECRETS in (ROOT / ".gitignore").read_text().splitlines()
    assert {".env", SECRETS} <= set((ROOT / ".dockerignore").read_text().splitlines())


def test_compose_file_has_the_production_shape() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert _start_order(services) == ["postgres", "migrate", "api", "worker"]
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["command"] == ["agents", "migrate"] and services["migrate"]["restart"] == "no"
    for name in ("postgres", "api", "worker"):
        assert services[name]["restart"] == "unless-stopped"
    for name in ("api", "worker"):
        service = services[name]
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["environment"]["DATABASE_URL"].startswith("postgresql://")
        assert service["healthcheck"]["test"] == ["CMD", "agents", "health", name]
        assert "./agents:/srv/agents:ro" in service["volumes"]  # own agents without a rebuild
        assert service["environment"]["AGENTS_DIR"] == "/srv/agents"
    assert services["api"]["ports"] == ["127.0.0.1:8000:8000"]  # this machine only, unless the operator says so
    assert services["api"]["environment"]["PORT"] == "8000" and services["api"]["command"] == ["agents", "api"]
    assert "ports" not in services["worker"]
    assert services["worker"]["depends_on"]["api"]["condition"] == "service_started"
    for name in ("migrate", "api", "worker"):  # secrets from deploy.env only, never in the file itself
        assert services[name]["env_file"] == SECRETS
        assert "SECRET_KEY" not in services[name]["environment"]
    for name in ("migrate", "api"):  # they store the operator's key (from deploy.env); the worker never holds it
        assert "ADMIN_API_KEY" not in services[name]["environment"]
    assert services["worker"]["environment"]["ADMIN_API_KEY"] == ""  # `environment` wins over `env_file`
    assert "$" not in json.dumps(compose)  # nothing interpolated: `.env` reaches no container
    ours = {name: services[name] for name in ("migrate", "api", "worker")}
    assert {s["image"] for s in ours.values()} == {IMAGE}  # one image, built once: by `migrate` alone
    assert [name for name, s in ours.items() if "build" in s] == ["migrate"] and ours["migrate"]["build"] == "."
    assert ours["api"]["pull_policy"] == ours["worker"]["pull_policy"] == "never"  # never looked for in a registry
    for service in ours.values():  # a model server on the host is `host.docker.internal`, on Linux too
        assert service["extra_hosts"] == ["host.docker.internal:host-gateway"]


def test_the_health_checks_name_commands_the_image_has() -> None:
    """The compose and Dockerfile checks run `agents health …`, which this CLI parses (the image installs it)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    ours = [s for s in _compose()["services"].values() if s.get("image") == IMAGE]
    checks = [s["healthcheck"]["test"][1:] for s in ours if "healthcheck" in s]
    assert len(checks) == 2
    (docker_check,) = re.findall(r"^HEALTHCHECK .*CMD (\[.*\])$", dockerfile, re.MULTILINE)
    checks.append(json.loads(docker_check))
    for check in checks:
        assert check[0] == "agents"
        args = __main__.parser().parse_args(check[1:])
        assert args.command == "health" and args.health_command in ("api", "worker")
    assert "WORKER_HEARTBEAT_FILE=" in dockerfile and "pip install -e ." in dockerfile


@pytest.mark.slow  # the compose file's services as real processes
async def test_the_compose_file_runs(database_url: str, tmp_path: Path) -> None:
    """No Docker here: run each service's command as a process, in compose's order, with the environment the compose
    file gives it (its container paths mapped through its volumes, DATABASE_URL at the test database, its port free);
    wait on each dependency's condition, run the health checks, and use the API with the operator's key."""
    project = tmp_path / "project"
    project.mkdir()
    given_secrets = _write_secrets(project)  # deploy.env, as the README's commands write it
    assert set(given_secrets) == {"SECRET_KEY", "ADMIN_API_KEY"} and not (project / ".env").exists()
    assert (project / SECRETS).stat().st_mode & 0o777 == 0o600
    admin_key = given_secrets["ADMIN_API_KEY"]
    stack = contextlib.ExitStack()
    model = stack.enter_context(_model_server())
    with (project / SECRETS).open("a") as secrets:  # the README's lines for Ollama on the host, where ours listens
        host = f"127.0.0.1:{model.port}"  # what `extra_hosts` makes `host.docker.internal:11434` here
        secrets.write(_model_lines().replace("host.docker.internal:11434", host) + "\n")
    given_secrets = {k: v for k, v in dotenv_values(project / SECRETS).items() if v is not None}
    assert given_secrets["AGENTS_BASE_URL"] == f"http://{host}/v1"
    services = _compose()["services"]
    port = processes.free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR", "HOST", "PORT")}

    def environment(name: str) -> dict[str, str]:
        service = services[name]
        assert service["env_file"] == SECRETS
        given = {**given_secrets, **{k: str(v) for k, v in service["environment"].items()}}  # `environment` wins
        for volume in service.get("volumes", []):
            outside, inside = volume.split(":")[:2]
            given = {k: str(ROOT / outside) if v == inside else v for k, v in given.items()}
        assert given["PORT"] == services["api"]["ports"][0].rsplit(":", 1)[1]  # the published container port
        heartbeat = tmp_path / Path(given["WORKER_HEARTBEAT_FILE"]).name
        return {
            **base,
            **given,
            "DATABASE_URL": database_url,
            "PORT": str(port),
            "WORKER_HEARTBEAT_FILE": str(heartbeat),
        }

    def command(argv: list[str]) -> list[str]:
        assert argv[0] == "agents"
        return argv[1:]

    def agents(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        run = [sys.executable, "-m", "app", *argv]
        return subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)

    def check(name: str) -> subprocess.CompletedProcess[str]:
        return agents(command(services[name]["healthcheck"]["test"][1:]), environment(name))

    async def healthy(name: str) -> None:
        for _ in range(60):
            if check(name).returncode == 0:
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"{name} never healthy: {check(name).stderr}\n{logs[name].read_text()}")

    running: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in services}
    try:
        for name in _start_order(services):
            if name == "postgres":
                continue  # the test database stands in for it
            for needed, condition in services[name]["depends_on"].items():
                if needed == "postgres":
                    continue
                if condition["condition"] == "service_completed_successfully":
                    assert running[needed].wait(60) == 0, logs[needed].read_text()
                elif condition["condition"] == "service_healthy":
                    await healthy(needed)
            running[name] = processes.start(command(services[name]["command"]), environment(name), logs[name])
        assert running["migrate"].wait(60) == 0, logs["migrate"].read_text()
        assert "admin key sa_" in logs["migrate"].read_text() and admin_key not in logs["migrate"].read_text()
        await healthy("api")
        await healthy("worker")

        headers = {"Authorization": f"Bearer {admin_key}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as client:
            assert (await client.get("/threads", headers={"Authorization": ""})).status_code == 401
            thread = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
            posted = await client.post(f"/threads/{thread}/messages", json={"content": "What is 12 * (3 + 4)?"})
            assert posted.status_code == 202, posted.text

            async def answered() -> bool:
                messages = (await client.get(f"/threads/{thread}/messages")).json()["messages"]
                return any(m["role"] == "assistant" and "84" in (m["content"] or "") for m in messages)

            await wait_for(answered, timeout=30)
            asked = [(a["path"], a["body"]["model"]) for a in model.asked]
            assert asked == [("/v1/chat/completions", "qwen2.5:14b")]  # the worker reached the model on the "host"

        again = processes.start(command(services["migrate"]["command"]), environment("migrate"), tmp_path / "m2.log")
        assert again.wait(60) == 0, (tmp_path / "m2.log").read_text()
        assert "admin key sa_" in (tmp_path / "m2.log").read_text()  # a restart: no second key
        listed = agents(["keys", "list"], environment("api"))
        assert listed.stdout.count("active") == 1 and admin_key[:10] in listed.stdout

        worker = running["worker"]
        worker.send_signal(signal.SIGSTOP)  # a stuck worker: alive, but its loop does not go round
        try:
            await asyncio.sleep(3.5)
            stuck = check("worker")
            late = agents(["health", "worker", "--max-age", "3"], environment("worker"))
        finally:
            worker.send_signal(signal.SIGCONT)
        assert stuck.returncode == 0  # within the worker's own limit (30 s) it is not stuck yet
        assert late.returncode == 1 and "is stuck: no beat for" in late.stderr and "Traceback" not in late.stderr
        await healthy("worker")  # going round again
        worker.kill()
        worker.wait(10)
        dead = check("worker")
        assert dead.returncode == 1 and f"worker process {worker.pid} is gone" in dead.stderr
    finally:
        for proc in running.values():
            if proc.poll() is None:
                processes.stop(proc)
        stack.close()


def test_dockerfile_runs_as_a_non_root_user() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")


def _model_lines() -> str:
    """The README's `deploy.env` lines for a model server on the host (its one `ini` block under Deploying)."""
    readme = (ROOT / "README.md").read_text().split("\n## Deploying\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```ini\n(.+?)\n```", readme, re.S)
    assert "host.docker.internal:11434" in block
    return str(block)


@dataclass
class _Model:
    """An OpenAI-compatible Chat Completions server: every answer is "The answer is 84.", streamed; what it was asked
    is kept."""

    port: int = 0
    asked: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def _model_server() -> Iterator[_Model]:
    model = _Model()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model.asked.append({"path": self.path, "body": body})
            chunks: list[dict[str, Any]] = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "The answer is 84."}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5}},
            ]
            stream = "".join(f"data: {json.dumps({'id': 'c1', 'model': body['model'], **c})}\n\n" for c in chunks)
            data = (stream + "data: [DONE]\n\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    model.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield model
    finally:
        server.shutdown()
        server.server_close()
