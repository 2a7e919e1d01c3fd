"""The tool phase of a step: each call announced (`tool_started`) in a fenced transaction, run with its hooks
outside any transaction, and recorded (its result message, log row and `tool_completed`) in the next; a subagent
call is answered, or parks the thread, inside one transaction (§6, §7).

One after another by default. When the prompt sets `parallel_tool_calls`, the calls of one answer run at once (at
most `TOOL_CONCURRENCY` callables at a time, children all started together): their results are stored in the order of
the calls, each as soon as it and the ones before it are done, so a crash re-runs only the calls left unanswered;
handoffs run last, after the others; a stop cancels them all (`semantics.md` §3, step 7).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import attachments, children, claims, errors, events, files, tables, tracing
from app.catalog import Catalog
from app.engine import calls, child_tools, hooks, results, stops, subprompts, tools, types
from app.engine.state import RunState, Shared, prepare_hooks
from app.engine.step import Answered, Opened, OpenOnItsOwn, Released
from app.engine.transactions import Transactions
from app.metrics import Meter
from app.settings import Settings
from app.spec.messages import ToolCall
from app.spec.results import ToolResult
from app.spec.state import ExecutionState, SubagentEntry

Closed = Opened | Answered | Released | OpenOnItsOwn | None  # what the transaction that closed a step opened next
Close = Callable[[AsyncSession, tables.Thread, list[types.Outcome]], Awaitable[Closed]]
_SPAWNS = uuid.UUID("7b1c2f0e-5a43-4d8e-9a55-3f2d9c6e1b20")  # the namespace of an answer's spawn group ids


@dataclass(frozen=True)
class Done:
    """The step's calls all answered; `closed` is what its closing transaction opened next."""

    closed: Closed


@dataclass
class Prepared:
    """Tool calls announced (`tool_started`) in a transaction, with the state and hooks they run with."""

    state: RunState
    hooks: hooks.Hooks


@dataclass(frozen=True)
class Ran:
    """A callable (or session tool, or subprompt) call that ran: its outcome, its result as its hooks shaped it (to
    record in the next transaction), and those hooks."""

    outcome: types.Outcome
    shaped: results.Shaped
    hooks: hooks.Hooks


