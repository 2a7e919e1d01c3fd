"""Subagent tools (§6.2–§6.4): what the model is offered, and what calling one does.

A call runs in one fenced transaction of the parent: it creates the child (or addresses an existing one), copies the
attachments parent → child, queues the child's input, and either answers at once (non-blocking) or parks the parent
as `waiting` on that child (blocking) — the parent's execution then ends and holds no worker and no lease; the
child's `report` (`app/children.py`) wakes it with the result.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession

from app import children, errors, events, files, tables, threads, variable_requests
from app.catalog import Catalog
from app.engine import tool_arguments, types
from app.spec.definitions import AgentDefinition, PromptDefinition, Side, ToolEntry
from app.spec.messages import ToolCall
from app.spec.results import ToolResult

CREATE = "subagent_create"
MESSAGE = "subagent_message"
KINDS = frozenset({"subagent", CREATE, MESSAGE})
LIMIT = (
    'Subagent instance limit reached for "{agent}" ({limit}). Use subagent_message with an existing reference '
    "instead. Active references: {ids}"
)
INACTIVE = 'Subagent reference "{id}" is not active.'
QUEUED = "The message was queued for the subagent. Reference: {id}"
PATHS = {"type": "array", "items": {"type": "string"}, "description": "paths of files of this thread to hand over"}


@dataclass(frozen=True)
class Parked:
    """The parent waits on `child` (a blocking call): nothing is answered now."""

    child: uuid.UUID


@dataclass(frozen=True)
class Answered:
    """The call's result now; `child` is the subagent it concerns, if one was reached."""

    result: ToolResult
    child: uuid.UUID | None = None


def available(entry: ToolEntry, env: types.Env | None) -> bool:
    """Whether the entry is available to a step that resolves `env` (`ToolEntry.enabled`, §6.6)."""
    if env is None:
        return entry.optional is None

    def value(name: str) -> str | None:
        try:
            return env.get(name)
        except LookupError:
            return None

    return entry.enabled(value)


def _targets(
    catalog: Catalog, prompt: PromptDefinition, env: types.Env | None = None
) -> list[tuple[ToolEntry, AgentDefinition]]:
    """The prompt's available subagent entries: agents of type `dual_ai` (an `ai_human` agent is a handoff)."""
    found = []
    for entry in prompt.tool_entries():
        agent = catalog.agents.get(entry.name)
        dual = agent is not None and catalog.kind_of(entry.name) == "agent" and agent.type == "dual_ai"
        if dual and agent is not None and available(entry, env):
            found.append((entry, agent))
    return found


def _schema(catalog: Catalog, agent: AgentDefinition) -> dict[str, Any]:
    """The child's side A prompt's `requiredSchema`, else `{message, attachments?}` (§6.2)."""
    prompt = catalog.prompts[agent.side_a.prompt]
    if prompt.required_schema is not None:
        return prompt.schema_for_tool()
    return {
        "type": "object",
        "properties": {"message": {"type": "string"}, "attachments": PATHS},
        "required": ["message"],
        "additionalProperties": False,
    }


def _arguments_problem(catalog: Catalog, agent: AgentDefinition, arguments: dict[str, Any]) -> str | None:
    """What is wrong with a non-resumable subagent call's arguments by the schema it is offered with (§6.2)."""
    prompt = catalog.prompts[agent.side_a.prompt]
    if prompt.required_schema is not None:
        return tool_arguments.prompt_problem(prompt, arguments)
    return tool_arguments.shape_problem(_schema(catalog, agent), arguments)


def live(rows: list[tables.Thread], agent: str) -> list[tables.Thread]:
    """The parent's live (not terminated) children of `agent`, among its children `rows`: what `max_instances`
    counts (§6.3)."""
    return [c for c in rows if c.agent == agent and c.terminated_at is None]


