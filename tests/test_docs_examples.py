"""The examples of `docs/authoring.md` stay real: every Python block compiles, the blocks that name a file (their
first line is `# models/fast.py`) load together as one agents folder with the catalog loader, and together they use
every field of the definition models, every `define_*` parameter, every hook and every `ThreadState` member."""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Iterator
from dataclasses import fields as dataclass_fields
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from app import catalog
from app.spec import define, definitions
from app.spec.results import ToolAttachment, ToolResult
from app.spec.state import ExecutionState, ThreadState
from tests.conftest import ROOT, client_for, wait_for

PAGE = ROOT / "docs" / "authoring.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE = re.compile(r"# ((?:models|prompts|agents|tools|hooks|effects|endpoints)/[\w/\[\].-]+\.py)\n")


@cache
def blocks() -> list[tuple[int, str]]:
    """Every Python block of the page: (line number, source)."""
    text = PAGE.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def files() -> dict[str, str]:
    """The blocks that name a file, by that file (a file named twice is an error of the page)."""
    found: dict[str, str] = {}
    for line, source in blocks():
        if match := FILE.match(source):
            assert match.group(1) not in found, f"docs/authoring.md:{line}: {match.group(1)} is shown twice"
            found[match.group(1)] = source
    return found


@cache
def trees() -> list[ast.Module]:
    return [ast.parse(source) for _, source in blocks()]


def _nodes() -> Iterator[ast.AST]:
    for tree in trees():
        yield from ast.walk(tree)


def keywords_and_keys() -> set[str]:
    """Every keyword argument and every literal dict key the examples write."""
    found: set[str] = set()
    for node in _nodes():
        if isinstance(node, ast.Call):
            found |= {k.arg for k in node.keywords if k.arg}
        elif isinstance(node, ast.Dict):
            found |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return found


def attributes() -> set[str]:
    return {node.attr for node in _nodes() if isinstance(node, ast.Attribute)}


def state_members_used() -> set[str]:
    """`state.x` and `child.x` / `parent.x` (other threads' states) of the examples."""
    names = {"state", "child", "parent"}
    return {
        node.attr
        for node in _nodes()
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names
    }


