"""The step loop (`app/engine/run.py`), driven directly: take a thread from the queue, run `Engine.execute` on the
claim with the `test` provider, and read the rows and events it left. No HTTP, no worker, no polling."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel
from sqlalchemy import delete, event, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import (
    claims,
    db,
    environment,
    events,
    hub,
    inputs,
    keys,
    messages,
    metrics,
    queue,
    statements,
    tables,
    threads,
)
from app.catalog import Catalog
from app.engine import inbox, run
from app.engine.history import Histories
from app.engine.tally import Tallies
from app.engine.transactions import Transactions
from app.llm.base import LLMRequest
from app.settings import Settings
from app.spec import ThreadState, define_agent, define_model, define_prompt, define_tool, definitions
from tests.tools import add

FERNET = Fernet(Fernet.generate_key())


@define_tool(description="Always fails.")
async def explode(state: ThreadState) -> str:
    raise RuntimeError("kaboom")


@define_tool(description="Reads a variable back.")
async def reveal(state: ThreadState) -> str:
    return f"the key is {await state.env('API_KEY')}"


Reply = str | dict[str, Any]


class Model:
    """A `respond` function that answers from a list in order and keeps every request it was sent."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[LLMRequest] = []

    def __call__(self, request: LLMRequest) -> str | definitions.TestReply:
        self.requests.append(request)
        if not self.replies:
            raise AssertionError("the model was asked more often than the test expected")
        reply = self.replies.pop(0)
        return reply if isinstance(reply, str) else definitions.TestReply.model_validate(reply)

    def seen(self, index: int) -> list[tuple[str, str | None]]:
        """The messages of request `index`, as (role, content)."""
        return [(m.role, m.content) for m in self.requests[index].messages]


def catalog(
    model: Model | list[Any],
    *,
    side_a: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
    prompt: dict[str, Any] | None = None,
) -> Catalog:
    answers = {"script": model} if isinstance(model, list) else {"respond": model}
    m = define_model(name="m", provider="test", **answers)
    p = define_prompt(
        **{
            "name": "p",
            "model": "m",
            "prompt": "You are A.",
            "include_chat": True,
            "tools": ["add", "explode", "reveal"],
        }
        | (prompt or {})
    )
    q = define_prompt(name="q", model="m", prompt="You are B.", include_chat=True)
    a = define_agent(**{"name": "agent", "side_a": {"prompt": "p", **(side_a or {})}} | (agent or {}))
    return Catalog(
        root=Path("."),
        models={"m": m},
        prompts={"p": p, "q": q},
        agents={"agent": a},
        tools={"add": add, "explode": explode, "reveal": reveal},
    )


@dataclass
class Outcome:
    """What an execution left for a thread."""

    thread: tables.Thread
    rows: list[tables.Message]
    events: list[tuple[str, dict[str, Any]]]
    logs: list[tables.Log]
    meter: metrics.Meter | None = None  # the engine's

    def reruns(self, how: str, why: str) -> float | None:
        """`agents_transactions_rerun_total` of the engine, for `how` and `why`."""
        assert self.meter is not None
        labels = {"how": how, "why": why}
        return self.meter.work.get_sample_value("agents_transactions_rerun_total", labels)

    def said(self) -> list[tuple[str, str | None]]:
        return [(r.role, r.content) for r in self.rows]

    def kinds(self) -> list[str]:
        return [t for t, _ in self.events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == kind]


Drive = Callable[..., Any]


@pytest.fixture
async def drive(
    settings: Settings, sessions: async_sessionmaker[AsyncSession], database_url: str
) -> AsyncIterator[Drive]:
    """Run one execution: a new thread of the catalog's agent (or thread `thread_id`) gets `inputs` as `role` (after
    `prepare`), is claimed, and the engine runs the claim (the one `between` returns, when given)."""
    opened: list[tuple[hub.Publisher, httpx.AsyncClient]] = []

    async def start(
        cat: Catalog,
        *inputs: str,
        prepare: Callable[[AsyncSession, tables.Thread], Any] | None = None,
        between: Callable[[claims.Claim], Awaitable[claims.Claim]] | None = None,
        role: str = "user",
        thread_id: uuid.UUID | None = None,
        **overrides: Any,
    ) -> Outcome:
        publisher, http = hub.Publisher(database_url), httpx.AsyncClient()
        opened.append((publisher, http))
        engine = run.Engine(
            settings.model_copy(update=overrides), sessions, cat, publisher, FERNET, http, metrics.Meter()
        )
        async with sessions() as s, s.begin():
            if thread_id is None:
                thread = await threads.create(s, cat.agents["agent"], keys.OPEN)
            else:
                thread = await threads.lock(s, thread_id)
            if prepare is not None:
                await prepare(s, thread)
            for text in inputs:
                await messages.enqueue(s, thread, role, text)
        async with db.autocommit(sessions) as s:
            claim = await claims.claim(await statements.driver(s), "test", 30)
        assert claim is not None and claim.thread_id == thread.id
        await engine.execute(await between(claim) if between is not None else claim)
        result = await outcome(sessions, thread.id)
        result.meter = engine.meter
        return result

    yield start
    for publisher, http in opened:
        await publisher.close()
        await http.aclose()


async def outcome(sessions: async_sessionmaker[AsyncSession], thread_id: uuid.UUID) -> Outcome:
    async with sessions() as s:
        logs = select(tables.Log).where(tables.Log.thread_id == thread_id).order_by(tables.Log.created_at)
        return Outcome(
            await s.get_one(tables.Thread, thread_id),
            await messages.history(s, thread_id),
            [(e.type, e.data) for e in await events.read(s, thread_id, 0)],
            list((await s.execute(logs)).scalars()),
        )


