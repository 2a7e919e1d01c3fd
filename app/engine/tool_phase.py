"""The tool phase of a step: each call announced (`tool_started`) in a fenced transaction, run with its hooks
outside any transaction, and recorded (its result message, log row and `tool_completed`) in the next; a subagent
call is answered, or parks the thread, inside one transaction (§6, §7)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import attachments, children, errors, events, files, logs, messages, queue, tables
from app.catalog import Catalog
from app.engine import calls, child_tools, hooks, results, stops, subprompts, tools, types
from app.engine.state import RunState
from app.engine.step import Prepared, Step
from app.metrics import Meter
from app.settings import Settings
from app.spec.definitions import AgentDefinition, PromptDefinition, Side, SideConfig
from app.spec.messages import ToolCall
from app.spec.results import ToolResult
from app.spec.state import ExecutionState, SubagentEntry


class ToolPhase:
    """Mixed into `Engine`: the parts of it the tool phase uses are declared here."""

    meter: Meter
    _settings: Settings
    _sessions: async_sessionmaker[AsyncSession]
    _catalog: Catalog
    _fernet: Fernet
    _subprompts: subprompts.Runner
    _tx: Callable[[queue.Claim], AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]]
    _context: Callable[[tables.Thread], dict[str, Any]]
    _prompt_of: Callable[[AgentDefinition, Side], tuple[SideConfig, PromptDefinition]]

    @staticmethod
    async def _children(session: AsyncSession, thread: tables.Thread) -> list[SubagentEntry]:
        return [SubagentEntry.model_validate(children.entry(c)) for c in await children.of(session, thread)]

    async def _subagent(self, claim: queue.Claim, step: Step, tool: types.OfferedTool, call: ToolCall) -> Any:
        """A subagent tool call (§6): its result now, or None when the parent parks on a blocking child."""
        name = call["function"]["name"]
        async with self._tx(claim) as (session, thread):
            await events.append(session, thread.id, "tool_started", {"tool": name, "tool_call_id": call["id"]})
            _, prompt = self._prompt_of(self._catalog.agent(thread.agent), step.side)
            started = time.perf_counter()
            done = await child_tools.call(
                session, self._catalog, thread, step.side, prompt, tool, call, step.env, self._fernet
            )
            if isinstance(done, child_tools.Parked):
                return None
            latency_ms = round((time.perf_counter() - started) * 1000, 2)
            # its hooks run as a callable's do, inside this transaction: the call and its answer commit together
            hook_runner = await hooks.prepare(
                self._catalog, self._fernet, session, thread, step.side, env=step.env, context=self._context(thread)
            )
            assert step.env is not None
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
        self.meter.tool_calls.labels(name, done.result.status).inc()  # a subagent tool: always one offered
        return types.Outcome(call, result, None)

    async def _prepare_tool(
        self,
        session: AsyncSession,
        thread: tables.Thread,
        claim: queue.Claim,
        step: Step,
        offered: dict[str, types.OfferedTool],
        call: ToolCall,
    ) -> Prepared:
        """Announce a tool call (`tool_started`) and build the state and hooks it runs with."""
        await events.append(
            session, thread.id, "tool_started", {"tool": call["function"]["name"], "tool_call_id": call["id"]}
        )
        execution = ExecutionState(
            side=step.side,
            step=step.number,
            session=thread.session_number,
            attempt=thread.attempt,
        )
        assert step.env is not None
        state = RunState(
            thread,
            step.env,
            lambda: self._tx(claim),
            execution,
            self._context(thread),
            catalog=self._catalog,
            fernet=self._fernet,
            queue_call=step.calls.append,
            sessions=self._sessions,
            children=await self._children(session, thread),
            subprompts=self._subprompts,
            tool_timeout=self._settings.tool_timeout,
        )
        hook_runner = await hooks.prepare(  # its hooks run between this step's transactions, not inside one
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

    async def _execute_tool(
        self,
        claim: queue.Claim,
        step: Step,
        offered: dict[str, types.OfferedTool],
        call: ToolCall,
        prepared: Prepared,
    ) -> tuple[types.Outcome, dict[str, Any] | None, tables.Log]:
        """Run the tool and its hooks, outside any transaction; returns the outcome, the fields of the result
        message to store (None: an `after_tool_call_*` hook removed the call and its result from history) and the
        call's log row."""
        assert step.env is not None
        state, hook_runner = prepared.state, prepared.hooks
        started = time.perf_counter()
        outcome = await tools.execute(self._catalog, offered, call, state)
        latency_ms = round((time.perf_counter() - started) * 1000, 2)
        self.meter.tool_call(call["function"]["name"], outcome.result.status, offered)
        outcome = replace(outcome, result=calls.scrub_result(outcome.result, step.env.secrets()))  # a tool's echo
        outcome = await tools.check_attachments(step.config, outcome, state)
        result = await hook_runner.after_tool_call(call, outcome.result)
        if result is None:
            return outcome, None, tools.log_row(claim.thread_id, call, outcome.result, latency_ms, step.env.secrets())
        result = await hook_runner.before_store_tool_result(call, result)
        outcome = replace(outcome, result=result)
        logged = tools.log_row(claim.thread_id, call, result, latency_ms, step.env.secrets())
        content, bound = stops.stored_result(step.config, outcome)
        fields: dict[str, Any] = {
            "side": step.side,
            "name": call["function"]["name"],
            "tool_call_id": call["id"],
            "content": content,
        }
        refs = await self._attachments(claim, bound, result)
        if refs:
            fields["attachments"] = refs
        fields = await hook_runner.before_create_message("tool", {**fields, "tool_status": result.status})
        return outcome, fields, logged

    @staticmethod
    async def _record_tool(
        session: AsyncSession,
        thread: tables.Thread,
        call: ToolCall,
        outcome: types.Outcome,
        fields: dict[str, Any] | None,
        logged: tables.Log,
    ) -> tables.Message | None:
        """Store a tool call's result message (or drop the call), its log row, and announce `tool_completed`."""
        row = None
        if fields is None:  # an `after_tool_call_*` hook removed the call and its result from history
            await messages.drop_call(session, thread.id, call["id"])
        else:
            row = await messages.add(session, thread.id, "tool", **fields, session_number=thread.session_number)
            logged.message_id = row.id
        await logs.add(session, logged)  # rides with the transaction's events
        await events.append(
            session,
            thread.id,
            "tool_completed",
            {"tool": call["function"]["name"], "tool_call_id": call["id"], "status": outcome.result.status},
        )
        return row

    async def _attachments(self, claim: queue.Claim, bound: list[str], result: ToolResult) -> list[dict[str, Any]]:
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
