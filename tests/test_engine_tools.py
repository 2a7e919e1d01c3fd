"""Tool execution (`app/engine/tools.py`): argument checks, error results, result shapes and the log row of a call.
Pure where it can be; attachment checks read a thread's files on real Postgres."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import files, keys, logs, tables, threads
from app.catalog import Catalog
from app.engine import context, hooks, tool_arguments, tools, types
from app.engine.state import RunState, Shared
from app.spec import ThreadState, ToolResult, define_agent, define_model, define_prompt, define_tool
from app.spec.definitions import SideConfig, ToolEntry
from app.spec.messages import ToolCall
from app.spec.state import ExecutionState

# -- tools under test ---------------------------------------------------------------------------------------


class AddArgs(BaseModel):
    a: int
    b: int


@define_tool(description="Add two integers.")
async def add(state: ThreadState, args: AddArgs) -> int:
    assert state.execution is not None
    return args.a + args.b


@define_tool(description="Reports what it was called with.")
async def echo(state: ThreadState) -> dict[str, Any]:
    assert state.execution is not None
    return {"call": state.execution.tool_call_id, "options": state.execution.tool_options}


@define_tool(description="Always fails.")
async def explode(state: ThreadState) -> str:
    raise RuntimeError("kaboom")


@define_tool(description="Never finishes in time.", timeout=0.01)
async def hang(state: ThreadState) -> str:
    await asyncio.Event().wait()
    return "unreachable"


@define_tool(description="A plain function, run in a worker thread.")
def shout(state: ThreadState, args: AddArgs) -> str:
    return f"{args.a}+{args.b}!"


CATALOG = Catalog(
    root=Path("."),
    models={"m": define_model(name="m", provider="test", script=["x"])},
    prompts={"p": define_prompt(name="p", model="m", prompt="x", tools=["add"])},
    agents={"agent": define_agent(name="agent", side_a={"prompt": "p"})},
    tools={t.name: t for t in (add, echo, explode, hang, shout)},
)


def no_transaction() -> AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]:
    raise AssertionError("this test opens no transaction")


def state(thread: tables.Thread | None = None, transaction: Any = no_transaction, **shared: Any) -> RunState:
    row = thread or tables.Thread(id=uuid.uuid4(), agent="agent", user_id="u")
    env = types.Env(thread={}, agent={}, prompt={})
    made = Shared(row, env, transaction, catalog=CATALOG, fernet=Fernet(Fernet.generate_key()), **shared)
    return made.state(ExecutionState(side="a", step=1, session=1, attempt=1))


def call(name: str, arguments: Any = None, call_id: str = "call_1") -> ToolCall:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def callable_tool(name: str, **entry: Any) -> types.OfferedTool:
    definition = CATALOG.tools[name]
    return types.OfferedTool(name, "callable", ToolEntry(name=name, **entry), "", definition.parameters())


DONE = SideConfig(prompt="p", session_stop={"name": "done", "message_property": "summary"})
SESSION = types.OfferedTool("done", "session", ToolEntry(name="done"), "", context.session_tool_schema(DONE, "done"))
OFFERED = {t.name: t for t in (callable_tool("add"), callable_tool("explode"), SESSION)}


# -- execute ------------------------------------------------------------------------------------------------


async def test_an_unknown_tool_is_an_error_naming_the_available_ones() -> None:
    outcome = await tools.execute(CATALOG, OFFERED, call("subtract", {"a": 1}), state())
    assert outcome.result.status == "error"
    assert outcome.result.error == "Unknown tool `subtract`. Available tools: add, done, explode"
    assert outcome.arguments is None


async def test_an_unknown_tool_with_nothing_offered_says_none() -> None:
    outcome = await tools.execute(CATALOG, {}, call("add"), state())
    assert outcome.result.error == "Unknown tool `add`. Available tools: none"


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]"])
async def test_arguments_that_are_not_a_json_object_are_an_error(raw: str) -> None:
    outcome = await tools.execute(CATALOG, OFFERED, call("add", raw), state())
    assert outcome.result.status == "error"
    assert (outcome.result.error or "").startswith("Invalid arguments for tool `add`:")
    assert outcome.arguments is None


async def test_a_callable_runs_with_its_validated_arguments() -> None:
    outcome = await tools.execute(CATALOG, OFFERED, call("add", {"a": 2, "b": 40}), state())
    assert (outcome.result.status, outcome.result.result) == ("success", "42")
    assert outcome.arguments == {"a": 2, "b": 40}


async def test_invalid_callable_arguments_name_each_problem() -> None:
    outcome = await tools.execute(CATALOG, OFFERED, call("add", {"a": "two"}), state())
    error = outcome.result.error or ""
    assert error.startswith("Invalid arguments for tool `add`: ")
    assert "`a`: Input should be a valid integer" in error
    assert "`b`: Field required" in error


async def test_a_raising_tool_becomes_an_error_result_with_the_exception() -> None:
    outcome = await tools.execute(CATALOG, OFFERED, call("explode"), state())
    assert outcome.result.status == "error"
    assert outcome.result.error == "Tool `explode` failed: RuntimeError: kaboom"


async def test_the_tool_sees_its_call_id_and_entry_options() -> None:
    offered = {"echo": callable_tool("echo", options={"depth": 2})}
    outcome = await tools.execute(CATALOG, offered, call("echo", call_id="call_9"), state())
    assert json.loads(outcome.result.text) == {"call": "call_9", "options": {"depth": 2}}


async def test_a_kind_the_step_loop_runs_itself_cannot_be_called_here() -> None:
    offered = {"team": types.OfferedTool("team", "subagent", ToolEntry(name="team"), "", {})}
    outcome = await tools.execute(CATALOG, offered, call("team", {"message": "hi"}), state())
    assert outcome.result.error == "Tool `team` cannot be called here"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "missing `summary`"),
        ({"summary": "ok", "extra": 1}, "unknown `extra`"),
        ({"summary": 5}, "`summary` must be a string"),
    ],
)
async def test_a_session_tool_checks_its_arguments_against_its_schema(arguments: dict[str, Any], problem: str) -> None:
    outcome = await tools.execute(CATALOG, OFFERED, call("done", arguments), state())
    assert outcome.result.error == f"Invalid arguments for tool `done`: {problem}"
    assert outcome.arguments == arguments  # kept: the stop evaluation reads them


async def test_a_valid_session_tool_call_succeeds_without_running_anything() -> None:
    outcome = await tools.execute(CATALOG, OFFERED, call("done", {"summary": "bye"}), state())
    assert (outcome.result.status, outcome.result.result) == ("success", "ok")


async def test_a_session_tool_takes_one_path_or_a_list_of_paths() -> None:
    side = SideConfig(prompt="p", session_stop={"name": "done", "attachments_property": "files"})
    offered = {
        "done": types.OfferedTool(
            "done", "session", ToolEntry(name="done"), "", context.session_tool_schema(side, "done")
        )
    }
    for good in ("/a.txt", ["/a.txt"]):
        assert (
            await tools.execute(CATALOG, offered, call("done", {"files": good}), state())
        ).result.status == "success"
    bad = await tools.execute(CATALOG, offered, call("done", {"files": 3}), state())
    assert bad.result.error == "Invalid arguments for tool `done`: `files` must be a list of paths"


# -- run ----------------------------------------------------------------------------------------------------


async def test_a_tool_past_its_time_limit_is_stopped_with_an_error() -> None:
    result = await tools.run("hang", hang, {}, state())
    assert result.error == "Tool `hang` did not finish within 0.01 s and was stopped"


async def test_the_servers_limit_applies_when_the_tool_sets_none() -> None:
    @define_tool(description="Waits forever.")
    async def forever(state: ThreadState) -> str:
        await asyncio.Event().wait()
        return "unreachable"

    quick = state(tool_timeout=0.01)
    result = await tools.run("forever", forever, {}, quick)
    assert result.error == "Tool `forever` did not finish within 0.01 s and was stopped"


async def test_a_plain_def_tool_runs_and_returns_its_text() -> None:
    assert (await tools.run("shout", shout, {"a": 1, "b": 2}, state())).result == "1+2!"


# -- results ------------------------------------------------------------------------------------------------


class Point(BaseModel):
    x: int
    y: int


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        ("plain", "plain"),
        ({"k": [1, 2]}, '{"k": [1, 2]}'),
        (Point(x=1, y=2), '{"x":1,"y":2}'),
        (7, "7"),
        ({"when": uuid.UUID(int=1)}, '{"when": "00000000-0000-0000-0000-000000000001"}'),  # unknown types as text
    ],
)
def test_a_return_value_becomes_a_successful_result(value: Any, text: str) -> None:
    result = tools.normalise(value)
    assert (result.status, result.result) == ("success", text)


def test_a_returned_tool_result_is_kept_as_it_is() -> None:
    given = ToolResult(status="error", error="no", error_code="denied")
    assert tools.normalise(given) is given


# -- log rows -----------------------------------------------------------------------------------------------


def test_json_secrets_add_the_escaped_spellings_longest_first() -> None:
    spelled = tools.json_secrets(['pa"ss', "é", ""])
    assert set(spelled) == {'pa"ss', 'pa\\"ss', "é", "\\u00e9"}
    assert spelled == sorted(spelled, key=len, reverse=True)


def test_a_log_row_masks_secrets_even_json_escaped_ones() -> None:
    secret = 'to"ken'
    arguments = json.dumps({"key": secret, "note": "fine"})
    row = tools.log_row(
        uuid.uuid4(), call("login", arguments), ToolResult(status="success", result="ok"), 1.5, [secret]
    )
    assert row.request is not None
    assert json.loads(row.request["arguments"]) == {"key": "***", "note": "fine"}
    assert (row.kind, row.tool, row.status, row.error, row.latency_ms) == ("tool", "login", "success", None, 1.5)
    assert row.response is None


def test_a_log_row_keeps_the_size_and_a_cut_of_long_arguments() -> None:
    arguments = json.dumps({"blob": "é" * 3000})
    row = tools.log_row(uuid.uuid4(), call("store", arguments), ToolResult(status="success"), 0, [])
    assert row.request is not None
    assert len(row.request["arguments"]) == logs.ARGUMENTS_KEPT
    assert row.request["arguments_bytes"] == len(arguments.encode())
    assert row.request["tool_call_id"] == "call_1"


def test_a_log_row_of_a_failure_keeps_its_masked_error_and_code() -> None:
    failed = ToolResult(status="error", error="bad key sk-1", error_code="denied")
    row = tools.log_row(uuid.uuid4(), call("login"), failed, 0, ["sk-1"])
    assert (row.status, row.error, row.response) == ("error", "bad key ***", {"error_code": "denied"})


def test_a_log_row_cuts_a_made_up_name_and_serialises_object_arguments() -> None:
    odd: Any = {"id": "c", "type": "function", "function": {"name": "x" * 500, "arguments": {"a": 1}}}
    row = tools.log_row(uuid.uuid4(), odd, ToolResult(status="success"), 0, [])
    assert row.tool == "x" * logs.NAME_WIDTH
    assert row.request is not None and row.request["arguments"] == '{"a": 1}'


# -- attachments a session tool names (real Postgres) --------------------------------------------------------

FILES = SideConfig(prompt="p", session_stop={"name": "done", "attachments_property": "files"})


async def checked(
    sessions: async_sessionmaker[AsyncSession], paths: Any, side: SideConfig | None = FILES
) -> types.Outcome:
    """`check_attachments` of a successful `done` call naming `paths`, on a thread holding `/out/report.txt`."""
    async with sessions() as session, session.begin():
        thread = await threads.create(session, CATALOG.agents["agent"], keys.OPEN)
        await files.write_bytes(session, thread.id, "/out/report.txt", b"report", "text/plain")
        ran = types.Outcome(call("done", {"files": paths}), ToolResult(status="success", result="ok"), {"files": paths})
        return await tools.check_attachments(side, ran, state(thread, lambda: hooks.joined(session, thread)))


async def test_existing_files_pass_the_attachment_check(sessions: async_sessionmaker[AsyncSession]) -> None:
    outcome = await checked(sessions, ["/out/report.txt"])
    assert outcome.result.status == "success"
    assert (await checked(sessions, "/out/report.txt")).result.status == "success"  # one path alone


async def test_missing_directories_and_malformed_paths_are_named_in_the_error(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    outcome = await checked(sessions, ["/out/report.txt", "/nope.txt", "/out", "/../etc"])
    assert outcome.result.error == tool_arguments.missing_attachments(["/nope.txt", "/out", "/../etc"])


async def test_paths_that_are_not_strings_are_refused(sessions: async_sessionmaker[AsyncSession]) -> None:
    outcome = await checked(sessions, [1, 2])
    assert outcome.result.error == "Invalid arguments for tool `done`: `files` must be a list of file paths"


async def test_without_a_side_nothing_is_checked(sessions: async_sessionmaker[AsyncSession]) -> None:
    assert (await checked(sessions, ["/nope.txt"], side=None)).result.status == "success"