def released(result: Outcome) -> bool:
    return result.thread.lease_token is None and result.thread.lease_owner is None


# -- one turn -----------------------------------------------------------------------------------------------


async def test_an_answer_ends_the_turn_and_gives_the_thread_back(drive: Drive) -> None:
    result = await drive(catalog(["hello"]), "hi")
    assert result.said() == [("user", "hi"), ("assistant", "hello")]
    assert [(r.side, r.status, r.prompt, r.model) for r in result.rows] == [
        ("b", "completed", None, None),
        ("a", "completed", "p", "m"),
    ]
    assert result.kinds() == [
        "thread_status",  # queued
        "message_data",  # the input, delivered
        "thread_status",  # running
        "message_data",  # the pending answer
        "step_started",
        "llm_request",
        "llm_response",
        "message_data",  # the answer, completed
        "step_completed",
        "turn_ended",
        "thread_status",  # idle
    ]
    assert [d["status"] for d in result.of("thread_status")] == ["queued", "running", "idle"]
    assert result.of("turn_ended") == [{"side": "a", "reason": "stop_on_response"}]
    thread = result.thread
    assert (thread.status, thread.session_number, thread.session_status, thread.side) == ("idle", 1, "running", None)
    assert (thread.session_steps, thread.session_turns, thread.attempt) == (1, 1, 0)
    assert released(result)
    ((log,),) = [result.logs]
    assert (log.kind, log.status, log.model, log.message_id) == ("llm", "success", "m", result.rows[1].id)


async def test_the_model_sees_the_system_prompt_then_the_input(drive: Drive) -> None:
    model = Model("ok")
    await drive(catalog(model), "first", "second")
    assert model.seen(0) == [("system", "You are A."), ("user", "first"), ("user", "second")]
    assert [t.name for t in model.requests[0].tools] == ["add", "explode", "reveal"]