def hooks_used() -> set[str]:
    return {
        str(node.args[0].value)
        for node in _nodes()
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "define_hook"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def test_the_page_has_examples_and_every_one_compiles() -> None:
    assert len(blocks()) > 25
    for line, source in blocks():
        compile(source, f"docs/authoring.md:{line}", "exec")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs") / "agents"
    for name, source in files().items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


def test_the_examples_load_as_one_agents_folder(folder: Path) -> None:
    loaded = catalog.load(folder)  # raises, listing every problem, when an example is broken
    assert sorted(loaded.models) == ["backup", "echo", "fast", "local", "scripted"]
    assert {"support", "coordinator", "polish", "qa_worker", "qa_reviewer"} <= set(loaded.prompts)
    assert {"qa_team", "support", "front_desk", "billing", "scout", "researcher", "legacy"} <= set(loaded.agents)
    assert len(loaded.hooks) == len(define.HOOK_PARAMS)
    assert sorted(loaded.effects) == ["follow_up"]
    # the only warning is the one the deprecated `tenvs` example shows
    assert [(p.file, p.field) for p in loaded.warnings] == [("agents/agents/legacy.py", "tenvs")]


def test_what_the_examples_say_is_what_the_loader_reads(folder: Path) -> None:
    loaded = catalog.load(folder)
    legacy = loaded.agents["legacy"]
    assert legacy.env == {"LEGACY": "yes"} and legacy.max_session_turns == 4
    assert legacy.side_a.session_tool_names() == ["finish", "progress"]
    fail = legacy.side_b.binding("fail") if legacy.side_b else None
    assert fail is not None and (fail.name, fail.message_property) == ("give_up", "why")
    support = loaded.prompts["support"]
    merged = {**loaded.models[support.model].provider_options, **support.provider_options}
    assert merged == {"temperature": 0, "seed": 7}  # the prompt's key wins, the model's other keys stay
    assert support.hooks == ["last_50", "redact_cards"] and loaded.agents["support"].hooks == ["stamp_role"]
    worker = loaded.agents["qa_team"].side_a
    assert (worker.stop_tool, worker.stop_tool_response_property) == ("submit_draft", "draft")
    scout = next(e for e in loaded.prompts["coordinator"].tool_entries() if e.name == "scout")
    assert not isinstance(scout.immediate, bool) and scout.immediate.description_env == "SCOUT_BRIEF"
    assert loaded.kind_of("billing") == "agent" and loaded.agents["billing"].type == "ai_human"
    scripted = loaded.models["scripted"]
    timing = (scripted.chunk_size, scripted.delay_ms, scripted.chunk_delay_ms)
    assert timing == (4, 50, 20) and len(scripted.script or []) == 5


def _fields(*models: type[BaseModel]) -> set[str]:
    return {name for model in models for name in model.model_fields}


PARTS = (definitions.PromptTextPart, definitions.PromptIncludePart, definitions.PromptEnvPart)
DEFINITIONS = (
    *(
        definitions.ModelDefinition,
        definitions.ModelCapabilities,
        definitions.TestReply,
        definitions.TestToolCall,
        definitions.PromptDefinition,
    ),
    *(
        *PARTS,
        definitions.ReasoningConfig,
        definitions.ToolEntry,
        definitions.ImmediateConfig,
        definitions.ResumableConfig,
    ),
    *(
        definitions.AgentDefinition,
        definitions.SideConfig,
        definitions.SessionToolConfig,
        definitions.VariableDefinition,
    ),
)


def test_every_definition_field_has_an_example() -> None:
    missing = _fields(*DEFINITIONS) - keywords_and_keys() - {"max_session_turns"}  # shown camelCase too
    assert sorted(missing) == [], "give these fields an example in docs/authoring.md"


def test_every_define_parameter_and_result_field_has_an_example() -> None:
    wanted = _fields(ToolResult, ToolAttachment)
    for fn in (define.define_tool, define.define_effect, define.define_thread_endpoint):
        wanted |= {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}
    assert sorted(wanted - keywords_and_keys()) == [], "give these an example in docs/authoring.md"
    execution = {f.name for f in dataclass_fields(ExecutionState)}
    assert sorted(execution - attributes()) == [], "use these `state.execution` fields in an example"


def test_every_hook_has_an_example() -> None:
    assert sorted(set(define.HOOK_PARAMS) - hooks_used()) == []


def test_every_thread_state_member_has_an_example() -> None:
    members = {name for name in vars(ThreadState) if not name.startswith("_")}
    assert len(members) > 40
    assert sorted(members - state_members_used()) == [], "use these `state` members in an example"


async def test_the_scripted_example_runs_as_the_page_says(folder: Path, app_factory: Any) -> None:
    """`weather` on the `scripted` model, through the HTTP API: the retried error, the tool call and the answer;
    then the next entry; then an error that is not retried ends the session with `llm_error`."""
    app = await app_factory(catalog.load(folder), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "weather"})).json()["id"]

    async def say(text: str) -> dict[str, Any]:
        answer = await client.post(f"/threads/{tid}/messages", params={"wait": 30}, json={"content": text})
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        assert body["done"] is True
        return body

    first = await say("Weather in Paris?")
    assert [(m["role"], m["content"]) for m in first["messages"]] == [
        ("user", "Weather in Paris?"),
        ("assistant", None),
        ("tool", "Sunny, 21 °C"),
        ("assistant", "Sunny, 21 °C."),
    ]
    assert first["messages"][1]["tool_calls"][0]["id"] == "call_1"
    second = await say("Thanks!")
    assert second["messages"][-1]["content"] == "Anything else?"
    await say("Bye")
    thread = (await client.get(f"/threads/{tid}")).json()
    assert (thread["session"]["status"], thread["session"]["reason"]) == ("failure", "llm_error")
    logs = (await client.get(f"/threads/{tid}/logs", params={"kind": "llm"})).json()["logs"]
    assert [(row["attempt"], row["status"], row["error"]) for row in logs] == [
        (1, "error", "overloaded"),
        (2, "success", None),
        (1, "success", None),
        (1, "success", None),
        (1, "error", "bad request"),
    ]