def at_cap(
    catalog: Catalog, prompt: PromptDefinition, env: types.Env | None, rows: list[tables.Thread]
) -> frozenset[str]:
    """The prompt's resumable subagents whose live instances (among the parent's children `rows`) reached their
    `max_instances`: no longer offered for creation (skill guide 0.14.1: "when reached the tool is hidden and new
    messages route to existing instances")."""
    return frozenset(
        agent.name
        for entry, agent in _targets(catalog, prompt, env)
        if entry.resumable
        and entry.resumable.max_instances is not None
        and len(live(rows, agent.name)) >= entry.resumable.max_instances
    )


def offered(
    catalog: Catalog, prompt: PromptDefinition, env: types.Env | None = None, full: frozenset[str] = frozenset()
) -> list[types.OfferedTool]:
    """Non-resumable subagents as tools named after them; resumable ones behind `subagent_create` (those not in
    `full`, the ones `at_cap`; without any left, no `subagent_create`) and `subagent_message`."""
    tools: list[types.OfferedTool] = []
    resumable: list[str] = []
    for entry, agent in _targets(catalog, prompt, env):
        if entry.resumable:
            resumable.append(agent.name)
            continue
        tools.append(
            types.OfferedTool(agent.name, "subagent", entry, agent.tool_description or "", _schema(catalog, agent))
        )
    creatable = [name for name in resumable if name not in full]
    if creatable:
        names = ", ".join(f"`{n}` ({catalog.agents[n].tool_description})" for n in creatable)
        create = {
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": creatable},
                "message": {"type": "string"},
                "attachments": PATHS,
                "name": {"type": "string", "description": "a name for this instance"},
            },
            "required": ["agent", "message", "attachments"],
            "additionalProperties": False,
        }
        tools.append(types.OfferedTool(CREATE, CREATE, ToolEntry(name=CREATE), f"Start a subagent: {names}.", create))
    if resumable:
        send = {
            "type": "object",
            "properties": {"referenceId": {"type": "string"}, "message": {"type": "string"}, "attachments": PATHS},
            "required": ["referenceId", "message", "attachments"],
            "additionalProperties": False,
        }
        tools.append(
            types.OfferedTool(
                MESSAGE, MESSAGE, ToolEntry(name=MESSAGE), "Send a message to a subagent you started.", send
            )
        )
    return tools


def _error(text: str) -> Answered:
    return Answered(types.error(text))


async def _check_paths(session: AsyncSession, thread_id: uuid.UUID, paths: Any) -> list[str] | Answered:
    """The attachment paths of a call, each a file of the parent, or an error result naming what is wrong."""
    if paths is None:
        return []
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return _error("`attachments` must be a list of file paths")
    missing = []
    for path in paths:
        try:
            entry = await files.stat(session, thread_id, path)
        except errors.AgentsError:
            entry = None
        if entry is None or entry.is_dir:
            missing.append(path)
    return _error(tool_arguments.missing_attachments(missing)) if missing else list(paths)