async def test_a_tool_call_runs_and_its_result_goes_back_to_the_model(drive: Drive) -> None:
    model = Model({"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "c1"}]}, "It is 5.")
    result = await drive(catalog(model), "2+3?")
    assert [(r.role, r.content, r.tool_call_id, r.tool_status) for r in result.rows] == [
        ("user", "2+3?", None, None),
        ("assistant", None, None, None),
        ("tool", "5", "c1", "success"),
        ("assistant", "It is 5.", None, None),
    ]
    assert result.rows[1].tool_calls == [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    assert model.seen(1)[-1] == ("tool", "5")
    assert result.of("tool_started") == [{"tool": "add", "tool_call_id": "c1"}]
    assert result.of("tool_completed") == [{"tool": "add", "tool_call_id": "c1", "status": "success"}]
    assert [d["step"] for d in result.of("step_completed")] == [1, 2]
    (tool_log,) = [log for log in result.logs if log.kind == "tool"]
    assert (tool_log.tool, tool_log.status, tool_log.message_id) == ("add", "success", result.rows[2].id)
    assert result.thread.session_steps == 2 and released(result)


async def test_a_failing_tool_is_an_error_result_the_model_reads(drive: Drive) -> None:
    model = Model({"tool_calls": [{"name": "explode", "id": "c1"}]}, "Sorry.")
    result = await drive(catalog(model), "go")
    (tool,) = [r for r in result.rows if r.role == "tool"]
    assert (tool.tool_status, tool.content) == ("error", "Tool `explode` failed: RuntimeError: kaboom")
    assert model.seen(1)[-1] == ("tool", "Tool `explode` failed: RuntimeError: kaboom")
    assert result.thread.session_status == "running"  # a tool error does not end the session


async def test_an_unknown_tool_is_answered_and_the_turn_goes_on(drive: Drive) -> None:
    model = Model({"tool_calls": [{"name": "fly", "id": "c1"}]}, "I cannot fly.")
    result = await drive(catalog(model), "fly")
    assert ("tool", "Unknown tool `fly`. Available tools: add, explode, reveal") in result.said()
    assert result.said()[-1] == ("assistant", "I cannot fly.")


async def test_several_calls_of_one_response_run_in_order_in_one_step(drive: Drive) -> None:
    calls = [
        {"name": "add", "arguments": {"a": 1, "b": 1}, "id": "c1"},
        {"name": "explode", "id": "c2"},
        {"name": "add", "arguments": {"a": 2, "b": 2}, "id": "c3"},
    ]
    model = Model({"tool_calls": calls}, "done")
    result = await drive(catalog(model), "go")
    assert [(r.tool_call_id, r.tool_status) for r in result.rows if r.role == "tool"] == [
        ("c1", "success"),
        ("c2", "error"),
        ("c3", "success"),
    ]
    assert [d["tool_call_id"] for d in result.of("tool_started")] == ["c1", "c2", "c3"]
    assert [role for role, _ in model.seen(1)] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert [d["step"] for d in result.of("step_completed")] == [1, 2]


async def test_a_secret_a_tool_echoes_is_masked_in_what_is_stored(drive: Drive) -> None:
    model = Model({"tool_calls": [{"name": "reveal", "id": "c1"}]}, "noted")

    async def store_secret(session: AsyncSession, thread: tables.Thread) -> None:
        await environment.set_thread(session, FERNET, thread.id, {"API_KEY": "sk-live-123"}, ["API_KEY"])

    result = await drive(catalog(model), "what is the key?", prepare=store_secret)
    assert ("tool", "the key is ***") in result.said()
    assert model.seen(1)[-1] == ("tool", "the key is ***")  # the model never sees it either
    assert "sk-live-123" not in str(result.events)


async def test_a_declared_secret_from_the_agents_env_is_masked_too(drive: Drive) -> None:
    model = Model({"tool_calls": [{"name": "reveal", "id": "c1"}]}, "noted")
    secret_in_code = {"env": {"API_KEY": "sk-in-code"}, "variables": [{"name": "API_KEY", "type": "secret"}]}
    result = await drive(catalog(model, agent=secret_in_code), "what is the key?")
    assert ("tool", "the key is ***") in result.said()


async def test_input_arriving_mid_turn_is_delivered_before_the_next_call(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async def respond(request: LLMRequest) -> definitions.TestReply:
        model.requests.append(request)
        if len(model.requests) > 1:
            return definitions.TestReply(text="saw it")
        async with sessions() as s, s.begin():  # posted while the model answers: the thread is not locked meanwhile
            (thread,) = (await s.execute(select(tables.Thread))).scalars()
            await messages.enqueue(s, await threads.lock(s, thread.id), "user", "also this")
        return definitions.TestReply(tool_calls=[definitions.TestToolCall(name="add", arguments={"a": 1, "b": 1})])

    model = Model()
    cat = catalog([])
    cat = Catalog(
        root=cat.root,
        models={"m": define_model(name="m", provider="test", respond=respond)},
        prompts=cat.prompts,
        agents=cat.agents,
        tools=cat.tools,
    )
    result = await drive(cat, "start")
    assert [role for role, _ in model.seen(1)] == ["system", "user", "assistant", "tool", "user"]
    assert model.seen(1)[-1] == ("user", "also this")
    assert result.said()[-2:] == [("user", "also this"), ("assistant", "saw it")]
    assert len(result.of("turn_ended")) == 1  # one turn: the input joined it


async def test_a_system_message_is_stored_and_starts_nothing(drive: Drive) -> None:
    model = Model()
    result = await drive(catalog(model), "be polite", role="system")
    assert model.requests == []
    assert result.said() == [("system", "be polite")]
    assert result.thread.status == "idle" and result.thread.session_number == 0 and released(result)


async def test_a_new_message_after_a_session_ended_starts_the_next_session(drive: Drive) -> None:
    side = {"session_stop": "done"}
    model = Model({"tool_calls": [{"name": "done", "id": "c1"}]}, "again")
    first = await drive(catalog(model, side_a=side), "one")
    assert (first.thread.session_number, first.thread.session_status) == (1, "success")
    second = await drive(catalog(model, side_a=side), "two", thread_id=first.thread.id)
    thread = second.thread
    assert (thread.session_number, thread.session_status, thread.session_reason) == (2, "running", None)
    assert (thread.session_steps, thread.session_turns) == (1, 1)  # counted afresh
    # what each session's steps wrote is tagged with it (an input is tagged before the session it starts begins)
    assert [(r.content, r.session_number) for r in second.rows if r.role != "user"] == [
        (None, 1),
        ("ok", 1),
        ("again", 2),
    ]
    assert model.seen(1)[1:] == [("user", "one"), ("user", "two")]  # the chat, without past tool traffic


# -- what ends a turn or a session --------------------------------------------------------------------------


async def test_a_session_stop_tool_ends_the_session_with_its_payload(drive: Drive) -> None:
    side = {"session_stop": {"name": "done", "message_property": "summary"}}
    model = Model({"tool_calls": [{"name": "done", "arguments": {"summary": "all set"}, "id": "c1"}]})
    result = await drive(catalog(model, side_a=side), "finish")
    assert "done" in [t.name for t in model.requests[0].tools]
    thread = result.thread
    assert (thread.session_status, thread.session_reason) == ("success", "session_stop")
    assert thread.session_result == {"content": "all set", "attachments": []}
    assert result.of("session_ended") == [
        {"status": "success", "reason": "session_stop", "result": {"content": "all set", "attachments": []}}
    ]
    assert ("tool", "all set") in result.said()  # the mapped payload is what the tool message stores
    assert thread.status == "idle" and released(result)


async def test_a_stop_tool_ends_the_turn_and_its_property_is_the_stored_answer(drive: Drive) -> None:
    side = {"stop_tool": "add", "stop_tool_response_property": "a", "stop_on_response": False}
    model = Model({"text": "thinking", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}, "id": "c1"}]})
    result = await drive(catalog(model, side_a=side), "go")
    assert result.of("turn_ended") == [{"side": "a", "reason": "stop_tool"}]
    assert result.rows[1].content == "thinking"  # the property is not a string: the text stays
    assert len(model.requests) == 1


async def test_max_steps_ends_a_turn_that_would_go_on(drive: Drive) -> None:
    model = Model("one", "two", "three")
    result = await drive(catalog(model, side_a={"stop_on_response": False, "max_steps": 2}), "go")
    assert result.said() == [("user", "go"), ("assistant", "one"), ("assistant", "two")]
    assert result.of("turn_ended") == [{"side": "a", "reason": "max_steps"}]
    assert model.seen(1)[-1] == ("assistant", "one")


async def test_the_servers_step_limit_fails_the_session(drive: Drive) -> None:
    model = Model("one", "two", "three")
    result = await drive(catalog(model, side_a={"stop_on_response": False}), "go", max_session_steps=2)
    assert len(model.requests) == 2
    assert (result.thread.session_status, result.thread.session_reason) == ("failure", "max_total_steps")
    assert released(result)


async def test_an_empty_answer_is_asked_again_once_then_ends_the_turn(drive: Drive) -> None:
    model = Model("", "")
    result = await drive(catalog(model), "hi")
    assert len(model.requests) == 2
    assert result.of("turn_ended") == [{"side": "a", "reason": "empty_response"}]
    assert result.thread.session_status == "running"


async def test_a_model_error_fails_the_message_and_the_session(drive: Drive) -> None:
    result = await drive(catalog([{"error": "bad request", "status": 400}]), "hi")
    assert [(r.role, r.status) for r in result.rows] == [("user", "completed"), ("assistant", "failed")]
    assert result.of("error") == [{"code": "llm_error", "message": "bad request"}]
    assert (result.thread.session_status, result.thread.session_reason) == ("failure", "llm_error")
    (log,) = result.logs
    assert (log.status, log.error) == ("error", "bad request")
    assert result.thread.status == "idle" and released(result)


async def test_a_missing_prompt_variable_ends_the_session_before_any_call(drive: Drive) -> None:
    model = Model("never sent")
    cat = catalog(model, prompt={"prompt": [{"type": "env", "property": "WHO"}]})
    result = await drive(cat, "hi")
    assert model.requests == []
    assert result.said() == [("user", "hi")]
    (error,) = result.of("error")
    assert error["code"] == "missing_variable" and "`WHO`" in error["message"]
    assert (result.thread.session_status, result.thread.session_reason) == ("failure", "llm_error")
    # the error before the end it causes: a wait (`app/waits.py`) stops reading at the `idle` that follows
    assert result.kinds()[-3:] == ["error", "session_ended", "thread_status"]


async def test_a_thread_variable_is_rendered_into_the_prompt(drive: Drive) -> None:
    model = Model("hi Ada")
    cat = catalog(model, prompt={"prompt": [{"type": "text", "content": "Greet "}, {"type": "env", "property": "WHO"}]})

    async def name_ada(session: AsyncSession, thread: tables.Thread) -> None:
        await environment.set_thread(session, FERNET, thread.id, {"WHO": "Ada"}, [])

    await drive(cat, "hi", prepare=name_ada)
    assert model.seen(0)[0] == ("system", "Greet Ada")


# -- dual_ai: both sides in one execution -------------------------------------------------------------------


async def test_dual_ai_sides_take_turns_each_seeing_itself_as_assistant(drive: Drive) -> None:
    model = Model("from A", "from B")
    dual: dict[str, Any] = {"type": "dual_ai", "side_b": {"prompt": "q"}, "max_session_turns": 2}
    result = await drive(catalog(model, agent=dual), "opening")
    assert model.seen(0) == [("system", "You are A."), ("user", "opening")]
    assert model.seen(1) == [("system", "You are B."), ("assistant", "opening"), ("user", "from A")]
    assert [(r.role, r.side, r.content) for r in result.rows] == [
        ("user", "b", "opening"),
        ("assistant", "a", "from A"),
        ("user", "b", "from B"),
    ]
    assert [d["side"] for d in result.of("turn_ended")] == ["a", "b"]
    thread = result.thread
    assert (thread.session_status, thread.session_reason, thread.session_turns) == ("success", "max_session_turns", 2)
    assert released(result)


# -- how an execution starts and stops ----------------------------------------------------------------------


async def test_a_lost_lease_writes_nothing(drive: Drive) -> None:
    model = Model("never")

    async def stolen(claim: claims.Claim) -> claims.Claim:
        return claims.Claim(thread_id=claim.thread_id, token=uuid.uuid4(), attempt=claim.attempt)

    result = await drive(catalog(model), "hi", between=stolen)
    assert model.requests == [] and result.rows == []
    assert result.kinds() == ["thread_status"]  # only `queued`, from before the claim
    assert result.thread.lease_token is not None  # still the real claim's: nothing released it


async def test_a_thread_terminated_after_its_claim_runs_nothing_and_is_given_back(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    model = Model("never")

    async def terminate(claim: claims.Claim) -> claims.Claim:
        async with sessions() as s, s.begin():
            (await threads.lock(s, claim.thread_id)).terminated_at = datetime.now(UTC)
        return claim

    result = await drive(catalog(model), "hi", between=terminate)
    assert model.requests == [] and result.rows == []  # the input is not even delivered
    assert released(result)


async def test_a_stopped_thread_runs_nothing(drive: Drive, sessions: async_sessionmaker[AsyncSession]) -> None:
    model = Model("never")

    async def stop(claim: claims.Claim) -> claims.Claim:
        async with sessions() as s, s.begin():
            (await threads.lock(s, claim.thread_id)).stopped = True
        return claim

    result = await drive(catalog(model), "hi", between=stop)
    assert model.requests == [] and result.rows == []
    assert released(result)


async def crashed_mid_session(session: AsyncSession, thread: tables.Thread, attempt: int) -> None:
    """The thread as workers that died at its running session's step left it: `attempt` claims that never ended."""
    thread.session_number, thread.session_status, thread.session_steps = 1, "running", 1
    thread.attempt = attempt - 1  # the claim adds one
    await threads.set_status(session, thread, threads.Status.RUNNING)


async def test_a_step_that_crashed_its_workers_too_often_fails_the_session(drive: Drive) -> None:
    model = Model("never")

    async def three_crashes(session: AsyncSession, thread: tables.Thread) -> None:
        await crashed_mid_session(session, thread, inbox.MAX_ATTEMPTS + 1)

    result = await drive(catalog(model), "are you there?", prepare=three_crashes)
    assert model.requests == []
    assert result.said() == [("user", "are you there?")]  # the input is kept
    (error,) = result.of("error")
    assert error["code"] == "crashed" and f"crashed {inbox.MAX_ATTEMPTS} times" in error["message"]
    assert (result.thread.session_status, result.thread.session_reason) == ("failure", "crashed")
    assert result.thread.status == "idle" and released(result)


async def test_input_that_keeps_killing_the_worker_is_set_aside_unread(drive: Drive) -> None:
    model = Model("never")

    async def four_crashes(session: AsyncSession, thread: tables.Thread) -> None:
        await crashed_mid_session(session, thread, inbox.MAX_ATTEMPTS + 2)

    result = await drive(catalog(model), "poison", prepare=four_crashes)
    assert model.requests == [] and result.rows == []  # never delivered
    assert [d["code"] for d in result.of("error")] == ["input_set_aside", "crashed"]
    assert result.thread.session_reason == "crashed" and released(result)


async def test_input_that_cannot_be_delivered_is_set_aside_and_the_rest_runs(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    model = Model("answered")

    async def poison(session: AsyncSession, thread: tables.Thread) -> None:
        await queue.enqueue(session, thread.id, inputs.Kind.MESSAGE, {"role": "user", "content": "no id"})

    result = await drive(catalog(model), "fine", prepare=poison)
    (error,) = result.of("error")
    assert error["code"] == "input_set_aside" and "id: Field required" in error["message"]
    assert result.said() == [("user", "fine"), ("assistant", "answered")]
    async with sessions() as s:
        aside = select(func.count()).where(
            tables.Inbox.thread_id == result.thread.id, tables.Inbox.set_aside_at.is_not(None)
        )
        assert (await s.execute(aside)).scalar_one() == 1


async def test_an_unexpected_error_fails_the_session_with_secrets_masked(drive: Drive) -> None:
    def broken(request: LLMRequest) -> str:
        raise RuntimeError("cannot reach sk-live-123")

    async def store_secret(session: AsyncSession, thread: tables.Thread) -> None:
        await environment.set_thread(session, FERNET, thread.id, {"API_KEY": "sk-live-123"}, ["API_KEY"])

    cat = catalog([])
    cat = Catalog(
        root=cat.root,
        models={"m": define_model(name="m", provider="test", respond=broken)},
        prompts=cat.prompts,
        agents=cat.agents,
        tools=cat.tools,
    )
    result = await drive(cat, "hi", prepare=store_secret)
    assert result.of("error") == [{"code": "internal_error", "message": "RuntimeError: cannot reach ***"}]
    [failed] = [r for r in result.rows if r.status == "failed"]  # the answer it was writing says why too
    assert failed.metadata_["error"] == {
        "code": "internal_error",
        "message": "The run failed: RuntimeError: cannot reach ***",
    }
    assert (result.thread.session_status, result.thread.session_reason) == ("failure", "crashed")
    assert result.thread.status == "idle" and released(result)
    assert "sk-live-123" not in str(result.events)


class FinishArgs(BaseModel):
    files: list[str] | None = None


@define_tool(description="Ends the session, optionally with files.")
async def finish(state: ThreadState, args: FinishArgs) -> str:
    return "finished"


async def test_a_callable_session_tool_called_with_null_attachments_ends_the_session(drive: Drive) -> None:
    model = Model({"tool_calls": [{"name": "finish", "arguments": {"files": None}, "id": "c1"}]})
    cat = catalog(model, side_a={"session_stop": {"name": "finish", "attachments_property": "files"}})
    cat = Catalog(root=cat.root, models=cat.models, prompts=cat.prompts, agents=cat.agents, tools={"finish": finish})
    result = await drive(cat, "wrap up")
    assert (result.thread.session_status, result.thread.session_reason) == ("success", "session_stop")
    assert result.thread.session_result == {"content": "finished", "attachments": []}


# -- transactions of one statement ----------------------------------------------------------------------------


@contextlib.contextmanager
def statements_sent(sessions: async_sessionmaker[AsyncSession]) -> Iterator[list[Any]]:
    """Every statement sent on the pool's connections meanwhile (asyncpg's query loggers), with its error if any."""
    pool = sessions.kw["bind"].sync_engine
    seen: list[Any] = []

    def out(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(seen.append)

    def back(dbapi_connection: Any, *_: Any) -> None:
        if dbapi_connection is not None and dbapi_connection.driver_connection is not None:
            dbapi_connection.driver_connection.remove_query_logger(seen.append)

    event.listen(pool, "checkout", out)
    event.listen(pool, "checkin", back)
    try:
        yield seen
    finally:
        event.remove(pool, "checkout", out)
        event.remove(pool, "checkin", back)


def guarded(seen: list[Any]) -> list[Any]:
    """The statements sent as transactions of their own (`events.Guard`)."""
    return [q for q in seen if "AS written" in q.query]


ALONE = "FROM threads t WHERE t.id = $1 AND t.lease_token = $2"  # `queue.FENCE`, sent alone


def fences(seen: list[Any]) -> list[tuple[int, str]]:
    """Where the transactions took the thread row's lock: `alone` (`queue.FENCE`) or `in the read` (the closing's
    first read, `claims.fence_later`)."""
    sent = [" ".join(q.query.split()) for q in seen]
    return [(i, "alone" if ALONE in q else "in the read") for i, q in enumerate(sent) if ALONE in q or "fence AS" in q]


async def test_an_answer_is_stored_in_one_statement_without_begin_or_commit(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A step's answer reads nothing: its message, log row, events and the thread row's changes (with the close of
    the turn and the release) go in one statement guarded by the row's version and the lease, not in a fenced
    transaction of four round trips; the transactions that read (the openings, the tool's result) stay fenced."""
    with statements_sent(sessions) as seen:
        cat = catalog(Model({"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}, "5."))
        result = await drive(cat, "2+3?")
        await asyncio.sleep(0.05)  # the loggers are called soon after each statement
    assert [(q.exception, "INSERT INTO logs" in q.query) for q in guarded(seen)] == [(None, True), (None, True)]
    assert [how for _, how in fences(seen)] == ["in the read"] * 2  # the opening; the tool's result's closing
    assert result.said() == [("user", "2+3?"), ("assistant", None), ("tool", "5"), ("assistant", "5.")]
    assert [r.kind for r in result.logs] == ["llm", "tool", "llm"]
    assert len(result.of("llm_response")) == 2 and len(result.of("step_completed")) == 2
    assert result.thread.status == "idle" and released(result)


async def test_the_transaction_a_tool_result_closes_the_step_in_reads_once_and_carries_the_result(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The transaction that stores the last tool result and opens the next step takes the row lock in its first
    read, which reads the history and the inbox in one statement, the result riding in it (returned from its INSERT:
    the statement cannot see it in the table); then its events with the new pending message, and COMMIT. Three
    statements, BEGIN aside."""
    with statements_sent(sessions) as seen:
        cat = catalog(Model({"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}, "5."))
        result = await drive(cat, "2+3?")
        await asyncio.sleep(0.05)  # the loggers are called soon after each statement
    sent = [" ".join(q.query.split()) for q in seen]
    [_, (at, how)] = fences(seen)
    closing = sent[at - 1 : at + 3]
    assert how == "in the read" and closing[0].startswith("BEGIN")
    assert "INSERT INTO messages" in closing[1] and "FROM inbox" in closing[1] and "rev > $2" in closing[1]
    assert "INSERT INTO events" in closing[2] and closing[3].startswith("COMMIT")
    assert not [q for q in sent[at:] if q.startswith("SELECT * FROM messages")]  # no read of its own
    assert result.said() == [("user", "2+3?"), ("assistant", None), ("tool", "5"), ("assistant", "5.")]


async def test_an_execution_s_opening_reads_once_and_writes_the_user_s_message_with_its_events(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The transaction that opens an execution's first step takes the row lock in its first read, which reads the
    history and the inbox and takes the input in one statement, giving the message taken its place; the user's
    message made of it joins the history without being read back, and its INSERT rides with the next statement
    (here the env's first read; else the events' statement, with the pending message after it)."""
    with statements_sent(sessions) as seen:
        result = await drive(catalog(Model("hi there")), "hello")
        await asyncio.sleep(0.05)  # the loggers are called soon after each statement
    seen = [q for q in seen if "set_config" not in q.query and "typeinfo_tree" not in q.query]  # a new connection's
    sent = [" ".join(q.query.split()) for q in seen]
    [(at, how)] = fences(seen)
    end = sent.index("COMMIT;", at)
    assert how == "in the read" and sent[at - 1].startswith("BEGIN")
    assert "DELETE FROM inbox" in sent[at] and "rev > $2" in sent[at] and "nextval" in sent[at]
    assert not [q for q in sent[at + 1 : end] if "FROM messages" in q]  # the history is not read again
    [placed] = [q for q in sent[at + 1 : end] if '"position"' in q]  # the user's message, at its place
    assert "INSERT INTO messages" in placed
    assert result.said() == [("user", "hello"), ("assistant", "hi there")]
    user, answer = result.rows  # in position order
    assert user.position < answer.position and result.thread.turn_start == user.position


async def test_the_results_of_calls_run_at_once_are_each_stored_in_one_statement(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """Three calls of one answer run at once: the results before the last read nothing (their message, log row and
    `tool_completed` ride in one guarded statement each); the last one closes the step and opens the next, fenced.
    The user's, tool and pending messages go with another statement, not in an INSERT of their own."""
    calls = [{"name": "add", "arguments": {"a": i, "b": 1}, "id": f"c{i}"} for i in range(3)]
    with statements_sent(sessions) as seen:
        cat = catalog(Model({"tool_calls": calls}, "done."), prompt={"parallel_tool_calls": True})
        result = await drive(cat, "add them")
        await asyncio.sleep(0.05)  # the loggers are called soon after each statement
    written = guarded(seen)
    assert [q.exception for q in written] == [None] * 4  # the answer, two results, the last answer
    assert [q.query.count("INSERT INTO messages") for q in written] == [0, 1, 1, 0]
    assert [how for _, how in fences(seen)] == ["in the read"] * 2  # the opening; the last result's closing
    alone = [q for q in seen if q.query.lstrip().startswith("INSERT INTO messages")]
    assert not alone  # the user's message too rides with the history's read, which returns its position
    assert not [q for q in seen if q.query.lstrip().startswith("DELETE FROM inbox")]  # taken with the first look
    assert result.thread.turn_start == next(r.position for r in result.rows if r.role == "user")  # the turn's start
    assert result.said() == [
        ("user", "add them"),
        ("assistant", None),
        ("tool", "1"),
        ("tool", "2"),
        ("tool", "3"),
        ("assistant", "done."),
    ]
    assert [r.kind for r in result.logs] == ["llm", "tool", "tool", "tool", "llm"]
    assert len(result.of("tool_completed")) == 3 and len(result.of("step_completed")) == 2
    assert result.thread.status == "idle" and released(result)


async def test_a_streaming_answer_keeps_its_partial_text_in_single_statements_and_its_answer_in_one(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A reply streamed over several `FLUSH_SECONDS`: each partial text is one UPDATE of the message outside any
    transaction (no BEGIN, no fence, no COMMIT), and the thread row is left as it was, so the answer is still stored
    in one guarded statement."""
    cat = catalog(Model("abcdefgh"))
    streaming = cat.models["m"].model_copy(update={"chunk_size": 1, "chunk_delay_ms": 70})
    cat = Catalog(root=cat.root, models={"m": streaming}, prompts=cat.prompts, agents=cat.agents, tools=cat.tools)
    with statements_sent(sessions) as seen:
        result = await drive(cat, "spell it")
        await asyncio.sleep(0.05)  # the loggers are called soon after each statement
    partials = [q for q in seen if q.query == messages.PARTIAL]
    assert len(partials) >= 2 and all(q.exception is None for q in partials)
    assert [q.args[2] for q in partials] == sorted(q.args[2] for q in partials)  # the text so far, growing
    assert [how for _, how in fences(seen)] == ["in the read"]  # the step's opening only
    assert [q.exception for q in guarded(seen)] == [None]  # the answer
    assert result.said() == [("user", "spell it"), ("assistant", "abcdefgh")]


async def test_a_partial_text_after_the_lease_was_lost_writes_nothing(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`Transactions.partial` writes only while the claim's lease holds and the message is still `pending`."""
    async with sessions() as s, s.begin():
        thread = await threads.create(s, catalog(["-"]).agents["agent"], keys.OPEN)
        await messages.enqueue(s, thread, "user", "hi")
        pending = await messages.add(s, thread.id, "assistant", status="pending")
    async with db.autocommit(sessions) as s:
        claim = await claims.claim(await statements.driver(s), "test", 30)
    assert claim is not None and claim.thread_id == thread.id
    txs = Transactions(sessions, Histories(), Tallies())

    async def content() -> str | None:
        async with sessions() as s:
            return (await s.get_one(tables.Message, pending.id)).content

    await txs.partial(claim, pending.id, "so far")
    assert await content() == "so far"
    async with sessions() as s, s.begin():
        await s.execute(delete(tables.Lease).where(tables.Lease.thread_id == thread.id))
    await txs.partial(claim, pending.id, "so far, and more")
    assert await content() == "so far"


async def test_an_answer_whose_thread_changed_meanwhile_is_stored_in_a_transaction_once(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """Input posted while the model answers changes the thread row: the guarded statement writes nothing, and the
    same answer is stored by a fenced transaction instead, once (one log row, one event each)."""

    async def respond(request: LLMRequest) -> definitions.TestReply:
        model.requests.append(request)
        if len(model.requests) > 1:
            return definitions.TestReply(text="saw it")
        async with sessions() as s, s.begin():
            (thread,) = (await s.execute(select(tables.Thread))).scalars()
            await messages.enqueue(s, await threads.lock(s, thread.id), "user", "also this")
        return definitions.TestReply(tool_calls=[definitions.TestToolCall(name="add", arguments={"a": 1, "b": 1})])

    model = Model()
    cat = catalog([])
    m = define_model(name="m", provider="test", respond=respond)
    cat = Catalog(root=cat.root, models={"m": m}, prompts=cat.prompts, agents=cat.agents, tools=cat.tools)
    with statements_sent(sessions) as seen:
        result = await drive(cat, "start")
        await asyncio.sleep(0.05)
    refused = [type(q.exception).__name__ for q in guarded(seen) if q.exception is not None]
    assert refused == ["DivisionByZeroError"]  # the first answer's: the row was not the version it was read as
    assert result.reruns("one_statement", "stale") == 1
    reads = [q.args[1] for q in seen if "FROM messages WHERE thread_id = $1 AND rev > $2" in q.query]
    # the history kept: later steps read what changed (the first message, held without reading it back, has no
    # revision to read from yet)
    assert reads[0] == 0 and reads == sorted(reads) and reads[-1] > 0
    assert result.said() == [
        ("user", "start"), ("assistant", None), ("tool", "2"), ("user", "also this"), ("assistant", "saw it"),
    ]  # fmt: skip
    assert [r.kind for r in result.logs] == ["llm", "tool", "llm"]
    assert len(result.of("llm_response")) == 2 and len(result.of("tool_started")) == 1
    assert len(result.of("turn_ended")) == 1 and released(result)


async def test_a_closing_whose_thread_changed_meanwhile_is_fenced_again_and_stored_once(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The transaction a tool result closes the step in takes the row lock in its first read, only if the row is
    as the answer's statement left it; input posted while the tool ran changed it: that read counts for nothing,
    the transaction rolls back, and the same work runs fenced as usual — the result stored once, the input seen."""

    @define_tool(description="Posts to its own thread.")
    async def poke(state: ThreadState) -> str:
        async with sessions() as s, s.begin():
            (thread,) = (await s.execute(select(tables.Thread))).scalars()
            await messages.enqueue(s, await threads.lock(s, thread.id), "user", "also this")
        return "poked"

    model = Model({"tool_calls": [{"name": "poke", "arguments": {}}]}, "saw it")
    plain = catalog(model, prompt={"tools": ["poke"]})
    cat = Catalog(
        root=plain.root, models=plain.models, prompts=plain.prompts, agents=plain.agents, tools={"poke": poke}
    )
    with statements_sent(sessions) as seen:
        result = await drive(cat, "start")
        await asyncio.sleep(0.05)
    took = fences(seen)  # the opening; the closing in its read, for nothing; the closing again; the input's opening
    assert [how for _, how in took] == ["in the read", "in the read", "alone", "in the read"]
    assert seen[took[1][0] + 1].query.startswith("ROLLBACK")
    assert result.reruns("in_read", "stale") == 1  # counted
    assert result.said() == [
        ("user", "start"), ("assistant", None), ("tool", "poked"), ("user", "also this"), ("assistant", "saw it"),
    ]  # fmt: skip
    assert [r.kind for r in result.logs] == ["llm", "tool", "llm"]
    assert len(result.of("tool_completed")) == 1 and len(result.of("step_completed")) == 2
    assert len(result.of("turn_ended")) == 1 and released(result)


async def test_an_opening_whose_thread_changed_after_the_claim_is_fenced_again(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """An execution's first transaction starts from the row as the claim returned it and takes the lock in its first
    read; input posted between the claim and that read changed the row: the read counts for nothing, everything
    rolls back, and the opening runs fenced as usual — both messages delivered, once."""

    async def post_more(claim: claims.Claim) -> claims.Claim:
        async with sessions() as s, s.begin():
            await messages.enqueue(s, await threads.lock(s, claim.thread_id), "user", "and more")
        return claim

    with statements_sent(sessions) as seen:
        result = await drive(catalog(Model("both seen")), "first", between=post_more)
        await asyncio.sleep(0.05)
    took = fences(seen)
    assert [how for _, how in took] == ["in the read", "alone"]
    assert seen[took[0][0] + 1].query.startswith("ROLLBACK") and result.reruns("in_read", "stale") == 1
    assert result.said() == [("user", "first"), ("user", "and more"), ("assistant", "both seen")]
    assert len(result.of("turn_ended")) == 1 and released(result)


async def test_a_message_deleted_while_a_tool_ran_is_not_in_the_next_request(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The closing's first read takes the row lock only if the row is as the answer left it: a deletion meanwhile
    changed it (its count of removals, which makes the history read everything again), so the closing runs fenced
    on the row as it is now, and the deleted message is not sent again."""

    @define_tool(description="Deletes the thread's first message.")
    async def forget(state: ThreadState) -> str:
        async with sessions() as s, s.begin():
            (thread,) = (await s.execute(select(tables.Thread))).scalars()
            [first, *_] = await messages.history(s, thread.id)
            await threads.lock(s, thread.id)
            await messages.remove(s, thread.id, first.id)
        return "forgotten"

    model = Model({"tool_calls": [{"name": "forget", "arguments": {}}]}, "ok")
    plain = catalog(model, prompt={"tools": ["forget"]})
    tools = {"forget": forget}
    cat = Catalog(root=plain.root, models=plain.models, prompts=plain.prompts, agents=plain.agents, tools=tools)
    result = await drive(cat, "a secret")
    first, second = model.requests
    assert "a secret" in [m.content for m in first.messages]
    assert "a secret" not in [m.content for m in second.messages]
    assert result.said() == [("assistant", None), ("tool", "forgotten"), ("assistant", "ok")]


async def test_an_answer_after_the_lease_was_lost_writes_nothing(
    drive: Drive, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The lease revoked while the model answers (as stop and terminate revoke it): the guarded statement writes
    nothing, and the fenced transaction it falls back to finds the lease gone: the answer is not stored."""

    async def respond(request: LLMRequest) -> str:
        async with sessions() as s, s.begin():
            await s.execute(delete(tables.Lease))
        return "too late"

    cat = catalog([])
    m = define_model(name="m", provider="test", respond=respond)
    cat = Catalog(root=cat.root, models={"m": m}, prompts=cat.prompts, agents=cat.agents, tools=cat.tools)
    result = await drive(cat, "hi")
    assert [(r.role, r.status) for r in result.rows] == [("user", "completed"), ("assistant", "pending")]
    assert result.logs == [] and result.of("llm_response") == []
    assert result.thread.lease_token is not None  # not given back by a worker that no longer holds it


@pytest.mark.parametrize("first", [{"text": "", "reasoning": "hmm"}, {"text": "thinking", "reasoning": "hmm"}])
async def test_an_answer_s_deltas_reach_the_hub_before_the_events_after_them(
    drive: Drive, database_url: str, monkeypatch: pytest.MonkeyPatch, first: dict[str, Any]
) -> None:
    """However slowly the publisher sends: an empty answer's deltas (it is asked again) before the next request's
    events, and an answer's before its own (those it did not send ride in the statement that stores it)."""
    send = hub.Publisher._send

    async def slow(self: hub.Publisher) -> None:
        await asyncio.sleep(0.3)
        await send(self)

    monkeypatch.setattr(hub.Publisher, "_send", slow)
    heard: list[str] = []
    listener = await db.connect(database_url)
    await listener.add_listener(events.CHANNEL, lambda *args: heard.append(args[3]))
    try:
        result = await drive(catalog(Model(first, "ok")), "hi")
    finally:
        await listener.close()
    assert result.said()[-1] == ("assistant", "ok" if not first["text"] else "thinking")
    delta = next(i for i, p in enumerate(heard) if p.startswith("[") and '"reasoning_chunk"' in p)
    after = next(i for i, p in enumerate(heard) if not p.startswith("[") and '"llm_response"' in p)
    assert delta < after, heard


async def test_a_message_after_the_step_limit_failed_the_session_starts_the_next_one(drive: Drive) -> None:
    """The cap is reached at a turn's opening (the session's steps all spent by earlier turns): that turn ends the
    session at once; the next message starts a new session and is answered."""
    model = Model("one", "two", "three")
    first = await drive(catalog(model), "a", max_session_steps=1)
    assert first.thread.session_status == "running" and len(model.requests) == 1
    capped = await drive(catalog(model), "b", thread_id=first.thread.id, max_session_steps=1)
    assert (capped.thread.session_status, capped.thread.session_reason) == ("failure", "max_total_steps")
    assert len(model.requests) == 1 and released(capped)
    again = await drive(catalog(model), "c", thread_id=first.thread.id, max_session_steps=1)
    assert (again.thread.session_number, again.thread.session_status) == (2, "running")
    assert len(model.requests) == 2 and again.said()[-1] == ("assistant", "two")