async def test_the_agent_detail_in_http_api_md_is_what_the_server_answers(folder: Path, app_factory: Any) -> None:
    """docs/http-api.md shows `GET /agents/qa_team` for this page's `qa_team`: the server answers exactly that."""
    page = (ROOT / "docs" / "http-api.md").read_text()
    shown = re.search(r"`GET /agents/\{name\}` answers for the `qa_team`.*?```json\n(.*?)```", page, re.DOTALL)
    assert shown is not None, "the example moved"
    async with client_for(await app_factory(catalog.load(folder))) as client:
        assert (await client.get("/agents/qa_team")).json() == json.loads(shown[1])


# the page's `fast`, `backup` and `local` talk to real providers: an offline stand-in, recording what it is sent
STAND_IN = """
from app.spec import define_model

SEEN = []


def respond(request):
    SEEN.append(request)
    return "Done."


for name in ("fast", "backup", "local"):
    define_model(name=name, provider="test", respond=respond)
"""


async def test_the_tool_entries_example_fans_out_names_and_lists_its_children(
    folder: Path, tmp_path: Path, app_factory: Any
) -> None:
    """`front_desk` runs the page's `coordinator`: its `immediate` `scout` entry starts one child per `REGION__k`,
    named by `name_env` (and tagged `name:<name>`) and described by `description_env`; the coordinator's model then
    gets the registry message after its history."""
    root = tmp_path / "agents"
    for name, source in files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(STAND_IN if name == "models/fast.py" else source, encoding="utf-8")
    loaded = catalog.load(root)
    respond = loaded.models["fast"].respond
    assert respond is not None
    seen: list[Any] = respond.__globals__["SEEN"]
    app = await app_factory(loaded, with_worker=True)
    client = client_for(app)
    env = {"SCOUTS": "yes", "REGION": "north", "REGION__2": "south"}
    env |= {"SCOUT_NAME": "North scout", "SCOUT_NAME__2": "South scout"}
    env |= {"SCOUT_BRIEF": "Scout the north.", "SCOUT_BRIEF__2": "Scout the south."}
    tid = (await client.post("/threads", json={"agent": "front_desk", "env": env})).json()["id"]

    async def two() -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] = (await client.get(f"/threads/{tid}/subagents")).json()["subagents"]
        return found if len(found) == 2 else None

    # one transaction makes both, so they share `created_at`: the registry's order between them is not fixed
    children = sorted(await wait_for(two, timeout=30), key=lambda c: str(c["thread_name"]))
    assert [(c["name"], c["thread_name"], c["description"], c["blocking"]) for c in children] == [
        ("scout", "North scout", "Scout the north.", False),
        ("scout", "South scout", "Scout the south.", False),
    ]
    tagged = (await client.get("/threads", params={"tag": "name:South scout"})).json()["threads"]
    assert [(t["id"], t["parent_id"], t["name"]) for t in tagged] == [(children[1]["reference"], tid, "South scout")]

    answer = await client.post(f"/threads/{tid}/messages", params={"wait": 30}, json={"content": "Status?"})
    assert answer.json()["done"] is True
    mine = [r for r in seen if (r.messages[0].content or "").startswith("You coordinate the team")]
    registry = mine[-1].messages[-1]
    assert registry.role == "system"
    header, *lines = (registry.content or "").splitlines()
    assert header == "Subagents of this thread (use their reference to address them):"
    for child, line in zip(children, sorted(lines, key=lambda line: "South" in line), strict=True):
        assert line.startswith(f'- {child["reference"]}: scout "{child["thread_name"]}" — ')
        assert line.endswith(f"(one session, non-blocking): {child['description']}")
