"""The documentation stays true: its links resolve inside the repository, and its references list exactly what the
code has — every route of the OpenAPI document, every error code, every event type and reason the code can emit,
every setting with its default, every authoring field. No database: the app is built but never started."""

from __future__ import annotations

import ast
import inspect
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import fields as dataclass_fields
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from app import catalog, errors, event_types
from app.api.app import create_app
from app.api.errors import HTTP_CODES
from app.settings import Settings
from app.spec import define, definitions
from app.spec.results import ToolAttachment, ToolResult
from app.spec.state import ExecutionState, ThreadState
from tests.conftest import ROOT

DOCS = ROOT / "docs"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
PAGES = sorted(
    [ROOT / "README.md", ROOT / "SECURITY.md", ARCHITECTURE, ROOT / "bench" / "README.md", *DOCS.glob("*.md")]
)
# links that consciously leave the repository (a provider's or a library's own documentation)
EXTERNAL = frozenset({"https://github.com/google/re2/wiki/Syntax"})


# -- reading Markdown ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
AUTOLINK = re.compile(r"<((?:https?|mailto|ftp):[^>\s]+)>")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@cache
def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """The text with fenced code blocks blanked (links and headings inside them are code, not Markdown); lines keep
    their numbers."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _without_code(text: str) -> str:
    """Prose with code spans replaced by a neutral word, so brackets and parentheses inside them are not links."""
    return CODE_SPAN.sub("code", _prose(text))


def links(text: str) -> list[str]:
    """Every link target of a Markdown text: inline links and images, reference definitions, autolinks."""
    prose = _without_code(text)
    found = [m.group(1) for m in INLINE_LINK.finditer(prose)]
    found += [m.group(1) for m in REFERENCE.finditer(prose)]
    found += [m.group(1) for m in AUTOLINK.finditer(prose)]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(_prose(text)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def section(text: str, heading: str) -> str:
    """The text under `heading` (a whole heading line, e.g. `## Models`) up to the next heading of any level."""
    prose = _prose(text)
    lines = prose.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        raise AssertionError(f"no heading {heading!r}") from None
    body = []
    for line in lines[start + 1 :]:
        if HEADING.match(line):
            break
        body.append(line)
    return "\n".join(body)


def code_words(text: str) -> set[str]:
    """Every identifier inside a code span of `text`."""
    return {w for m in CODE_SPAN.finditer(text) for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(2))}


def first_cells(text: str) -> list[str]:
    """The first cell of every table row (header and separator rows excluded)."""
    cells = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|\s*-", line):
            cells.append(line.split("|")[1].strip())
    return cells  # header rows name columns in plain words, never in code spans


def table_names(text: str) -> set[str]:
    """The code-span names in the first column of the section's tables (a header row's cells are plain words)."""
    return {w for cell in first_cells(text) for m in CODE_SPAN.finditer(cell) for w in [m.group(2)] if w.isidentifier()}


# -- links -----------------------------------------------------------------------------------------------------


def _link_problems(page: Path, root: Path = ROOT) -> Iterator[str]:
    where = page.relative_to(root)
    for target in links(_text(page)):
        if SCHEME.match(target):
            if target not in EXTERNAL:
                yield f"{where}: {target}: leaves the repository (allow it in EXTERNAL only if it must)"
            continue
        path, _, anchor = target.partition("#")
        if path.startswith("/"):
            yield f"{where}: {target}: absolute; link relative to the file"
            continue
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(root.resolve()):
            yield f"{where}: {target}: leaves the repository"
        elif not resolved.exists():
            yield f"{where}: {target}: does not exist"
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(_text(resolved)):
            yield f"{where}: {target}: no heading with anchor #{anchor}"


def test_the_documents_exist_and_link_to_each_other() -> None:
    for name in ("README.md", "http-api.md", "events.md", "authoring.md", "deployment.md"):
        assert (DOCS / name).is_file(), name
    index = links(_text(DOCS / "README.md"))
    for target in ("http-api.md", "events.md", "authoring.md", "deployment.md", "../SECURITY.md", "../bench/README.md"):
        assert target in index, target
    assert "docs/README.md" in links(_text(ROOT / "README.md"))


def _module_file(name: str) -> Path | None:
    """The file a module name of ARCHITECTURE.md stands for (`queue.py`, `engine/run.py`, `app/api/`), if any."""
    for base in (ROOT, ROOT / "app"):
        if (base / name).exists():
            return base / name
    return None


def test_architecture_names_only_modules_that_exist() -> None:
    """Every path ARCHITECTURE.md names in code (`app/…`, `engine/…`, `queue.py`, …) is a file or folder here."""
    names = {m.group(2) for m in CODE_SPAN.finditer(_text(ARCHITECTURE))}
    paths = {n.split(" ")[0] for n in names if re.fullmatch(r"\w[\w/.]*(\.py|/)", n.split(" ")[0])}
    assert len(paths) > 30, "ARCHITECTURE.md names the modules it walks through"
    assert sorted(p for p in paths if _module_file(p) is None) == []


def test_architecture_gives_every_table_an_owner() -> None:
    """Each table of `app/tables.py` has its row in ARCHITECTURE.md's table of where its SQL lives."""
    from app import tables

    owners = section(_text(ARCHITECTURE), "## Where each table's SQL lives")
    named = {w for cell in first_cells(owners) for w in re.findall(r"`(\w+)`", cell)}
    declared = {t.name for t in tables.Base.metadata.sorted_tables}
    assert sorted(declared - named) == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    assert list(_link_problems(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_table_row_has_as_many_cells_as_its_header(page: Path) -> None:
    """A stray `|` (say, inside a code span, where it must be written `\\|`) silently shifts a row's columns."""
    header: int | None = None
    for number, line in enumerate(_prose(_text(page)).splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = len(re.split(r"(?<!\\)\|", line.strip())) - 2
        if header is None:
            header = cells
        assert cells == header, f"{page.relative_to(ROOT)}, table line {number}: {cells} cells, header has {header}"


def test_the_link_check_catches_what_it_should(tmp_path: Path) -> None:
    text = (
        "[a](missing.md) [b](../../../../etc/passwd) [c](https://example.com/x) <http://example.org>\n"
        "[d](#nowhere) [e](other.md#title) [f](/abs.md) `[not a link](nope.md)`\n\n"
        "```md\n[fenced](nope.md)\n```\n\n# Title\n\n[ref]: other.md\n"
    )
    assert links(text) == [
        *("missing.md", "../../../../etc/passwd", "https://example.com/x", "#nowhere", "other.md#title", "/abs.md"),
        *("other.md", "http://example.org"),
    ]
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "page.md").write_text(text)
    (repo / "other.md").write_text("# Title\n")
    problems = list(_link_problems(repo / "page.md", repo))
    assert [p.split(": ")[1] for p in problems] == [
        *("missing.md", "../../../../etc/passwd", "https://example.com/x", "#nowhere", "/abs.md"),
        "http://example.org",
    ]
    assert anchors("# `turn_ended` reasons\n## API keys and open mode\n## Title\n## Title\n") == {
        "turn_ended-reasons",
        "api-keys-and-open-mode",
        "title",
        "title-1",
    }


# -- HTTP API --------------------------------------------------------------------------------------------------


@cache
def _openapi() -> dict[str, Any]:
    settings = Settings(database_url="postgresql://docs@127.0.0.1:1/unused")  # never connected: no lifespan runs
    document: dict[str, Any] = create_app(settings, catalog.load(ROOT / "agents")).openapi()
    return document


def test_every_route_of_the_openapi_document_is_in_the_http_reference() -> None:
    page = _text(DOCS / "http-api.md")
    operations = {f"{m.upper()} {p}" for p, item in _openapi()["paths"].items() for m in item}
    assert len(operations) > 20
    missing = sorted(op for op in operations if f"`{op}`" not in page)
    assert missing == [], "add these routes to docs/http-api.md"
    documented = set(re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /[^`\s]*)`", section(page, "## Routes")))
    for heading in re.findall(r"^### .+$", _prose(page), re.MULTILINE):
        documented |= set(re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /[^`\s]*)`", section(page, heading)))
    served = operations | {"GET /openapi.json", "GET /docs", "GET /redoc"}
    assert sorted(documented - served) == [], "docs/http-api.md lists routes the server does not have"


def test_every_operation_id_is_in_the_http_reference_beside_its_route() -> None:
    page = _text(DOCS / "http-api.md")
    for path, item in _openapi()["paths"].items():
        for method, op in item.items():
            if op["tags"] == ["endpoints"]:  # the deployment's own: the example's id is named in its section
                assert f"`{op['operationId']}`" in section(page, "### Custom thread endpoints"), op["operationId"]
            else:
                assert f"| `{method.upper()} {path}` | `{op['operationId']}` |" in page, (method, path)


NOT_HTTP = frozenset({"catalog_invalid"})  # `agents check` and start-up only: a server with a bad folder never serves


def _error_codes() -> set[str]:
    """Every `code` an HTTP answer can carry: the domain error tree, the HTTP status names, and the literal codes
    of `envelope(...)` calls in `app/api`."""
    codes: set[str] = set()
    pending: list[type[errors.AgentsError]] = [errors.AgentsError]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if cls is not errors.AgentsError:
            codes.add(cls.code)
    codes |= set(HTTP_CODES.values())
    for path in (ROOT / "app" / "api").rglob("*.py"):
        for node in ast.walk(ast.parse(_text(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "envelope":
                if len(node.args) < 2:
                    continue
                code = node.args[1]
                if isinstance(code, ast.Constant) and isinstance(code.value, str):
                    codes.add(code.value)
                elif isinstance(code, ast.Attribute) and isinstance(code.value, ast.Attribute):
                    codes.add(getattr(errors, code.value.attr).code)  # errors.Unavailable.code
                elif isinstance(code, ast.Attribute) and isinstance(code.value, ast.Name):
                    continue  # `exc.code`: a domain error's own, counted above
                elif isinstance(code, ast.Name) and path.name == "errors.py":
                    continue  # `HTTP_CODES.get(...)`, counted above
                else:
                    raise AssertionError(f"{path}:{node.lineno}: an error code this test cannot read")
    return codes - NOT_HTTP


def test_every_error_code_is_in_the_http_reference() -> None:
    codes = _error_codes()
    assert {"thread_not_found", "malformed_json", "internal_error", "database_unavailable", "contention"} <= codes
    table = code_words(section(_text(DOCS / "http-api.md"), "## Errors"))
    assert sorted(codes - table) == [], "add these codes to the table of docs/http-api.md (Errors)"


# -- events ----------------------------------------------------------------------------------------------------


@cache
def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(_text(p))) for p in sorted((ROOT / "app").rglob("*.py"))]


def _literal(node: ast.AST, where: str) -> str:
    assert isinstance(node, ast.Constant) and isinstance(node.value, str), f"{where}: not a literal: teach this test"
    return node.value


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    yield from (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


@cache
def _emitted() -> dict[str, set[str]]:
    """What the code can put on a stream: event types (stored, lifecycle, live, synthesised), `error` codes,
    `event` types of the runtime's own, and turn and session reasons."""
    found: dict[str, set[str]] = {k: set() for k in ("thread", "lifecycle", "error", "event", "turn", "session")}
    for path, tree in _trees():
        imports_events = any(
            isinstance(n, ast.ImportFrom) and n.module == "app" and any(a.name == "events" for a in n.names)
            for n in ast.walk(tree)
        )
        for fn in _functions(tree):
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                func = node.func
                owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if owner == "events" and not imports_events:
                    pass  # a local list called `events` (a provider's stream events)
                elif owner == "events" and name == "append":
                    assert len(node.args) == 4, f"{where}: `events.append` with keywords: teach this test"
                    kind = _literal(node.args[2], where)
                    found["thread"].add(kind)
                    if isinstance(node.args[3], ast.Dict):
                        data = dict(zip(node.args[3].keys, node.args[3].values, strict=True))
                        for key, value in data.items():
                            field = key.value if isinstance(key, ast.Constant) else None
                            if kind == "error" and field == "code" and isinstance(value, ast.Constant):
                                found["error"].add(_literal(value, where))
                            if kind == "event" and field == "event_type":
                                found["event"].add(_literal(value, where))
                elif owner == "events" and name == "append_lifecycle" and fn.name == "_announced":
                    assert isinstance(node.args[2], ast.Name), f"{where}: teach this test"  # its callers pass literals
                elif name == "_announced" or (owner == "events" and name == "append_lifecycle"):  # `_announced`:
                    found["lifecycle"].add(_literal(node.args[2], where))  # the thread routes' view, event, commit
                elif name == "ServerSentEvent":
                    for keyword in node.keywords:
                        if keyword.arg == "event" and isinstance(keyword.value, ast.Constant):
                            found["thread"].add(_literal(keyword.value, where))  # `events_missed`, on both streams
                            found["lifecycle"].add(_literal(keyword.value, where))
                elif name == "publish":  # live-only events: a literal type, or a variable assigned literals here
                    kind_arg = node.args[1]
                    if isinstance(kind_arg, ast.Name):
                        values = [
                            a.value
                            for a in ast.walk(fn)
                            if isinstance(a, ast.Assign)
                            and any(isinstance(t, ast.Name) and t.id == kind_arg.id for t in a.targets)
                        ]
                        kinds = {c.value for v in values for c in ast.walk(v) if isinstance(c, ast.Constant)}
                        assert kinds, f"{where}: a live event type this test cannot read"
                        found["thread"] |= {k for k in kinds if isinstance(k, str)}
                    else:
                        found["thread"].add(_literal(kind_arg, where))
                elif name == "_fail" and len(node.args) >= 2:  # the engine's unexpected-failure path: an `error`
                    found["error"].add(_literal(node.args[1], where))
                elif name == "Verdict" and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant):
                    ends = node.args[0].value
                    if ends in ("turn", "session"):
                        reason = node.args[1]
                        if isinstance(reason, ast.JoinedStr):  # f"session_{which}" over the stop and fail bindings
                            found["session"] |= {"session_stop", "session_fail"}
                        else:
                            found[ends].add(_literal(reason, where))
                elif (
                    owner == "threads"
                    and name == "end_session"
                    and len(node.args) >= 4
                    and not isinstance(node.args[3], ast.Attribute)  # `verdict.reason`: counted at its `Verdict`
                ):
                    found["session"].add(_literal(node.args[3], where))
    return found


def test_the_event_scan_finds_what_the_code_emits() -> None:
    emitted = _emitted()
    assert {"message_data", "message_chunk", "reasoning_chunk", "tool_completed", "events_missed"} <= emitted["thread"]
    assert {"thread_created", "thread_updated", "thread_deleted"} <= emitted["lifecycle"]
    assert {"llm_error", "crashed", "internal_error"} <= emitted["error"]
    assert {"stop_on_response", "empty_response"} <= emitted["turn"]
    assert {"max_session_turns", "terminated", "session_stop"} <= emitted["session"]


def test_every_event_type_is_in_the_events_reference() -> None:
    page = _text(DOCS / "events.md")
    emitted = _emitted()
    thread = table_names(section(page, "## Thread events"))
    lifecycle = table_names(section(page, "## Lifecycle events"))
    assert sorted(emitted["thread"] - thread) == [], "add these to the Thread events table of docs/events.md"
    assert sorted(thread - emitted["thread"]) == [], "docs/events.md lists thread events the code never emits"
    assert sorted(emitted["lifecycle"] - lifecycle) == [], "add these to the Lifecycle events table"
    assert sorted(lifecycle - emitted["lifecycle"]) == [], "docs/events.md lists lifecycle events the code never emits"


def test_the_table_of_event_types_is_the_events_reference() -> None:
    page = _text(DOCS / "events.md")
    assert set(event_types.THREAD_EVENTS) == table_names(section(page, "## Thread events"))
    assert set(event_types.LIFECYCLE_EVENTS) == table_names(section(page, "## Lifecycle events"))


@pytest.mark.parametrize(
    ("kind", "heading"),
    [
        ("error", "### `error` codes"),
        ("turn", "### `turn_ended` reasons"),
        ("session", "### `session_ended` reasons"),
    ],
)
def test_every_reason_and_error_code_is_in_the_events_reference(kind: str, heading: str) -> None:
    documented = table_names(section(_text(DOCS / "events.md"), heading))
    assert sorted(_emitted()[kind] ^ documented) == [], f"docs/events.md, {heading}: not what the code emits"


def test_the_runtimes_own_custom_events_are_in_the_events_reference() -> None:
    row = next(
        line for line in section(_text(DOCS / "events.md"), "## Thread events").splitlines() if "| `event` |" in line
    )
    assert _emitted()["event"] and _emitted()["event"] <= code_words(row)


# -- settings --------------------------------------------------------------------------------------------------


def _rendered(value: Any) -> str:
    """A default as the settings table writes it."""
    if value is None or value == []:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_setting_is_in_the_settings_table_with_its_default() -> None:
    rows: dict[str, str] = {}
    for line in section(_text(DOCS / "deployment.md"), "## Settings").splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    defaults = Settings.model_construct()  # the defaults, whatever this process's environment says
    expected = {
        name.upper(): _rendered(getattr(defaults, name))
        for name, field in Settings.model_fields.items()
        if not field.exclude
    }
    assert len(expected) > 30
    assert sorted(set(expected) - set(rows)) == [], "add these settings to docs/deployment.md (Settings)"
    assert sorted(set(rows) - set(expected)) == [], "docs/deployment.md lists settings app/settings.py does not have"
    assert {k: rows[k] for k in expected} == expected


def test_every_setting_is_in_the_readme_configuration_table_too() -> None:
    names = {name.upper() for name, field in Settings.model_fields.items() if not field.exclude}
    table = code_words(section(_text(ROOT / "README.md"), "## Configuration"))
    assert sorted(names - table) == [], "add these settings to the README's Configuration table"


# -- authoring -------------------------------------------------------------------------------------------------


def _model_fields(*models: type[BaseModel]) -> set[str]:
    return {name for model in models for name in model.model_fields}


def _keyword_parameters(fn: Any) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


PARTS = (definitions.PromptTextPart, definitions.PromptIncludePart, definitions.PromptEnvPart)
AUTHORING: list[tuple[str, set[str], bool]] = [  # heading, the names it must show, whether its tables list only those
    ("## The folder", {*definitions.PACKAGING_FIELDS, "tenvs"}, False),
    ("## Models", _model_fields(definitions.ModelDefinition), True),
    ("### Capabilities", _model_fields(definitions.ModelCapabilities), True),
    ("### The `test` provider", _model_fields(definitions.TestReply, definitions.TestToolCall), False),
    ("## Prompts", _model_fields(definitions.PromptDefinition), True),
    ("### Prompt parts", _model_fields(*PARTS), False),
    ("### Reasoning", _model_fields(definitions.ReasoningConfig), True),
    (
        "### Tool entries",
        _model_fields(definitions.ToolEntry, definitions.ImmediateConfig, definitions.ResumableConfig),
        True,
    ),
    ("## Agents", _model_fields(definitions.AgentDefinition), True),
    ("### Sides", _model_fields(definitions.SideConfig, definitions.SessionToolConfig), True),
    ("## Variables", _model_fields(definitions.VariableDefinition), True),
    (
        "## Tools",
        _keyword_parameters(define.define_tool)
        | _model_fields(ToolResult, ToolAttachment)
        | {f.name for f in dataclass_fields(ExecutionState)},
        True,
    ),
    ("## Hooks", set(define.HOOK_PARAMS) | {p for ps in define.HOOK_PARAMS.values() for p in ps}, False),
    ("## Effects", _keyword_parameters(define.define_effect), True),
    ("## Endpoints", _keyword_parameters(define.define_thread_endpoint) | set(define.ENDPOINT_PARAMS), False),
    ("## ThreadState", _members(ThreadState), False),
]


@pytest.mark.parametrize(("heading", "names", "exact"), AUTHORING, ids=[a[0] for a in AUTHORING])
def test_every_authoring_field_is_in_the_authoring_reference(heading: str, names: set[str], exact: bool) -> None:
    text = section(_text(DOCS / "authoring.md"), heading)
    assert len(names) > 0
    assert sorted(names - code_words(text)) == [], f"docs/authoring.md, {heading}: document these"
    if exact:
        stale = table_names(text) - names
        assert sorted(stale) == [], f"docs/authoring.md, {heading}: the code has no such field"


def test_the_authoring_reference_covers_every_definition_model() -> None:
    """A new definition model (a new config object) needs its own place in the table above, and so in the page."""
    covered = {
        definitions.ModelDefinition,
        definitions.ModelCapabilities,
        definitions.TestReply,
        definitions.TestToolCall,
        definitions.PromptDefinition,
    }
    covered |= {
        *PARTS,
        definitions.ReasoningConfig,
        definitions.ToolEntry,
        definitions.ImmediateConfig,
        definitions.ResumableConfig,
    }
    covered |= {
        definitions.AgentDefinition,
        definitions.SideConfig,
        definitions.SessionToolConfig,
        definitions.VariableDefinition,
    }
    defined = {
        cls
        for cls in vars(definitions).values()
        if inspect.isclass(cls) and issubclass(cls, definitions.Definition) and cls is not definitions.Definition
    }
    assert sorted(c.__name__ for c in defined - covered) == []