async def call(
    session: AsyncSession,
    catalog: Catalog,
    parent: tables.Thread,
    side: Side,
    prompt: PromptDefinition,
    tool: types.OfferedTool,
    call: ToolCall,
    env: types.Env | None,
    fernet: Fernet,
    *,
    nonblocking: bool = False,
    group: uuid.UUID | None = None,
) -> Answered | Parked:
    """Run a subagent tool call inside the parent's fenced transaction; `nonblocking` (inside a subprompt step,
    §7.4) answers at once whatever the entry says, and the child's result arrives later as a message. A child it
    creates joins spawn `group` (the children one answer creates share one)."""
    waiting = None if nonblocking else await children.waiting_on(session, parent.id, call["id"])
    if waiting is not None:  # the call was made before a crash: keep waiting on the same child
        await threads.set_status(session, parent, threads.Status.WAITING)
        return Parked(waiting.id)
    try:
        arguments = tool_arguments.parse_arguments(call["function"]["arguments"])
    except ValueError as exc:
        return _error(f"Invalid arguments for tool `{tool.name}`: {exc}")
    if tool.kind == MESSAGE:
        return await _message(session, parent, tool, call, arguments, nonblocking)
    if tool.kind == CREATE:
        name = arguments.get("agent")
        target = next(((e, a) for e, a in _targets(catalog, prompt, env) if a.name == name and e.resumable), None)
        if target is None:
            return _error(f"`agent` must be one of the resumable subagents offered: {name!r} is not")
        entry, agent = target
        if not isinstance(arguments.get("message"), str):
            return _error("`message` must be a string")
        content, paths_arg, label = arguments["message"], arguments.get("attachments"), arguments.get("name")
        limit = entry.resumable.max_instances if entry.resumable else None
        if limit is not None:  # a call made while the cap hid the tool (a stale call, a queued one) is refused
            running = live(await children.listed_by_id(session, parent.id), agent.name)
            if len(running) >= limit:
                ids = ", ".join(str(c.id) for c in running)
                return _error(LIMIT.format(agent=agent.name, limit=limit, ids=ids))
    else:
        entry, agent = tool.entry, catalog.agents[tool.name]
        problem = _arguments_problem(catalog, agent, arguments)
        if problem is not None:  # as a callable's: nothing is created, the model may call again (§6.2)
            return _error(f"Invalid arguments for tool `{tool.name}`: {problem}")
        prop = entry.init_user_message_property or "message"
        value = arguments.get(prop)
        content = value if isinstance(value, str) else json.dumps(arguments)
        paths_arg = arguments.get(entry.init_attachments_property or "attachments")
        label = arguments.get(entry.init_agent_name_property) if entry.init_agent_name_property else None
    paths = await _check_paths(session, parent.id, paths_arg)
    if isinstance(paths, Answered):
        return paths
    name = str(label) if isinstance(label, str | int | float) and str(label) else None
    blocking = entry.blocking and not nonblocking
    creation = children.Creation(
        agent.name, entry, side, content, blocking=blocking, paths=paths, name=name, spawn_group_id=group
    )
    required, missing = await children.missing_scoped(session, catalog, fernet, parent, agent.name, {})
    if missing:  # nothing is created: the values come through the bootstrap routes (§6.7)
        request = await variable_requests.create(session, fernet, parent, agent.name, required, missing, creation)
        return Answered(_env_required(parent, agent.name, request))
    child = await children.start(session, catalog, fernet, parent, creation)
    return await _wait_or_answer(session, parent, child, call, tool, children.CREATED.format(id=child.id), blocking)


def _env_required(parent: tables.Thread, agent: str, request: tables.VariableRequest) -> ToolResult:
    endpoint = f"/threads/{parent.id}/variables/{request.id}"
    data = {
        "request_id": str(request.id),
        "endpoint": endpoint,
        "required": request.required,
        "missing": request.missing,
        "agent": agent,
    }
    text = children.ENV_REQUIRED.format(agent=agent, parent=parent.id, request=request.id)
    return ToolResult(status="error", error=text, error_code="subagent_env_required", error_data=data)


async def _message(
    session: AsyncSession,
    parent: tables.Thread,
    tool: types.OfferedTool,
    call: ToolCall,
    arguments: dict[str, Any],
    nonblocking: bool,
) -> Answered | Parked:
    """`subagent_message`: queue a message into a live resumable child of this parent."""
    reference = arguments.get("referenceId")
    child = None
    try:
        child = await session.get(tables.Thread, uuid.UUID(str(reference)), with_for_update={"key_share": True})
    except ValueError:
        child = None
    if child is None or child.parent_id != parent.id or child.terminated_at is not None or not child.resumable:
        return _error(INACTIVE.format(id=reference))
    if not isinstance(arguments.get("message"), str):
        return _error("`message` must be a string")
    paths = await _check_paths(session, parent.id, arguments.get("attachments"))
    if isinstance(paths, Answered):
        return paths
    refs = await children.copy_files(session, parent.id, paths, child.id)
    role = "assistant" if child.receives_messages == "side_b" else "user"
    await children.send(session, child, role, arguments["message"], refs)
    blocking = child.blocking and not nonblocking
    return await _wait_or_answer(session, parent, child, call, tool, QUEUED.format(id=child.id), blocking)


