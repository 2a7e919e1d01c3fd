"""The README's shell snippets work when pasted: those of the sections below run verbatim with bash (only the port
changes) against a real `agents serve` on a fresh database, with the example agents on the offline `test` models."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import signal
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from tests import processes
from tests.conftest import ROOT

SECTIONS = [  # in README order: later snippets use the `$THREAD` of earlier ones
    "A first thread with `curl`",
    "Files and attachments",
    "Custom thread endpoints",
    "Effects",
    "Two AI sides: the `haiku_review` example",
    "Subagents: the `launch` example",
    "Stop, continue, terminate",
    "Variables and secrets",
]
FENCE = re.compile(r"^( *)```(\w*)$")


def snippets(readme: str) -> dict[str, list[str]]:
    """Each section's `sh` blocks (indented ones too, dedented), by its `## ` heading."""
    found: dict[str, list[str]] = {}
    section, indent = "", ""
    block: list[str] | None = None  # the lines of the `sh` block being read
    for line in readme.splitlines():
        fence = FENCE.match(line)
        if block is None:
            if line.startswith("## "):
                section = line[3:].strip()
            elif fence and fence[2] == "sh":
                block, indent = [], fence[1]
        elif fence and fence[1] == indent and not fence[2]:
            found.setdefault(section, []).append(textwrap.dedent("\n".join(block)))
            block = None
        else:
            block.append(line)
    return found


def test_the_first_commands_stay_as_they_are() -> None:
    first = snippets((ROOT / "README.md").read_text())[""]  # before the first section
    assert first[:2] == [
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/agents serve",
        'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/pytest && .venv/bin/pytest -m slow',
    ]


def test_the_readme_links_nowhere_outside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "../" not in readme and "shared/" not in readme


def _files(folder: Path) -> None:
    """What the files snippets upload from the current folder."""
    (folder / "todo.md").write_text("# Today\n\n- TODO water the plants\n- buy bread\n")
    picture = io.BytesIO()
    Image.new("RGB", (640, 480), (200, 120, 40)).save(picture, "PNG")
    (folder / "cat.png").write_bytes(picture.getvalue())


async def _bash(script: str, cwd: Path) -> tuple[int, str]:
    """Run `script`, then end whatever it left in the background (a stream it did not stop)."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    reading = asyncio.ensure_future(process.stdout.read())
    try:
        code = await asyncio.wait_for(process.wait(), 240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return code, (await reading).decode()


@pytest.mark.slow  # a real server, and the snippets run by bash
@pytest.mark.skipif(shutil.which("curl") is None, reason="the snippets need curl")
async def test_the_walkthroughs_run_as_written(database_url: str, tmp_path: Path) -> None:
    blocks = snippets((ROOT / "README.md").read_text())
    port = processes.free_port()
    parts = []
    for section in SECTIONS:
        for i, block in enumerate(blocks[section]):
            if ".venv/bin/agents" in block:  # the command line's own snippets (placeholders, the database directly)
                continue
            parts.append(
                f"printf '\\n@@ %s %d\\n' '{section}' {i}\n{block.replace('localhost:8000', f'localhost:{port}')}"
            )
    _files(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR", "AGENTS_PROVIDER")}
    env |= {"DATABASE_URL": database_url, "PORT": str(port), "DATA_DIR": str(tmp_path / "data")}
    log = tmp_path / "serve.log"
    server = processes.start(["serve"], env, log)
    try:
        await processes.until_ready(f"http://127.0.0.1:{port}", server, log)
        code, output = await _bash("\n".join(parts), tmp_path)
    finally:
        assert processes.stop(server) == 0, log.read_text()[-4000:]
    assert code == 0, output
    out = dict(re.findall(r"@@ (.+? \d+)\n(.*?)(?=\n@@ |\Z)", output, re.S))

    first = out["A first thread with `curl` 0"]
    assert '"name":"assistant"' in first
    assert first.count("The answer is 84.") >= 2  # waited, then listed
    assert '"done":true,"status":"idle","outcome":"completed","error":null' in first

    files = out["Files and attachments 0"]
    assert '"text":"- TODO water the plants"' in files and '"path":"/notes/todo.md"' in files
    assert (tmp_path / "thumb.jpg").read_bytes()[:2] == b"\xff\xd8"
    assert files.count('"status":"queued"') == 0 and out["Files and attachments 1"].count('"status":"queued"') == 2
    report = out["Files and attachments 2"]
    assert '"done":true' in report and "I wrote the report to /reports/conversation-report.md" in report
    assert "# Conversation report" in report and "- **user**: Write a report" in report

    assert '"agent":"assistant"' in out["Custom thread endpoints 0"]

    effects = out["Effects 0"]
    assert '"name":"remind"' in effects and '"status":"scheduled"' in effects and '"status":"cancelled"' in effects

    haiku = out["Two AI sides: the `haiku_review` example 0"]
    assert '"done":true' in haiku and '"status": "success"' in haiku and '"reason": "session_stop"' in haiku

    launch = out["Subagents: the `launch` example 0"]
    assert '"done":true' in launch and '"name":"qa_team"' in launch and "Accepted: Launch note ready." in launch
    publish = out["Subagents: the `launch` example 1"]
    assert "Publishing waits for CMS_TOKEN" in publish and '"missing":["CMS_TOKEN"]' in publish
    assert '"child_thread_id"' in publish and '"status":"success"' in publish

    assert '"status":"terminated"' in out["Stop, continue, terminate 0"]
    secrets = out["Variables and secrets 0"]
    assert '{"name":"CRM_TOKEN","type":"secret","value":null}' in secrets and '"DB_PASSWORD"' in secrets
