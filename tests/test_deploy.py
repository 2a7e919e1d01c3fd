"""The deployment files and the README's promises stay true."""

from __future__ import annotations

import re

import yaml

from tests.conftest import ROOT


def _readme_commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_starts_with_exactly_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_two = _readme_commands()[:2]
    assert len(first_two) == 2 and all("\n" not in c for c in first_two)
    serve, test = first_two
    assert serve.endswith("agents serve") and "pip install -e ." in serve
    assert test.endswith("pytest") and '".[dev]"' in test
    assert text.index(serve) < text.index("## ")  # both come before any section


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci


def test_compose_file_has_the_production_shape() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["command"] == ["agents", "migrate"]
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgresql://")


def test_dockerfile_runs_as_a_non_root_user() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