async def _wait_or_answer(
    session: AsyncSession,
    parent: tables.Thread,
    child: tables.Thread,
    call: ToolCall,
    tool: types.OfferedTool,
    text: str,
    blocking: bool,
) -> Answered | Parked:
    if not blocking:
        return Answered(ToolResult(status="success", result=text), child.id)
    child.parent_call_id = call["id"]
    child.parent_call_name = tool.name
    child.parent_call_at = datetime.now(UTC)  # the call's log row, written with its result, runs from here
    await threads.set_status(session, parent, threads.Status.WAITING)
    await children.announce(session, child)
    return Parked(child.id)


STARTED = "You were started automatically by your parent thread."


def _instances(entry: ToolEntry, env: types.Env, limit: int | None) -> list[dict[str, Any]]:
    """The groups of an `immediate` entry: one for `true`; for the object form, instance 1 reads the scoped names
    as they are and instance k reads `NAME__k` while the first of them is defined (§6.6)."""
    config = entry.immediate
    if config is True:
        return [{"k": 1, "scoped": {}, "secret": [], "name": None, "description": None}]
    if not config:
        return []
    groups: list[dict[str, Any]] = []
    names = list(config.scoped_env)
    k = 1
    while limit is None or k <= limit:
        suffix = "" if k == 1 else f"__{k}"

        def value(name: str | None, suffix: str = suffix) -> str | None:
            if name is None:
                return None
            try:
                return env.get(name + suffix)
            except LookupError:
                return None

        if k > 1 and (not names or value(names[0]) is None):
            break
        scoped = {n: v for n in names if (v := value(n)) is not None}
        secret = [n for n in scoped if env.is_secret(n + suffix)]  # a secret stays one under its plain name
        name, description = value(config.name_env), value(config.description_env)
        groups.append({"k": k, "scoped": scoped, "secret": secret, "name": name, "description": description})
        if not names:
            break
        k += 1
    return groups


async def spawn_immediate(
    session: AsyncSession,
    catalog: Catalog,
    fernet: Fernet,
    parent: tables.Thread,
    side: Side,
    prompt: PromptDefinition,
    env: types.Env,
) -> int:
    """Start the prompt's `immediate` subagents that have no instance yet (non-blocking, §6.6); how many started."""
    started = 0
    existing = None
    for entry, agent in _targets(catalog, prompt, env):
        if not entry.immediate:
            continue
        limit = entry.resumable.max_instances if entry.resumable else None
        group_id = uuid.uuid4() if entry.immediate is not True else None  # the instances of one fan-out
        for group in _instances(entry, env, limit):
            tag = f"immediate:{agent.name}:{group['k']}"
            if existing is None:
                existing = {t for c in await children.listed_by_id(session, parent.id) for t in c.tags}
                existing |= await variable_requests.tags(session, parent.id)
            if tag in existing:
                continue
            name = group["name"] or (agent.name if group["k"] == 1 else f"{agent.name}__{group['k']}")
            description = group["description"] or agent.tool_description or agent.description
            text = (STARTED + "\n\n" + (description or "")).strip()
            creation = children.Creation(
                agent.name,
                entry,
                side,
                text,
                blocking=False,
                name=name,
                description=description,
                silent=True,
                tags=[tag],
                scoped_env=group["scoped"],
                scoped_secret=group["secret"],
                spawn_group_id=group_id,
            )
            required, missing = await children.missing_scoped(
                session, catalog, fernet, parent, agent.name, group["scoped"]
            )
            if missing:  # no child yet: the values come through the bootstrap routes (§6.7)
                request = await variable_requests.create(
                    session, fernet, parent, agent.name, required, missing, creation
                )
                existing.add(tag)
                data = _env_required(parent, agent.name, request).error_data
                await events.append(session, parent.id, "event", {"event_type": "subagent_env_required", "data": data})
                continue
            await children.start(session, catalog, fernet, parent, creation)
            started += 1
    return started
