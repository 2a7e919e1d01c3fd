"""Child threads (§6): creating one, the parent's registry of them, and reporting a child's session to its parent.

A child is a thread with `parent_id`; its registry fields (title, description, resumable, blocking, …) live on its
row. When a child's session ends, `report` runs **in the transaction that ends it**: a blocking call the parent waits
on gets a `child_result` inbox row (the parent becomes runnable again), anything else with implicit communication
becomes a silent queued message to the parent. So a crash anywhere in the tree never loses a child's result.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app import (
    attachments,
    crypto,
    environment,
    errors,
    event_types,
    events,
    inputs,
    messages,
    queue,
    statements,
    tables,
    threads,
)
from app.catalog import Catalog
from app.spec.definitions import AgentDefinition, Side, ToolEntry

CREATED = "The subagent was initiated successfully. Reference: {id}"
SUCCESS = "Subagent (reference: {id}) has returned the following result:\n\n{result}"
FAILURE = "Subagent (reference: {id}) has reported a failure:\n\n{result}"
RETURNED = "\n\nThe subagent also returned the following attachment(s):\n\n{paths}"
NOTIFIED = "Subagent (reference: {id}) sent the following message:\n\n{content}"
STOPPED_EARLY = (
    "Subagent execution stopped before completion ({reason}). "
    "It did not call a terminal session tool (sessionStop/sessionFail)."
)
REFERENCE = "\n\nReference: {id}"
ENV_REQUIRED = (
    'Subagent "{agent}" requires scoped environment variables before it can be created. Provide the missing values '
    "via GET/POST /threads/{parent}/variables/{request}."
)


async def create(
    session: AsyncSession,
    parent: tables.Thread,
    *,
    agent: str,
    agent_type: str,
    owner_side: Side,
    title: str | None,
    description: str | None,
    resumable: bool,
    blocking: bool,
    receives_messages: str | None,
    parent_communication: str,
    terminal: bool,
    name: str | None = None,
    scoped: set[str] | None = None,
    instances: set[str] | None = None,
    spawn_group_id: uuid.UUID | None = None,
) -> tables.Thread:
    """A child thread of `parent` with a copy of its thread env: scoped names left out (§6.7), and for the names
    in `instances` (a fan-out's per-instance values, §6.6) the name and every `NAME__k` too."""
    child_id = uuid.uuid4()
    child = tables.Thread(
        id=child_id,
        agent=agent,
        type=agent_type,
        parent_id=parent.id,
        root_id=parent.root_id or parent.id,
        owner_side=owner_side,
        user_id=parent.user_id,
        name=name,
        tags=[f"name:{name}"] if name else [],
        status=threads.Status.IDLE,
        session_number=0,
        title=title,
        description=description,
        resumable=resumable,
        blocking=blocking,
        receives_messages=receives_messages,
        parent_communication=parent_communication,
        terminal=terminal,
        spawn_group_id=spawn_group_id,
    )
    session.add(child)
    await session.flush()
    await session.refresh(child)
    set_committed_value(parent, "has_children", True)  # as the insert's trigger stored it
    await environment.copy_thread(session, parent.id, child.id, scoped or set(), instances or set())
    await events.append_lifecycle(session, child, "thread_created")
    await events.append(session, parent.id, "subagent_created", entry(child))
    return child


async def send(
    session: AsyncSession,
    child: tables.Thread,
    role: str,
    content: str,
    refs: list[dict[str, Any]] | None = None,
    *,
    silent: bool = False,
) -> uuid.UUID:
    """Queue a message into the child (its side A for `user`, side B for `assistant`)."""
    return await messages.enqueue(session, child, role, content, silent=silent, attachments=refs or [])


async def copy_files(
    session: AsyncSession, source: uuid.UUID, paths: list[str], destination: uuid.UUID
) -> list[dict[str, Any]]:
    """Copy files between threads (same blobs), returning destination-local references; a missing path raises
    `FileNotFound` naming it."""
    return [await attachments.copy(session, source, path, destination) for path in paths]


def entry(child: tables.Thread) -> event_types.SubagentEntry:
    """The spec's `SubagentRegistryEntry` (snake_case)."""
    return {
        "reference": str(child.id),
        "name": child.agent,
        "title": child.title,
        "description": child.description,
        "resumable": child.resumable,
        "blocking": child.blocking,
        "thread_name": child.name,
        "spawn_group_id": str(child.spawn_group_id) if child.spawn_group_id else None,
        "created_at": child.created_at.isoformat(),
        "status": threads.registry_status(child),
        "parent_communication": child.parent_communication or "implicit",
    }


_CHILDREN = "SELECT * FROM threads WHERE parent_id = $1 ORDER BY created_at"


async def listed_by_id(session: AsyncSession, parent_id: uuid.UUID) -> list[tables.Thread]:
    """The parent's children, oldest first."""
    found = await (await statements.driver(session)).fetch(_CHILDREN, parent_id)
    return [statements.attach(session, tables.Thread, row) for row in found]


async def listed(session: AsyncSession, parent: tables.Thread) -> list[tables.Thread]:
    """`listed_by_id` for a row the caller read in this transaction: none without a query for a thread that never had
    one (read at every step; most threads never spawn a child)."""
    return await listed_by_id(session, parent.id) if parent.has_children else []


_WAITING_ON = "SELECT * FROM threads WHERE parent_id = $1 AND parent_call_id = $2"


async def waiting_on(session: AsyncSession, parent_id: uuid.UUID, call_id: str) -> tables.Thread | None:
    """The child whose session answers the parent's tool call `call_id`, if one is still running."""
    found = await (await statements.driver(session)).fetchrow(_WAITING_ON, parent_id, call_id)
    return None if found is None else statements.attach(session, tables.Thread, found)


async def announce(session: AsyncSession, child: tables.Thread) -> None:
    """Tell the parent's stream the child's registry entry changed."""
    if child.parent_id is not None:
        await events.append(session, child.parent_id, "subagent_status", entry(child))


async def result_of(session: AsyncSession, child: tables.Thread) -> tuple[bool, str, list[str]]:
    """(succeeded, text, child paths of returned attachments) of the child's session that just ended (§6.4)."""
    result = child.session_result or {}
    if child.session_reason in ("session_stop", "session_fail"):
        paths = [p for p in result.get("attachments") or [] if isinstance(p, str)]
        return child.session_reason == "session_stop", str(result.get("content") or ""), paths
    if child.terminal or child.session_status == threads.SessionStatus.FAILURE:
        return False, STOPPED_EARLY.format(reason=child.session_reason or "unknown"), []
    rows = await messages.history(session, child.id, session_number=child.session_number)
    last = next((r for r in reversed(rows) if r.role != "tool" and r.content and r.depth == 0), None)
    return True, last.content if last is not None and last.content else "", []


async def report(session: AsyncSession, child: tables.Thread, *, failure: str | None = None) -> None:
    """The child's session ended (this transaction ends it): hand its result to the parent, and end a
    non-resumable child for good. `failure` reports that instead (the child is being terminated)."""
    if child.parent_id is None:
        return
    parent = await threads.lock(session, child.parent_id)
    ok, text, paths = (False, failure, []) if failure is not None else await result_of(session, child)
    refs: list[dict[str, Any]] = []
    for path in paths:
        try:
            refs.append(await attachments.copy(session, child.id, path, parent.id))
        except (errors.FileNotFound, errors.FileConflict, errors.BadPath):
            text += f"\n\n(The attachment {path} could not be copied: it is not a file of the subagent.)"
    if child.parent_call_id is not None:  # a blocking call waits: its result ends the wait
        payload = {
            "call_id": child.parent_call_id,
            "name": child.parent_call_name,
            "child_id": str(child.id),
            "status": "success" if ok else "error",
            "content": text + REFERENCE.format(id=child.id),
            "attachments": refs,
            "started_at": child.parent_call_at.isoformat() if child.parent_call_at is not None else None,
        }
        child.parent_call_id = None
        child.parent_call_name = None
        child.parent_call_at = None
        if parent.terminated_at is None:
            await queue.enqueue(session, parent.id, inputs.Kind.CHILD_RESULT, payload)
            if parent.status == threads.Status.WAITING:
                await threads.set_status(session, parent, threads.Status.QUEUED)
    elif child.parent_communication != "explicit" and parent.terminated_at is None:
        body = (SUCCESS if ok else FAILURE).format(id=child.id, result=text)
        if refs:
            body += RETURNED.format(paths="\n".join(r["path"] for r in refs))
        role = "assistant" if child.owner_side == "b" else "user"
        await messages.enqueue(
            session, parent, role, body, silent=True, metadata={"subagent_id": str(child.id)}, attachments=refs
        )
    if not child.resumable and child.terminated_at is None and failure is None:  # one session, then it ends
        child.terminated_at = datetime.now(UTC)
        await events.append(session, child.id, "thread_terminated", {})
        await threads.set_status(session, child, threads.Status.TERMINATED)
    await announce(session, child)


async def withdraw(session: AsyncSession, parent_id: uuid.UUID, children: list[uuid.UUID]) -> None:
    """Take back what these children said to their parent: the messages waiting in its inbox, and those delivered
    already (each removed and announced as `messages.remove` does)."""
    await queue.withdraw(session, parent_id, children)
    for message_id in await messages.speaking_for(session, parent_id, children):
        await messages.remove(session, parent_id, message_id)


async def notify_parent(session: AsyncSession, child: tables.Thread, content: str) -> None:
    """`state.notify_parent`: a silent message to the parent naming the child (§6.4)."""
    if child.parent_id is None:
        raise errors.Invalid("`state.notify_parent` is for subagents: this thread has no parent")
    parent = await threads.lock(session, child.parent_id)
    role = "assistant" if child.owner_side == "b" else "user"
    body = NOTIFIED.format(id=child.id, content=content)
    await messages.enqueue(session, parent, role, body, silent=True, metadata={"subagent_id": str(child.id)})


def terminal(agent: AgentDefinition) -> bool:
    """Whether the agent defines terminal session tools (`sessionStop` / `sessionFail`) on a side."""
    sides = [side for side in (agent.side_a, agent.side_b) if side is not None]
    return any(side.binding("stop") or side.binding("fail") for side in sides)


async def missing_scoped(
    session: AsyncSession,
    catalog: Catalog,
    fernet: Fernet,
    parent: tables.Thread,
    agent: str,
    provided: Mapping[str, str],
) -> tuple[list[str], list[str]]:
    """(required, missing) scoped variables of the child's graph: what the creation provides, the child's own
    definitions and the user's and instance's values count — the parent's thread env does not (§6.7), though the
    copy of it the child gets decides, with them, which `optional` branches of that graph are on (§6.6)."""
    required = sorted({v.name for v in catalog.variables_of_agent(agent) if v.scoped and v.required})
    if not required:
        return [], []
    scoped = {v.name for v in catalog.variables_of_agent(agent) if v.scoped}
    stored = await environment.layers(session, fernet, parent.id, parent.user_id)
    inherited = {name: v.value for name, v in stored.thread.items() if name not in scoped}
    missing = await environment.unresolved(
        session, fernet, catalog, agent, parent.user_id, provided, scoped=True, inherited=inherited
    )
    return required, missing


@dataclass(frozen=True)
class Creation:
    """Everything needed to start one child; stored as a variable request's payload when it must wait (§6.7)."""

    agent: str
    entry: ToolEntry
    side: Side
    content: str
    blocking: bool
    paths: list[str] = field(default_factory=list)
    name: str | None = None
    description: str | None = None
    silent: bool = False
    tags: list[str] = field(default_factory=list)
    scoped_env: dict[str, str] = field(default_factory=dict)
    scoped_secret: list[str] = field(default_factory=list)  # names of `scoped_env` read from secret values
    spawn_group_id: uuid.UUID | None = None

    def payload(self, fernet: Fernet) -> dict[str, Any]:
        """The creation as JSON to store; scoped values read from secrets are stored encrypted (`sealed`)."""
        data = dataclasses.asdict(self)
        data["entry"] = self.entry.model_dump(mode="json")
        data["spawn_group_id"] = str(self.spawn_group_id) if self.spawn_group_id else None
        data["scoped_env"] = {
            name: crypto.encrypt(fernet, value) if name in self.scoped_secret else value
            for name, value in self.scoped_env.items()
        }
        data["sealed"] = True
        return data

    @classmethod
    def of(cls, payload: dict[str, Any], fernet: Fernet) -> Creation:
        fields = dict(payload)
        group = fields.get("spawn_group_id")
        if fields.pop("sealed", False):  # rows stored before secrets were sealed hold them as they were
            secret = set(fields.get("scoped_secret") or ())
            fields["scoped_env"] = {
                name: crypto.decrypt(fernet, value) if name in secret else value
                for name, value in (fields.get("scoped_env") or {}).items()
            }
        fields["entry"] = ToolEntry.model_validate(payload["entry"])
        return cls(**{**fields, "spawn_group_id": uuid.UUID(group) if group else None})


def instance_names(entry: ToolEntry) -> set[str]:
    """The names an `immediate` fan-out reads once per instance (`NAME`, `NAME__2`, …): its `scoped_env`, `name_env`
    and `description_env` (§6.6)."""
    config = entry.immediate
    if isinstance(config, bool):
        return set()
    return {*config.scoped_env, *(n for n in (config.name_env, config.description_env) if n)}


async def start(
    session: AsyncSession,
    catalog: Catalog,
    fernet: Fernet,
    parent: tables.Thread,
    creation: Creation,
    *,
    most: int | None = None,
) -> tables.Thread:
    """Create a child of `parent` for a subagent entry, hand it its files and scoped values (at most `most` values
    in all, when given), and queue its first message (to its side A)."""
    agent = catalog.agent(creation.agent)
    resumable = creation.entry.resumable or None
    scoped = {v.name for v in catalog.variables_of_agent(agent.name) if v.scoped}
    child = await create(
        session,
        parent,
        agent=agent.name,
        agent_type=agent.type,
        owner_side=creation.side,
        title=agent.title,
        description=creation.description or agent.tool_description or agent.description,
        resumable=resumable is not None,
        blocking=creation.blocking,
        receives_messages=resumable.receives_messages if resumable else None,
        parent_communication=resumable.parent_communication if resumable else "implicit",
        terminal=terminal(agent),
        name=creation.name,
        scoped=scoped,
        instances=instance_names(creation.entry),
        spawn_group_id=creation.spawn_group_id,
    )
    if creation.tags:
        child.tags = [*child.tags, *creation.tags]
    if creation.scoped_env:
        secret = (catalog.secret_names(agent.name) | set(creation.scoped_secret)) & set(creation.scoped_env)
        await environment.set_thread(session, fernet, child.id, creation.scoped_env, secret, most=most)
    refs = await copy_files(session, parent.id, creation.paths, child.id)
    await send(session, child, "user", creation.content, refs, silent=creation.silent)
    return child


_OF_PARENT = "SELECT * FROM threads WHERE id = ANY(CAST($1 AS uuid[])) AND parent_id = $2"


async def projections(
    session: AsyncSession, parent_id: uuid.UUID, ids: set[uuid.UUID]
) -> dict[uuid.UUID, dict[str, Any]]:
    """The `subagent_*` fields of the parent's messages that speak for these children, by child id; an id that is
    not a child of the parent projects nothing (a posted `metadata.subagent_id` may name any thread)."""
    if not ids:
        return {}
    found = await (await statements.driver(session)).fetch(_OF_PARENT, list(ids), parent_id)
    return {row["id"]: messages.projection(statements.attach(session, tables.Thread, row)) for row in found}


def registry_message(children: list[tables.Thread]) -> str | None:
    """The system message a parent's model gets after its history when it has children (§6.5), or None."""
    if not children:
        return None
    lines = ["Subagents of this thread (use their reference to address them):"]
    for child in children:
        e = entry(child)
        traits = ["resumable" if e["resumable"] else "one session", "blocking" if e["blocking"] else "non-blocking"]
        label = f' "{e["thread_name"]}"' if e["thread_name"] else ""
        about = f": {e['description']}" if e["description"] else ""
        lines.append(f"- {e['reference']}: {e['name']}{label} — {e['status']} ({', '.join(traits)}){about}")
    return "\n".join(lines)
