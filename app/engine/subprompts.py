"""Subprompts (`semantics.md` §7.2): a prompt called as a tool runs one step — one LLM call and the tools it
returns — in the caller's thread.

Its messages (a first `user` message, the answer, the results of its tool calls) are stored one level deeper than
the message that made the call (`depth + 1`, `parent_id` = that message), so listings leave them out unless `depth`
asks. It sees the chat (depth 0) only with `include_chat`, earlier tool traffic only with `include_past_tools`.

Crash safety: every message of a run is tagged (`metadata.subprompt_call`, `metadata.subprompt_run`) with the tool
call it runs in and the execution that ran it. A crash leaves that call unanswered and the resumed step runs it
again; the new run first deletes what runs of the same call by earlier executions stored (and what their nested
subprompts stored), so nothing is duplicated, and ends the non-blocking children they started: terminated, and what
they said to the thread taken back (the rerun starts its own). Runs of one execution keep each other's messages.

The result, sections joined by a blank line, each present when its flag is on and it has something to say:

    <the final text>                                           include_text_response

    Tool calls:                                                include_tool_calls (successful calls)
    - add {"a": 1, "b": 2} → 3

    Errors:                                                    include_errors (failed calls)
    - explode {} → Tool `explode` failed: RuntimeError: kaboom

A failed LLM call (after retries and fallbacks) is an error result, `Subprompt `<name>` failed: <error>` (the
error text only with `include_errors`), and the calling step goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import attachments, children, control, errors, event_types, events, files, messages, tables
from app.catalog import Catalog
from app.engine import calls, child_tools, context, hooks, pipeline, results, tool_arguments, tools, transcript, types
from app.engine.state import RunState
from app.llm.base import ProviderError
from app.spec.definitions import PromptDefinition, Side, SideConfig, ToolEntry
from app.spec.messages import LLMMessage, ToolCall
from app.spec.results import ToolResult

MAX_DEPTH = 8  # subprompts calling subprompts: a prompt that offers itself must not recurse forever
_CHAT_ONLY = 2**62  # a turn start after every message: the whole chat is "earlier turns" to a subprompt


class Runner:
    """Runs the subprompt steps of one engine (it makes their LLM calls with the engine's caller)."""

    def __init__(self, catalog: Catalog, caller: calls.Caller, max_steps: int, concurrency: int = 8) -> None:
        self._catalog = catalog
        self._caller = caller
        self._max_steps = max_steps  # the session's step cap (§3), which a subprompt's step counts toward
        self._concurrency = concurrency  # `TOOL_CONCURRENCY`: its callables at once, with `parallel_tool_calls`

    async def run(self, state: RunState, entry: ToolEntry, arguments: dict[str, Any]) -> ToolResult:
        """One step of prompt `entry.name` for the tool call `state.execution.tool_call_id`; its tool result."""
        name = entry.name
        prompt = self._catalog.prompts[name]
        problem = tool_arguments.prompt_problem(prompt, arguments)
        if problem is not None:
            return types.error(f"Invalid arguments for tool `{name}`: {problem}")
        prop = entry.init_attachments_property or "attachments"  # the default, as a subagent's (§6.2, §7.2)
        paths = arguments.get(prop)
        paths = [paths] if isinstance(paths, str) else paths or []
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            return types.error(f"Invalid arguments for tool `{name}`: `{prop}` must be paths")
        execution = state.execution
        assert execution is not None
        side = execution.side
        sub_state = state.in_subprompt(prompt)  # the subprompt's own `env` layer
        shared = sub_state.shared
        env = shared.env
        offered = {
            t.name: t
            for t in context.offered_tools(self._catalog, prompt, SideConfig(prompt=name), env)
            if t.kind != "handoff"  # a step inside a step cannot hand the thread over
        }
        async with shared.transaction() as (session, thread):
            call_id = execution.tool_call_id
            parent = await messages.holding(session, thread.id, call_id) if call_id is not None else None
            depth = parent.depth + 1 if parent is not None else 1
            if depth > MAX_DEPTH:
                return types.error(f"Subprompt `{name}` not run: subprompts nest at most {MAX_DEPTH} deep")
            refs, missing = await _references(session, thread.id, paths)
            if missing:
                return types.error(
                    f"Provided attachment path(s) not found in this thread: {', '.join(missing)}. Use an exact "
                    "/attachments/... path that exists in this thread, then try again."
                )
            if thread.session_steps >= self._max_steps:  # the next step of the caller ends the session (§3)
                return types.error(
                    f"Subprompt `{name}` not run: the session reached its cap of {self._max_steps} steps"
                )
            run = hashlib.sha256((thread.lease_token or uuid.UUID(int=0)).bytes).hexdigest()[:16]
            forgotten = await messages.forget_runs(session, thread.id, execution.tool_call_id or "", run)
            await _end_children(
                session, thread, [c for c, tool in forgotten.reached.items() if tool != child_tools.MESSAGE]
            )
            rerun = forgotten.count > 0
            tags: dict[str, Any] = {
                "depth": depth,
                "parent_id": parent.id if parent is not None else None,
                "session_number": thread.session_number,
                "metadata_": {"subprompt_call": execution.tool_call_id, "subprompt_run": run},
            }
            # its messages go through the hooks of its own prompt (§10), inside this transaction
            inside = sub_state.hooks_of(prompt, hooks.Joined(session, thread))
            rows = [r for r in await messages.history(session, thread.id) if r.depth == 0]
            config = SideConfig(prompt=name)
            try:
                request = await pipeline.request(
                    session, thread, self._catalog, prompt, config, side, rows, _CHAT_ONLY, env, inside
                )
            except types.MissingVariable as exc:
                return types.error(f"Subprompt `{name}` failed: {exc}")
            if not rerun:  # the step runs: it is one of the session's (an interrupted run of it counted already)
                thread.session_steps += 1
            user = {"side": "b" if side == "a" else "a", "content": _first_message(entry, arguments), **tags}
            asked = await messages.add(
                session,
                thread.id,
                "user",
                attachments=refs,
                **hooks.tagged(await inside.before_create_message("user", user), tags),
            )
            await inside.after_create_message(asked)
            first = LLMMessage("user", transcript.described(asked.content, refs))
            if self._catalog.models[prompt.model].capabilities.supports_images:
                first.images = transcript.images(refs)
            request.messages.append(first)  # the ask, after the history and the registry
            await calls.inline_images(session, thread.id, [first])
            request.tools = [t for t in request.tools if t.name in offered]
            pending = await pipeline.pending(session, thread, prompt, side, inside, tags=tags)
        assert shared.partial is not None, "subprompts run inside an execution, which stores partial text"
        result = await self._caller.call(
            shared.transaction, thread.id, pending.id, prompt, request, env, depth, defer=True, partial=shared.partial
        )
        async with shared.transaction() as (session, thread):
            message = await messages.get(session, thread.id, pending.id)
            inside = sub_state.hooks_of(prompt, hooks.Joined(session, thread))
            answered = await pipeline.store(session, message, result, config, inside, tags=tags)
            if answered is None:
                assert isinstance(result.response, ProviderError)
                detail = f": {result.response.message}" if entry.include_errors else ""
                return types.error(f"Subprompt `{name}` failed{detail}")
        outcomes = await self._tools(sub_state, prompt, offered, list(answered.tool_calls), side, tags)
        # its final text as stored: what a `before_update_message` hook made of the answer
        return ToolResult(status="success", result=shape(entry, message.content or "", outcomes))

    async def _tools(
        self,
        state: RunState,
        prompt: PromptDefinition,
        offered: dict[str, types.OfferedTool],
        made: list[ToolCall],
        side: Side,
        tags: dict[str, Any],
    ) -> list[types.Outcome]:
        """Run the calls of the subprompt's answer — at once when its prompt sets `parallel_tool_calls` (callables
        up to `TOOL_CONCURRENCY`), else one after another — and store each result beside the answer, in the order
        of the calls."""
        bound = asyncio.Semaphore(self._concurrency if prompt.parallel_tool_calls else 1)

        async def one(call: ToolCall) -> types.Outcome | tuple[types.Outcome, float]:
            async with bound:
                return await self._run_call(state, prompt, offered, call, side, tags)

        if not prompt.parallel_tool_calls:
            ran = [await one(call) for call in made]
            return [await self._store_call(state, prompt, side, tags, r) for r in ran]
        runs = [asyncio.ensure_future(one(call)) for call in made]
        try:
            return [await self._store_call(state, prompt, side, tags, await running) for running in runs]
        finally:  # the execution's cancellation (a stop, a lost lease) cancels them all
            for running in runs:
                running.cancel()
            await asyncio.gather(*runs, return_exceptions=True)

    async def _run_call(
        self,
        state: RunState,
        prompt: PromptDefinition,
        offered: dict[str, types.OfferedTool],
        call: ToolCall,
        side: Side,
        tags: dict[str, Any],
    ) -> types.Outcome | tuple[types.Outcome, float]:
        """Run one tool call of the subprompt's answer (its events carry the depth, so streams that leave deeper
        messages out leave them out too): a callable's outcome and how long it ran, to store; a subagent call runs
        non-blocking (§7.4), answered and stored in one transaction (the child's result arrives later as a message
        to the thread)."""
        name = call["function"]["name"]
        data = event_types.ToolStarted(tool=name, tool_call_id=call["id"], depth=tags["depth"])
        tool = offered.get(name)
        shared = state.shared
        if tool is not None and tool.kind in child_tools.KINDS:
            async with shared.transaction() as (session, thread):
                await events.append(session, thread.id, "tool_started", data)
                started = time.perf_counter()
                done = await child_tools.call(
                    session,
                    self._catalog,
                    thread,
                    side,
                    prompt,
                    tool,
                    call,
                    shared.env,
                    shared.fernet,
                    nonblocking=True,
                )
                assert isinstance(done, child_tools.Answered)  # a non-blocking call never parks
                self._caller.meter.tool_call(name, done.result.status, offered)
                latency_ms = round((time.perf_counter() - started) * 1000, 2)
                result, _ = await self._store(
                    session, thread, state, prompt, call, side, tags, done.result, latency_ms, done.child
                )
            return types.Outcome(call, result, None)
        async with shared.transaction() as (session, thread):
            await events.append(session, thread.id, "tool_started", data)
        started = time.perf_counter()
        outcome = await tools.execute(self._catalog, offered, call, state)
        latency_ms = round((time.perf_counter() - started) * 1000, 2)
        self._caller.meter.tool_call(name, outcome.result.status, offered)
        return replace(outcome, result=calls.scrub_result(outcome.result, shared.env.secrets())), latency_ms

    async def _store_call(
        self,
        state: RunState,
        prompt: PromptDefinition,
        side: Side,
        tags: dict[str, Any],
        ran: types.Outcome | tuple[types.Outcome, float],
    ) -> types.Outcome:
        """Store a callable's result beside the answer, through the tool hooks (a subagent's is stored already)."""
        if isinstance(ran, types.Outcome):
            return ran
        outcome, latency_ms = ran
        async with state.shared.transaction() as (session, thread):
            result, row = await self._store(
                session, thread, state, prompt, outcome.call, side, tags, outcome.result, latency_ms, None
            )
        if row is not None and row.attachments:  # its files are named in the result, as a message's are
            text = transcript.described(result.text, row.attachments)
            result = result.model_copy(update={"error": text} if result.status == "error" else {"result": text})
        return replace(outcome, result=result)

    async def _store(
        self,
        session: AsyncSession,
        thread: tables.Thread,
        state: RunState,
        prompt: PromptDefinition,
        call: ToolCall,
        side: Side,
        tags: dict[str, Any],
        result: ToolResult,
        latency_ms: float,
        child: uuid.UUID | None,
    ) -> tuple[ToolResult, tables.Message | None]:
        """`results.store` with the subprompt's own tool hooks, inside the transaction of `session`."""
        inside = state.hooks_of(prompt, hooks.Joined(session, thread))
        secrets = state.shared.env.secrets()
        return await results.store(
            session, thread, inside, call, result, side, latency_ms=latency_ms, secrets=secrets, child=child, tags=tags
        )


async def _end_children(session: AsyncSession, thread: tables.Thread, started: list[uuid.UUID]) -> None:
    """The children an interrupted run started, ended with it: terminated (with theirs) without a word to the
    thread, and what they said to it already taken back. Nothing the thread keeps names them any more (the rerun
    starts its own), so their work and their reports would reach the model as from nowhere, twice over."""
    if not started:
        return
    for child_id in started:
        child = await session.get(tables.Thread, child_id, with_for_update=control.NKU)
        if child is not None:
            await control.terminate(session, child, quiet=True)
    await children.withdraw(session, thread.id, started)


def shape(entry: ToolEntry, text: str, outcomes: list[types.Outcome]) -> str:
    """The result text of a subprompt run, as the module docstring describes it."""
    sections = []
    if entry.include_text_response and text.strip():
        sections.append(text.strip())
    done = [_line(o) for o in outcomes if o.result.status == "success"]
    failed = [_line(o) for o in outcomes if o.result.status != "success"]
    if entry.include_tool_calls and done:
        sections.append("Tool calls:\n" + "\n".join(done))
    if entry.include_errors and failed:
        sections.append("Errors:\n" + "\n".join(failed))
    return "\n\n".join(sections)


def _line(outcome: types.Outcome) -> str:
    function = outcome.call["function"]
    arguments = json.dumps(outcome.arguments) if outcome.arguments is not None else function["arguments"]
    return f"- {function['name']} {arguments} → {outcome.result.text}"


def _first_message(entry: ToolEntry, arguments: dict[str, Any]) -> str:
    """The subprompt's first `user` message: the argument `init_user_message_property` names (default `message`),
    or, if the arguments have no such property, all of them as JSON."""
    value = arguments.get(entry.init_user_message_property or "message")
    if value is None:
        return json.dumps(arguments)
    return value if isinstance(value, str) else json.dumps(value)


async def _references(session: AsyncSession, thread_id: uuid.UUID, paths: list[str]) -> tuple[list[Any], list[str]]:
    """Attachment references for `paths`, and the paths that name no file of the thread."""
    refs, missing = [], []
    for path in paths:
        try:
            entry = await files.stat(session, thread_id, path)
        except (errors.FileNotFound, errors.BadPath):
            missing.append(path)
            continue
        if entry.is_dir:
            missing.append(path)
        else:
            refs.append(attachments.reference(entry))
    return refs, missing