class ToolPhase:
    """Runs the tool calls of a step for the engine, which hands it everything it uses."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: async_sessionmaker[AsyncSession],
        catalog: Catalog,
        fernet: Fernet,
        runner: subprompts.Runner,
        meter: Meter,
        transactions: Transactions,
        context: Callable[[tables.Thread], dict[str, Any]],
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._catalog = catalog
        self._fernet = fernet
        self._subprompts = runner
        self._meter = meter
        self._tx = transactions.fenced
        self._written = transactions.written
        self._partial = transactions.partial
        self._context = context

    # -- which calls run together --------------------------------------------------------------------------

    @staticmethod
    def is_subagent(offered: dict[str, types.OfferedTool], call: ToolCall) -> bool:
        tool = offered.get(call["function"]["name"])
        return tool is not None and tool.kind in child_tools.KINDS

    @staticmethod
    def _is_handoff(offered: dict[str, types.OfferedTool], call: ToolCall) -> bool:
        tool = offered.get(call["function"]["name"])
        return tool is not None and tool.kind == "handoff"

    def batch(self, pending: list[ToolCall], offered: dict[str, types.OfferedTool], parallel: bool) -> list[ToolCall]:
        """The calls that run next: the first one; with `parallel`, every one but the handoffs (unless only
        handoffs are left), which run last."""
        if not parallel:
            return pending[:1]
        return [c for c in pending if not self._is_handoff(offered, c)] or pending[:1]

    def _group(self, step: Answered, offered: dict[str, types.OfferedTool]) -> uuid.UUID | None:
        """The spawn group the children one answer creates share (the same after a crash: made from the answer)."""
        made = [c for c in step.response.tool_calls if self.is_subagent(offered, c)]
        creating = [c for c in made if offered[c["function"]["name"]].kind != child_tools.MESSAGE]
        if len(creating) < 2:
            return None
        return uuid.uuid5(_SPAWNS, str(step.message_id))

    # -- the phase -----------------------------------------------------------------------------------------

    async def run(
        self,
        claim: claims.Claim,
        step: Answered,
        offered: dict[str, types.OfferedTool],
        prepared: Prepared | None,
        close: Close,
        *,
        parallel: bool,
    ) -> Done | None:
        """Run the step's calls (`prepared`: the first batch's, announced in the answer's transaction); `Done`
        after the transaction that closed the step, or None when the thread parked on a blocking subagent (the
        child's result resumes the step)."""
        outcomes: list[types.Outcome] = []
        answered: set[str] = set()
        parked = False
        group = self._group(step, offered)
        bound = asyncio.Semaphore(self._settings.tool_concurrency)  # callables of this step running at once
        while pending := [c for c in step.calls if c["id"] not in answered]:  # `state.queue_tool` may add calls
            batch = self.batch(pending, offered, parallel)
            answered |= {c["id"] for c in batch}
            if prepared is None and any(not self.is_subagent(offered, c) for c in batch):
                async with self._tx(claim) as (session, thread):
                    prepared = await self.announce(session, thread, claim, step, offered, batch)
            runs = [asyncio.ensure_future(self._one(step, offered, c, prepared, group, bound, claim)) for c in batch]
            prepared = None
            try:
                for call, running in zip(batch, runs, strict=True):
                    ran = await running
                    if ran is None:  # parked on a blocking subagent: the other calls of the batch still finish
                        parked = True
                        continue
                    if isinstance(ran, types.Outcome):  # a subagent call: answered in its own transaction
                        outcomes.append(ran)
                        continue
                    outcomes.append(ran.outcome)
                    last = not parked and all(c["id"] in answered for c in step.calls) and running is runs[-1]
                    # an `after_create_message` hook runs between the result's commit and what follows it; without
                    # one, the result's transaction goes on to the next call's start, or closes the step
                    carry_on = ran.shaped.fields is None or not ran.hooks.runs("after_create_message")
                    following = self._next_alone(step, offered, answered, parallel) if carry_on else None
                    closing = carry_on and last

                    async def record(
                        session: AsyncSession,
                        thread: tables.Thread,
                        call: ToolCall = call,
                        ran: Ran = ran,
                        following: ToolCall | None = following,
                        closing: bool = closing,
                    ) -> tuple[tables.Message | None, Closed, Prepared | None]:
                        row = await results.write(session, thread, call, ran.shaped, later=ran.hooks.none)
                        if closing:
                            return row, await close(session, thread, outcomes), None
                        if following is not None:
                            return row, None, await self.announce(session, thread, claim, step, offered, [following])
                        return row, None, None

                    # a result that does not close the step reads nothing: without hooks, one statement
                    hooked = not ran.hooks.none  # its hooks run in `record`: once, fenced
                    row, closed, prepared = await self._written(claim, record, reads=closing or hooked, once=hooked)
                    if carry_on and last:
                        return Done(closed)
                    if row is not None:
                        await ran.hooks.after_create_message(row)
            finally:  # a stop (or a lost lease) cancels the calls still running with the execution
                for running in runs:
                    running.cancel()
                await asyncio.gather(*runs, return_exceptions=True)
            if parked:  # nothing more runs until the child answers: the rerun of this step picks up the rest
                return None
        async with self._tx(claim) as (session, thread):
            closed = await close(session, thread, outcomes)
        return Done(closed)

    def _next_alone(
        self, step: Answered, offered: dict[str, types.OfferedTool], answered: set[str], parallel: bool
    ) -> ToolCall | None:
        """Run one by one, the next call (when it is a callable) is announced in the transaction that records
        the one before it."""
        pending = [c for c in step.calls if c["id"] not in answered]
        if parallel or not pending or self.is_subagent(offered, pending[0]):
            return None
        return pending[0]

    async def _one(
        self,
        step: Answered,
        offered: dict[str, types.OfferedTool],
        call: ToolCall,
        prepared: Prepared | None,
        group: uuid.UUID | None,
        bound: asyncio.Semaphore,
        claim: claims.Claim,
    ) -> Ran | types.Outcome | None:
        """One call of a batch: a subagent's answered (or parked) in its own transaction, anything else run."""
        if self.is_subagent(offered, call):
            tool = offered[call["function"]["name"]]
            with tracing.span(f"execute_tool {tool.name}", tools.traced(call, tool)):
                return await self._subagent(claim, step, tool, call, group)
        assert prepared is not None
        async with bound:
            return await self._execute(claim, step, offered, call, prepared)

    # -- one call ------------------------------------------------------------------------------------------

    async def announce(
        self,
        session: AsyncSession,
        thread: tables.Thread,
        claim: claims.Claim,
        step: Answered,
        offered: dict[str, types.OfferedTool],
        batch: list[ToolCall],
    ) -> Prepared:
        """Announce the batch's callables (`tool_started`) and build the state and hooks they run with."""
        for call in batch:
            if not self.is_subagent(offered, call):
                await events.append(
                    session, thread.id, "tool_started", {"tool": call["function"]["name"], "tool_call_id": call["id"]}
                )
        execution = ExecutionState(
            side=step.side, step=step.number, session=thread.session_number, attempt=thread.attempt
        )
        registry = tuple(
            SubagentEntry.model_validate(children.entry(c)) for c in await children.listed(session, thread)
        )
        state = Shared(
            thread,
            step.env,
            lambda: self._tx(claim),
            catalog=self._catalog,
            fernet=self._fernet,
            context=self._context(thread),
            queue_call=step.calls.append,
            sessions=self._sessions,
            children=registry,
            subprompts=self._subprompts,
            partial=lambda message_id, text: self._partial(claim, message_id, text),
            tool_timeout=self._settings.tool_timeout,
        ).state(execution)
        hook_runner = await prepare_hooks(  # its hooks run between this step's transactions, not inside one
            self._catalog,
            self._fernet,
            session,
            thread,
            step.side,
            env=step.env,
            transaction=lambda: self._tx(claim),
            context=self._context(thread),
        )
        return Prepared(state, hook_runner)

    async def _execute(
        self,
        claim: claims.Claim,
        step: Answered,
        offered: dict[str, types.OfferedTool],
        call: ToolCall,
        prepared: Prepared,
    ) -> Ran:
        """Run the tool and its hooks, outside any transaction."""
        state, hook_runner = prepared.state, prepared.hooks
        started = time.perf_counter()
        outcome = await tools.execute(self._catalog, offered, call, state)
        latency_ms = round((time.perf_counter() - started) * 1000, 2)
        self._meter.tool_call(call["function"]["name"], outcome.result.status, offered)
        outcome = replace(outcome, result=calls.scrub_result(outcome.result, step.env.secrets()))  # a tool's echo
        outcome = await tools.check_attachments(step.config, outcome, state)
        # a session tool bound in object form stores its mapped payload: that is the result its hooks see and edit
        content, bound = stops.stored_result(step.config, outcome)
        given = outcome.result
        if content != given.text:
            given = given.model_copy(update={"result": content})

        async def files(kept: ToolResult) -> list[dict[str, Any]]:
            return await self._attachments(claim, bound, kept)

        shaped = await results.shape(
            hook_runner,
            claim.thread_id,
            call,
            given,
            step.side,
            latency_ms=latency_ms,
            secrets=step.env.secrets(),
            files=files,
        )
        return Ran(replace(outcome, result=shaped.result), shaped, hook_runner)

    async def _subagent(
        self, claim: claims.Claim, step: Answered, tool: types.OfferedTool, call: ToolCall, group: uuid.UUID | None
    ) -> types.Outcome | None:
        """A subagent tool call (§6): its result now, or None when the parent parks on a blocking child."""
        name = call["function"]["name"]
        async with self._tx(claim) as (session, thread):
            await events.append(session, thread.id, "tool_started", {"tool": name, "tool_call_id": call["id"]})
            config = step.agent.side(step.side)
            assert config is not None
            prompt = self._catalog.prompts[config.prompt]
            started = time.perf_counter()
            done = await child_tools.call(
                session, self._catalog, thread, step.side, prompt, tool, call, step.env, self._fernet, group=group
            )
            if isinstance(done, child_tools.Parked):
                return None
            latency_ms = round((time.perf_counter() - started) * 1000, 2)
            # its hooks run as a callable's do, inside this transaction: the call and its answer commit together
            hook_runner = await prepare_hooks(
                self._catalog, self._fernet, session, thread, step.side, env=step.env, context=self._context(thread)
            )
            result, _ = await results.store(
                session,
                thread,
                hook_runner,
                call,
                done.result,
                step.side,
                latency_ms=latency_ms,
                secrets=step.env.secrets(),
                child=done.child,
            )
        self._meter.tool_calls.labels(name, done.result.status).inc()  # a subagent tool: always one offered
        return types.Outcome(call, result, None)

    async def _attachments(self, claim: claims.Claim, bound: list[str], result: ToolResult) -> list[dict[str, Any]]:
        """References for a tool message: the files a session tool's `attachmentsProperty` names, and the files a
        tool returned, stored under `/attachments/` (§9)."""
        if not bound and not result.attachments:
            return []
        refs: list[dict[str, Any]] = []
        async with self._tx(claim) as (session, thread):
            for path in bound:
                with contextlib.suppress(errors.AgentsError):  # checked before; a racing delete leaves it out
                    refs.append(attachments.reference(await files.stat(session, thread.id, path)))
            refs += await attachments.returned(session, thread.id, result.attachments)
        return refs
