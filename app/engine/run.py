"""The step loop: deliver input, call the model, run the tools, evaluate stops (`semantics.md` §2–§5).

Each execution holds the thread's lease; every transaction it commits is fenced by the lease token, and no
transaction spans an LLM call or a tool call. The phases live next door: `inbox` (delivery per inbox kind), `turns`
(who acts, where a turn starts, how it ends), `step` (what a step is between its transactions), `calls` (the model),
`tool_phase` (a step's tool calls: announced, run, recorded), `tools` (one tool call), `stops` (what ends a turn or a
session), `history` (the messages kept between steps).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

import httpx
from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import claims, control, errors, events, masking, messages, queue, tables, threads, tracing
from app.catalog import Catalog
from app.engine import (
    calls,
    child_tools,
    context,
    effect_runs,
    handoffs,
    hooks,
    inbox,
    pipeline,
    stops,
    subprompts,
    turns,
    types,
)
from app.engine.history import Histories, History
from app.engine.state import prepare_hooks
from app.engine.step import OPEN_ON_ITS_OWN, RELEASED, Answered, Opened, OpenOnItsOwn, Released
from app.engine.tool_phase import Closed, Prepared, ToolPhase
from app.engine.transactions import Transactions
from app.hub import Publisher
from app.llm import retry, transport
from app.llm.base import LLMResponse, ProviderError
from app.metrics import Meter
from app.settings import Settings
from app.spec.definitions import AgentDefinition, PromptDefinition, Side, SideConfig

log = logging.getLogger(__name__)


def llm_http() -> httpx.AsyncClient:
    """The HTTP client the provider adapters share (`llm.transport.client`)."""
    return transport.client()


class Engine:
    """Runs claimed threads."""

    def __init__(
        self,
        settings: Settings,
        sessions: async_sessionmaker[AsyncSession],
        catalog: Catalog,
        publisher: Publisher,
        fernet: Fernet,
        http: httpx.AsyncClient,
        meter: Meter,
    ) -> None:
        self._settings = settings
        self.meter = meter
        self._sessions = sessions
        self._catalog = catalog
        self._fernet = fernet
        self.http = http
        self._caller = calls.Caller(
            catalog, publisher, http, retry.Policy.from_settings(settings), settings.process_env, meter
        )
        self._caller.full_requests = settings.log_requests == "full"
        self._contexts: dict[uuid.UUID, dict[str, Any]] = {}  # per execution, by lease token
        self._histories = Histories()  # by thread, kept across its executions (`app/engine/history.py`)
        self._txs = Transactions(sessions, self._histories, self._caller.tallies, meter)
        self._subprompts = subprompts.Runner(
            catalog, self._caller, settings.max_session_steps, settings.tool_concurrency
        )
        self._tools = ToolPhase(
            settings=settings,
            sessions=sessions,
            catalog=catalog,
            fernet=fernet,
            runner=self._subprompts,
            meter=meter,
            transactions=self._txs,
            context=self._context,
        )

    def _tx(self, claim: claims.Claim) -> AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]:
        """A transaction on the thread row, fenced by the claim's lease (`Transactions.fenced`)."""
        return self._txs.fenced(claim)

    async def execute(self, claim: claims.Claim) -> None:
        """Run a claimed thread until it has nothing left to do, then release it; its span continues the trace of
        the message it delivers first (posted over HTTP, `tracing.resumed`), when traces are on."""
        queued: list[tuple[Any, str | None]] = []
        if tracing.enabled():
            async with self._sessions() as session:
                queued = await queue.traced(session, claim.thread_id)
        parent, links = tracing.resumed(queued)
        attributes: tracing.Attributes = {"agents.thread.id": str(claim.thread_id), "agents.attempt": claim.attempt}
        with tracing.span("execute", attributes, context=parent, links=links):
            await self._execute(claim)

    async def _execute(self, claim: claims.Claim) -> None:
        if 1 < claim.attempt <= inbox.MAX_ATTEMPTS:  # a release resets it: the claim before this one never ended
            log.warning(
                "thread %s: its last execution never finished (its worker died or lost the lease); running it "
                "again (attempt %d of %d)", claim.thread_id, claim.attempt, inbox.MAX_ATTEMPTS,
            )  # fmt: skip
        self._contexts[claim.token] = {}
        self._txs.begin(claim)
        self._caller.tallies.of(claim.thread_id)  # the turn's clock, if it started before this execution
        try:
            released = False
            try:
                released = await self._run_all(claim)
            except errors.Aborted:
                raise
            except Exception as exc:
                log.exception("execution of thread %s failed", claim.thread_id)
                await self._fail(claim, "internal_error", f"{type(exc).__name__}: {exc}")
            if not released:
                async with self._tx(claim) as (session, _):
                    await queue.release(session, claim, fenced=True)
        except errors.LeaseLost:
            self.meter.lease_losses.inc()
            log.warning("lost the lease of thread %s; stopping without writing", claim.thread_id)
        except errors.Contention:  # like a crash: what was not committed is redone from what is stored
            log.warning("thread %s hit a lock cycle; handing it back to run again", claim.thread_id)
            with contextlib.suppress(errors.Aborted):
                async with self._tx(claim) as (session, _):
                    await queue.release(session, claim, again=True, keep_attempt=True, fenced=True)
        except errors.Unavailable:
            log.warning("the database is unreachable; thread %s is left to its lease", claim.thread_id)
        finally:
            self._contexts.pop(claim.token, None)
            self._txs.end(claim)
            self._histories.trim(claim.thread_id)

    async def _run_all(self, claim: claims.Claim) -> bool:
        """Run; an input whose delivery fails is set aside (kept, marked, reported) and the rest goes on without it.
        Input is delivered only in a transaction that opens a step and nothing else (`_open_step`), so the failed one's
        rollback undoes nothing but that opening."""
        while True:
            try:
                return await self._run(claim)
            except inbox.DeliveryFailed as exc:
                log.warning("thread %s: input %d could not be delivered; set aside", claim.thread_id, exc.inbox_id)
                async with self._tx(claim) as (session, thread):
                    await queue.set_aside(session, exc.inbox_id, exc.reason)
                    await events.append(session, thread.id, "error", {"code": "input_set_aside", "message": exc.reason})

    def _history(self, thread: tables.Thread) -> History:
        """The thread's messages as this worker keeps them between its steps."""
        return self._histories.of(thread.id)

    def _context(self, thread: tables.Thread) -> dict[str, Any]:
        """`state.context`: one dict for the whole execution (the fenced row carries the claim's token)."""
        assert thread.lease_token is not None
        return self._contexts.setdefault(thread.lease_token, {})

    # -- one execution -------------------------------------------------------------------------------------
    #
    # The steady state of a step is two transactions: one opens it (input delivered, the pending message, the first
    # request announced), one closes it (the answer with its log row, or the last tool result, the stops) and, when
    # the turn goes on, opens the next step — or releases the thread when it ends. Tool calls add one transaction
    # each (its result, and the next call's `tool_started`).

    async def _run(self, claim: claims.Claim) -> bool:
        """Run steps until the turn (and any the other side takes) ends; returns whether the thread was released."""
        step: Opened | Answered | Released | None = await self._open_step(claim, first=True)
        while isinstance(step, Opened | Answered):
            step = await self._step(claim, step)
        return step is RELEASED

    async def _open_step(self, claim: claims.Claim, *, first: bool) -> Opened | Answered | None:
        """Open the next step in a transaction of its own; due effects run first (§10)."""

        async def opening(session: AsyncSession, thread: tables.Thread) -> Opened | Answered | OpenOnItsOwn | None:
            return await self._open_step_in(session, thread, first=first)

        while True:  # its first statement takes the row lock too, when the row is as this execution left it
            opened = await self._txs.written(claim, opening, reads=True)
            if not isinstance(opened, OpenOnItsOwn):
                return opened
            await effect_runs.run_queued(self._catalog, self._fernet, lambda: self._tx(claim), self._sessions)

    async def _after_close(
        self, claim: claims.Claim, step: Answered, closed: Closed
    ) -> Opened | Answered | Released | None:
        """After a step's closing transaction committed: count the step; the step it opened, or one opened apart."""
        self.meter.step(step.agent.name)
        return await self._open_step(claim, first=False) if isinstance(closed, OpenOnItsOwn) else closed

    async def _begin(
        self,
        session: AsyncSession,
        thread: tables.Thread,
        agent: AgentDefinition,
        taken: list[queue.Input] | None,
        held: History | None,
    ) -> tuple[bool, inbox.Delivered]:
        """The start of an execution: the crash budget, input delivered (`taken`: the input already taken, when the
        first look took it; `held`: the history it read with it), the turn it starts or goes on with. Whether it goes
        on, and what the delivery did."""
        if thread.terminated_at is not None or thread.stopped:
            return False, inbox.Delivered()
        if thread.attempt > inbox.MAX_ATTEMPTS + 1:  # it crashed even while failing: its input is what kills it
            await inbox.set_aside_all(session, thread)
            await self._crashed(session, thread)
            return False, inbox.Delivered()
        if thread.attempt > inbox.MAX_ATTEMPTS:
            await self._deliver(session, thread, agent, mid_turn=True, taken=taken)  # keep the input, start nothing
            await self._crashed(session, thread)
            return False, inbox.Delivered()
        # a turn a previous execution left unfinished (a crash, a deploy) is finished first: new input joins it
        # as mid-turn input instead of starting a turn that would abandon it (`semantics.md` §2)
        in_turn = await turns.in_progress(session, thread)
        delivered = await self._deliver(session, thread, agent, mid_turn=in_turn, taken=taken, held=held)
        if delivered.acting is None and thread.status != threads.Status.RUNNING and not in_turn:
            await threads.set_status(session, thread, threads.Status.IDLE)
            return False, delivered
        if delivered.acting is not None:
            turns.start(thread, delivered.acting)
            self._caller.tallies.start(thread.id)
        await threads.set_status(session, thread, threads.Status.RUNNING)
        return True, delivered

    async def _deliver(
        self,
        session: AsyncSession,
        thread: tables.Thread,
        agent: AgentDefinition,
        *,
        mid_turn: bool,
        taken: list[queue.Input] | None = None,
        held: History | None = None,
    ) -> inbox.Delivered:
        return await inbox.deliver(
            session,
            thread,
            agent,
            taken=taken,
            held=held,
            mid_turn=mid_turn,
            catalog=self._catalog,
            fernet=self._fernet,
            context_=self._context(thread),
            meter=self.meter,
        )

    # -- one step ------------------------------------------------------------------------------------------

    def _prompt_of(self, agent: AgentDefinition, side: Side) -> tuple[SideConfig, PromptDefinition]:
        config = agent.side(side)
        assert config is not None, f"agent {agent.name} has no side {side}"
        return config, self._catalog.prompts[config.prompt]

    async def _step(self, claim: claims.Claim, step: Opened | Answered) -> Opened | Answered | Released | None:
        """The LLM call of an open step and the tools it asked for; returns the next step, or how the run ended."""
        attributes: tracing.Attributes = {
            "agents.agent": step.agent.name,
            "agents.step": step.number,
            "agents.side": step.side,
        }
        with tracing.span(f"step {step.number}", attributes):
            return await self._step_in(claim, step)

    async def _step_in(self, claim: claims.Claim, step: Opened | Answered) -> Opened | Answered | Released | None:
        side_config, prompt = self._prompt_of(step.agent, step.side)
        offered = {t.name: t for t in context.offered_tools(self._catalog, prompt, side_config, step.env)}
        prepared: Prepared | None = None
        if isinstance(step, Opened):
            opened = step
            result = await self._caller.call(
                lambda: self._tx(claim),
                claim.thread_id,
                step.message_id,
                prompt,
                step.request,
                step.env,
                opened=step.requests_before,
                defer=True,
                live=True,
                partial=lambda message_id, text: self._txs.partial(claim, message_id, text),
            )
            record = result.record  # written once, by the transaction that commits (`written` may run `answer` twice)
            live = await self._caller.publisher.take(claim.thread_id)  # the last deltas ride with the answer

            async def answer(
                session: AsyncSession, thread: tables.Thread
            ) -> tuple[Answered | None, Closed, Prepared | None]:
                result.record = record
                held = events.notify_first(session, thread.id, live)
                assert held or not live, "the answer's transaction holds the thread's events"
                response = await self._store_response(session, thread, opened, result, side_config)
                if response is None:  # the model failed: the step ended the session
                    return None, None, None
                answered = opened.answered(response)
                if not answered.calls:
                    return answered, await self._close(session, thread, claim, answered, offered, []), None
                first = self._tools.batch(answered.calls, offered, prompt.parallel_tool_calls)
                if all(self._tools.is_subagent(offered, c) for c in first):
                    return answered, None, None
                return answered, None, await self._tools.announce(session, thread, claim, answered, offered, first)

            # the user's hooks of the answer may read through the state: then it runs fenced, once
            reads = bool(hooks.active(self._catalog, step.agent, prompt))
            stored, closed, prepared = await self._txs.written(claim, answer, reads=reads, once=reads)
            if stored is None:
                self.meter.step(step.agent.name)
                return None
            answered = stored
            if not answered.calls:
                return await self._after_close(claim, answered, closed)
        else:
            answered = step

        async def close(session: AsyncSession, thread: tables.Thread, outcomes: list[types.Outcome]) -> Closed:
            return await self._close(session, thread, claim, answered, offered, outcomes)

        done = await self._tools.run(claim, answered, offered, prepared, close, parallel=prompt.parallel_tool_calls)
        if done is None:  # parked on a blocking subagent: the child's result resumes this step
            return None
        return await self._after_close(claim, answered, done.closed)

    async def _close(
        self,
        session: AsyncSession,
        thread: tables.Thread,
        claim: claims.Claim,
        step: Answered,
        offered: dict[str, types.OfferedTool],
        outcomes: list[types.Outcome],
    ) -> Closed:
        """Evaluate the step's stops; open the next step when the turn goes on, else give the thread back."""
        agent, side_config = step.agent, step.config
        thread.attempt = 1  # the step is done: the next one starts with a fresh crash budget
        made_calls = thread.step_open or bool(step.response.tool_calls)  # even calls a hook dropped from it since
        thread.step_open = False
        if not step.response.text.strip() and not made_calls:
            verdict = types.Verdict("turn", "empty_response")
        else:
            verdict = stops.evaluate(
                agent, side_config, step.response, outcomes, thread.turn_steps, made_calls=made_calls
            )
        verdict = handoffs.next_turn(thread, agent.name, offered, outcomes, verdict)
        await events.append(
            session,
            thread.id,
            "step_completed",
            {"step": step.number, "side": step.side, "stopped": verdict.ends != "nothing"},
        )
        await turns.report_status(session, thread, side_config, outcomes)
        if verdict.ends == "turn":
            await events.append(session, thread.id, "turn_ended", {"side": step.side, "reason": verdict.reason})
            thread.session_turns += 1
            owes_result = thread.parent_id is not None and thread.terminal
            ended = verdict.reason
            verdict = stops.session_cap(agent, thread.session_turns, owes_result=owes_result)
            if verdict.ends == "nothing":
                self._turn_ended(thread, str(ended))
                if await turns.after(session, thread, agent, step.side):
                    self._caller.tallies.start(thread.id)  # the other side's turn
                    return await self._open_step_in(session, thread, first=False, merged=True)
                await queue.release_with_events(session, claim, thread)
                return RELEASED
        if verdict.ends == "session":
            await self._end_session(session, thread, verdict)
            await queue.release_with_events(session, claim, thread)
            return RELEASED
        return await self._open_step_in(session, thread, first=False, merged=True)

    async def _open_step_in(
        self, session: AsyncSession, thread: tables.Thread, *, first: bool, merged: bool = False
    ) -> Opened | Answered | OpenOnItsOwn | None:
        """Deliver input, then either resume unanswered tool calls or open a new LLM call and announce its request.
        `first`: the execution's first step (`_begin`). `merged`: inside a closing transaction, which leaves waiting
        input and effects to a transaction of their own."""
        held = self._history(thread)
        taken: list[queue.Input] | None = None  # the input taken with the first look, by an execution that delivers
        read = True  # whether the history must be read (again) before the request is built
        with session.no_autoflush:  # reads that do not depend on the thread row: its changes go in one UPDATE later
            if first and _delivers(thread):  # the input taken with the history (unless effects wait)
                input_waits, effects_wait, taken = await held.take(session, thread)
            elif first:
                input_waits, effects_wait = await queue.waiting(session, thread.id)
            else:  # the history with it, still current below unless input is delivered
                input_waits, effects_wait = await held.rows_and_waiting(session, thread)
                read = input_waits
        if effects_wait or (merged and input_waits):
            return OPEN_ON_ITS_OWN
        agent = self._catalog.agent(thread.agent)  # a handoff may have switched it (§7.3)
        delivered = inbox.Delivered()
        if first:
            going, delivered = await self._begin(session, thread, agent, taken, held if taken is not None else None)
            if not going:
                return None
            read = not delivered.current
        elif input_waits:
            delivered = await self._deliver(session, thread, agent, mid_turn=thread.turn_steps > 0)
            if delivered.acting is not None:  # input between two turns picks who answers it (§2)
                turns.start(thread, delivered.acting)
                self._caller.tallies.start(thread.id)
        side = thread.side or "a"
        side_config, prompt = self._prompt_of(agent, side)
        with session.no_autoflush:  # messages are flushed as written; the thread row's changes can wait
            rows = await held.rows(session, thread) if read else held.current()
            env = await context.load_env(session, self._fernet, self._catalog, thread, prompt)
        if delivered.starts is not None:
            thread.turn_start = delivered.starts.position  # loaded by the history's read, which wrote it
        turn_start = thread.turn_start or 0
        last, missing = turns.open_work(held.since(turn_start), side, turn_start, thread.step_open)
        if last is not None and last.status == messages.Status.COMPLETED:
            # a crash between the model's answer and its tool results, or a subagent's result: run what is left
            response = LLMResponse(text=last.content or "", tool_calls=list(last.tool_calls or []))
            return Answered(side, thread.session_steps, last.id, agent, side_config, env, response, missing)
        redo = last is not None  # a call a crash interrupted (still `pending`): the same step again
        if thread.session_steps >= self._settings.max_session_steps and not redo:
            await self._end_session(
                session, thread, types.Verdict("session", "max_total_steps", threads.SessionStatus.FAILURE)
            )
            return None
        if not redo:
            thread.turn_steps += 1
            thread.session_steps += 1
        # `immediate` subagents start before the prompt's first LLM step (and again after a handoff to it)
        await child_tools.spawn_immediate(session, self._catalog, self._fernet, thread, side, prompt, env)
        hook_runner = await prepare_hooks(
            self._catalog, self._fernet, session, thread, side, env=env, context=self._context(thread)
        )
        try:
            request = await pipeline.request(
                session, thread, self._catalog, prompt, side_config, side, rows, turn_start, env, hook_runner,
                held=held,
            )  # fmt: skip
        except types.MissingVariable as exc:  # the error first: a wait ends on the status that follows
            await events.append(session, thread.id, "error", {"code": "missing_variable", "message": str(exc)})
            await self._end_session(
                session, thread, types.Verdict("session", "llm_error", threads.SessionStatus.FAILURE)
            )
            return None
        if last is not None:  # redo an interrupted call into the same row
            if last not in session:  # held from an earlier transaction of this execution
                last = await messages.get(session, thread.id, last.id)
            await messages.save(session, last, content=None, tool_calls=None, reasoning_content=None)
            message = last
        else:
            message = await pipeline.pending(session, thread, prompt, side, hook_runner)
        await events.append(session, thread.id, "step_started", {"step": thread.session_steps, "side": side})
        made = await calls.announce(session, thread.id, self._catalog.models[prompt.model], 1)
        return Opened(
            side,
            thread.session_steps,
            message.id,
            agent,
            side_config,
            env,
            request,
            requests_before=made,
            message=message,
        )

    # -- how a turn ends ---------------------------------------------------------------------------------------

    def _turn_ended(self, thread: tables.Thread, outcome: str) -> None:
        """Say the turn's line (`tally.Tally.line`) once the transaction that ends it commits (`_tx`)."""
        self._txs.say(thread, lambda tally: tally.line(thread, outcome))

    async def _end_session(self, session: AsyncSession, thread: tables.Thread, verdict: types.Verdict) -> None:
        """End the session, and with it the turn."""
        self._turn_ended(thread, f"{verdict.reason} session={verdict.status}")
        await turns.end_session(session, thread, verdict)

    # -- the model -----------------------------------------------------------------------------------------

    async def _store_response(
        self, session: AsyncSession, thread: tables.Thread, step: Opened, result: calls.Result, side: SideConfig
    ) -> LLMResponse | None:
        """The model's answer (or its failure, which ends the session) into the step's pending message."""
        message = turns.attach_committed(session, step.message) or await messages.get(
            session, thread.id, step.message_id
        )
        hook_runner = await prepare_hooks(
            self._catalog, self._fernet, session, thread, step.side, env=step.env, context=self._context(thread)
        )
        # the answer rides with the transaction's events: nothing reads it back before they are written
        response = await pipeline.store(session, message, result, side, hook_runner, later=True)
        if response is None:  # the model failed: the session ends as a failure
            assert isinstance(result.response, ProviderError)
            await events.append(session, thread.id, "error", {"code": "llm_error", "message": result.response.message})
            await events.append(
                session, thread.id, "step_completed", {"step": step.number, "side": step.side, "stopped": True}
            )
            await self._end_session(
                session, thread, types.Verdict("session", "llm_error", threads.SessionStatus.FAILURE)
            )
            return None
        thread.last_message_at = datetime.now(UTC)
        thread.step_open = bool(response.tool_calls)  # until the step's stops are evaluated
        return response

    async def _crashed(self, session: AsyncSession, thread: tables.Thread) -> None:
        """The same step crashed its worker `inbox.MAX_ATTEMPTS` times: fail the session instead of looping."""
        message = (
            f"The run crashed {inbox.MAX_ATTEMPTS} times at step {thread.session_steps} of session "
            f"{thread.session_number}; the session was failed instead of trying again."
        )
        log.error("thread %s: %s", thread.id, message)
        await control.close_open_work(session, thread, message, "crashed")
        await events.append(session, thread.id, "error", {"code": "crashed", "message": message})
        if thread.session_status == threads.SessionStatus.RUNNING:
            await self._end_session(session, thread, types.Verdict("session", "crashed", threads.SessionStatus.FAILURE))
        else:
            await threads.set_status(session, thread, threads.Status.IDLE)

    async def _fail(self, claim: claims.Claim, code: str, message: str) -> None:
        """End the session after an unexpected error, so no thread is left `running`."""
        async with self._tx(claim) as (session, thread):
            known: list[str] = []
            with contextlib.suppress(errors.AgentsError):  # e.g. a secret the current key cannot decrypt
                known = (await context.load_env(session, self._fernet, self._catalog, thread, None)).secrets()
            text = masking.scrub(message, known)
            await control.close_open_work(session, thread, f"The run failed: {text}", code)
            await events.append(session, thread.id, "error", {"code": code, "message": text})
            if thread.session_status == threads.SessionStatus.RUNNING:
                await self._end_session(
                    session, thread, types.Verdict("session", "crashed", threads.SessionStatus.FAILURE)
                )
            else:
                await threads.set_status(session, thread, threads.Status.IDLE)


def _delivers(thread: tables.Thread) -> bool:
    """Whether an execution's start delivers the thread's input (`Engine._begin`): not terminated nor stopped, and
    not crashed so often that its input is set aside instead."""
    return thread.terminated_at is None and not thread.stopped and thread.attempt <= inbox.MAX_ATTEMPTS + 1
