"""The `ThreadState` protocol: the one API user code (tools, hooks, effects, endpoints) sees (`semantics.md` §12)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition, Side
from app.spec.results import ToolAttachment, ToolResult


@dataclass(frozen=True)
class ExecutionState:
    """Where the thread's execution is; tools use `tool_call_id` and `attempt` as idempotency keys."""

    side: Side
    step: int
    session: int
    attempt: int
    tool_call_id: str | None = None
    tool_options: dict[str, Any] | None = None


class AttachmentRef(BaseModel):
    """A file of the thread a message refers to (the spec's `AttachmentRef`); stored ones have every field."""

    path: str
    name: str | None = None
    mime_type: str | None = None
    size: int | None = None
    width: int | None = None
    height: int | None = None


class StateMessage(BaseModel):
    """A stored message as user code sees it (the spec's `Message`); the `subagent_*` fields after `subagent_id`
    are projected from the registry entry of the child the message speaks for (None when it names none)."""

    id: str
    role: str
    side: str | None
    content: str | None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    tool_status: str | None = None
    status: str
    silent: bool = False
    depth: int = 0
    parent_id: str | None = None
    attachments: list[AttachmentRef] = []
    reasoning_content: str | None = None
    metadata: dict[str, Any] = {}
    subagent_id: str | None = None
    subagent_name: str | None = None
    subagent_title: str | None = None
    subagent_description: str | None = None
    subagent_status: str | None = None
    subagent_resumable: bool | None = None
    subagent_blocking: bool | None = None
    subagent_thread_name: str | None = None
    subagent_spawn_group_id: str | None = None
    created_at: datetime


class MessagesResult(BaseModel):
    """A page of messages."""

    messages: list[StateMessage]
    total: int
    has_more: bool


class StateLog(BaseModel):
    """One stored LLM request, tool call or hook run of the thread; secrets are never stored."""

    id: str
    kind: str
    message_id: str | None
    model: str | None
    provider: str | None
    tool: str | None
    attempt: int
    status: str
    error: str | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    cost: float | None
    latency_ms: float | None
    ttft_ms: float | None
    finish_reason: str | None
    response: dict[str, Any] | None
    created_at: datetime


class FileRecord(BaseModel):
    """An entry of the thread's file tree; `sha256` addresses a file's content (None for directories)."""

    path: str
    name: str
    type: Literal["file", "directory"]
    size: int
    mime_type: str | None = None
    sha256: str | None = None
    width: int | None = None
    height: int | None = None


class ReaddirResult(BaseModel):
    path: str
    entries: list[FileRecord]


class FileStats(BaseModel):
    files: int
    directories: int
    bytes: int


class GrepMatch(BaseModel):
    """A matching line of a text file (`line` is 1-based)."""

    path: str
    line: int
    text: str


class FindResult(BaseModel):
    pattern: str
    entries: list[FileRecord]


class ScheduledEffect(BaseModel):
    """An effect stored by `schedule_effect`; `status` is one of `app/effects.py`'s statuses."""

    id: str
    name: str
    args: dict[str, Any]
    run_at: datetime
    status: str
    attempts: int
    created_at: datetime


class SubagentEntry(BaseModel):
    """A child in its parent's registry (the spec's `SubagentRegistryEntry`)."""

    reference: str
    name: str
    title: str | None = None
    description: str | None = None
    resumable: bool
    blocking: bool
    thread_name: str | None = None
    spawn_group_id: str | None = None
    created_at: datetime
    status: str
    parent_communication: str


class ThreadState(Protocol):
    """What a tool gets as `state`.

    Inside the thread's own execution (`execution` is set) everything is allowed. Outside it (custom endpoints,
    handles on other threads) reads, `queue_message`, `queue_tool`, `invoke_tool` and `emit` work, while
    `inject_message`, `update_message`, `delete_message` and `set_env` raise `OutsideExecution`: they would race
    the running step. Child/parent handles are not part of this server version yet.
    """

    # -- identity --------------------------------------------------------------------------------------------

    @property
    def thread_id(self) -> str: ...

    @property
    def agent_id(self) -> str: ...

    @property
    def user_id(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...

    @property
    def terminated(self) -> datetime | None:
        """When the thread was terminated (it then refuses all input), or None while it is active."""
        ...

    @property
    def children(self) -> list[SubagentEntry]:
        """This thread's subagents as they were when this state was made (the start of the tool call)."""
        ...

    @property
    def execution(self) -> ExecutionState | None:
        """The running step, or None outside the thread's own execution."""
        ...

    @property
    def context(self) -> dict[str, Any]:
        """Scratch space for user code; it is not stored."""
        ...

    # -- messages --------------------------------------------------------------------------------------------

    async def get_messages(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
        include_silent: bool = False,
        max_depth: int = 0,
    ) -> MessagesResult:
        """Stored messages of this thread (queued, undelivered input is not included)."""
        ...

    async def get_message(self, message_id: str) -> StateMessage | None:
        """One stored message, or None if this thread has no message with that id."""
        ...

    async def inject_message(
        self,
        role: Literal["user", "assistant", "system"],
        content: str,
        *,
        silent: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> StateMessage:
        """Write a message into history now (own execution only); the model sees it on its next call.

        It runs the acting side's `before_create_message` hooks (which may change `content`, `metadata` and
        `silent`) and then its `after_create_message` hooks, as every message the engine inserts does; a message
        injected by one of those two hooks runs none (it would call itself forever).
        """
        ...

    async def queue_message(
        self,
        role: Literal["user", "assistant"],
        content: str,
        *,
        attachments: Sequence[ToolAttachment | AttachmentRef | str] | None = None,
        silent: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Put a message in the thread's inbox and return the id it will be stored with.

        A running thread stores it before its next LLM call; an idle one starts a run (`user` makes side A act,
        `assistant` side B of a `dual_ai` agent). `attachments` are new files (`ToolAttachment`, stored under
        `/attachments/` of this thread) or files this thread already has (`AttachmentRef` or a path); a path that
        names no file of this thread raises `FileNotFound`.
        """
        ...

    async def update_message(
        self, message_id: str, *, content: str | None = None, metadata: dict[str, Any] | None = None
    ) -> StateMessage:
        """Replace a message's content and/or metadata (own execution only); `None` leaves a field as it is.

        It runs the acting side's `before_update_message` hooks (which may change `content`, `metadata` and
        `silent`) and then its `after_update_message` hooks, as the engine's own updates do; an update made by one of
        those two hooks runs none.
        """
        ...

    async def delete_message(self, message_id: str) -> bool:
        """Delete a message (own execution only); a tool-call message takes its results with it.

        Returns False when there was no such message. As the HTTP delete, it never leaves a call without its result:
        a tool result alone raises `ToolResultAlone` (delete the message that made the call), and what the running
        step still uses (its open tool-call message, a `pending` message) raises `MessageBusy`.
        """
        ...

    # -- logs ------------------------------------------------------------------------------------------------

    async def get_logs(
        self, *, limit: int = 100, offset: int = 0, order: Literal["asc", "desc"] = "asc"
    ) -> list[StateLog]:
        """The thread's stored LLM request logs, oldest first unless `order` says otherwise."""
        ...

    # -- definitions -----------------------------------------------------------------------------------------

    async def load_model(self, name: str) -> ModelDefinition | None:
        """The model definition called `name`, or None."""
        ...

    async def load_prompt(self, name: str) -> PromptDefinition | None:
        """The prompt definition called `name`, or None."""
        ...

    async def load_agent(self, name: str) -> AgentDefinition | None:
        """The agent definition called `name`, or None."""
        ...

    def get_model_names(self) -> list[str]:
        """Names of every model, sorted."""
        ...

    def get_prompt_names(self) -> list[str]:
        """Names of every prompt, sorted."""
        ...

    def get_agent_names(self) -> list[str]:
        """Names of every agent, sorted."""
        ...

    def get_tool_names(self) -> list[str]:
        """Names of every callable tool, sorted."""
        ...

    # -- variables -------------------------------------------------------------------------------------------

    async def env(self, name: str) -> str:
        """The value of a variable, resolved thread → agent → tool config → prompt; raises if nothing sets it."""
        ...

    async def set_env(self, name: str, value: str) -> None:
        """Set a thread variable (own execution only), visible to `env` at once.

        The value is stored secret if the agent declares the variable `secret` or it is already stored secret.
        Live (not terminated) descendant threads get it too, from their next step on, except a child whose agent's
        graph declares the name `scoped`, and that child's subtree.
        """
        ...

    # -- tools -----------------------------------------------------------------------------------------------

    async def invoke_tool(self, name: str, args: dict[str, Any] | None = None) -> ToolResult:
        """Run a callable tool now and return its result; nothing is stored and no error is raised."""
        ...

    async def queue_tool(self, name: str, args: dict[str, Any] | None = None) -> str:
        """Have the acting side call a tool the model could call, and return the call's id.

        During a tool call, the call joins the running step (the model sees it among the step's calls); otherwise
        it is queued, and delivered as a side's own call before its next LLM call (an idle thread starts a run).
        """
        ...

    async def run_agent(self, name: str) -> None:
        """Hand this thread to the agent `name`, as a handoff tool does (own execution only, §7.3): the thread keeps
        its id, history and files, the first agent stays `origin_agent`, and when the running step ends the new
        agent's side A acts at once in the same run. Both agents must be `ai_human`; raises otherwise."""
        ...

    # -- files ---------------------------------------------------------------------------------------------
    # Absolute POSIX paths; `..`, NUL and control characters are refused (`BadPath`). Content is stored once per
    # SHA-256, so writing a copy costs nothing.

    async def write_file(self, path: str, data: bytes | str, mime_type: str | None = None) -> FileRecord:
        """Store `data` at `path` (text is UTF-8), creating missing directories and replacing a file there."""
        ...

    async def read_file(self, path: str) -> bytes | None:
        """A file's bytes, or None if there is no file at `path`."""
        ...

    async def read_file_stream(self, path: str) -> AsyncIterator[bytes] | None:
        """A file's bytes chunk by chunk (about 1 MB each), or None if there is no file at `path`."""
        ...

    async def stat_file(self, path: str) -> FileRecord | None:
        """The entry at `path`, or None."""
        ...

    async def readdir_file(self, path: str = "/") -> ReaddirResult:
        """The entries directly inside a directory."""
        ...

    async def unlink_file(self, path: str) -> None:
        """Delete a file."""
        ...

    async def mkdir_file(self, path: str) -> FileRecord:
        """Make a directory and its missing parents."""
        ...

    async def rmdir_file(self, path: str) -> None:
        """Delete an empty directory."""
        ...

    async def get_file_stats(self) -> FileStats:
        """How many files and directories the thread has, and the bytes its files hold."""
        ...

    async def grep_files(self, pattern: str) -> list[GrepMatch]:
        """Lines of the thread's text files matching the RE2 regular expression `pattern` (at most 1000)."""
        ...

    async def find_files(self, pattern: str) -> FindResult:
        """Entries whose path matches a glob: `*.md` (any folder), `/reports/**/*.pdf`."""
        ...

    async def get_file_thumbnail(self, path: str) -> bytes | None:
        """A JPEG thumbnail (at most 256 px) of the image at `path`, or None if it is not a readable image."""
        ...

    # -- events ----------------------------------------------------------------------------------------------

    async def emit(self, event: str, data: Any) -> None:
        """Send a custom `event` to the thread's stream."""
        ...

    # -- subagents ------------------------------------------------------------------------------------------

    async def notify_parent(self, content: str) -> None:
        """Send the parent a silent message naming this subagent (`Subagent (reference: …) sent the following
        message: …`); say in plain words whether you need an answer. Raises for a thread without a parent."""
        ...

    async def set_status(self, text: str) -> None:
        """Set this thread's status text: the parent's registry shows it as this subagent's status. Raises for a
        thread without a parent."""
        ...

    async def get_child_thread(self, reference: str) -> ThreadState | None:
        """A state of one of this thread's children (outside its execution: reads, files, `queue_message`, `emit`,
        `terminate`), or None if `reference` is not a child of this thread."""
        ...

    async def get_parent_thread(self) -> ThreadState | None:
        """A state of this thread's parent (outside its execution), or None for a top-level thread."""
        ...

    async def terminate(self) -> None:
        """End this thread (and its descendants) for good: the running execution stops without writing more,
        and later input is refused with `Thread is terminated` (§11)."""
        ...

    # -- effects ---------------------------------------------------------------------------------------------

    async def schedule_effect(self, name: str, args: dict[str, Any] | None = None, delay_ms: float = 0) -> str:
        """Store a durable effect that runs `delay_ms` from now (at least once, even across restarts); return its id.

        `args` are validated against the effect's argument model now; an unknown name raises `UnknownEffect`.
        """
        ...

    async def get_scheduled_effects(self, name: str | None = None) -> list[ScheduledEffect]:
        """The thread's effects that have not started yet (`scheduled` or `queued`), by due time."""
        ...

    async def remove_scheduled_effect(self, effect_id: str) -> bool:
        """Cancel an effect that has not started; False if there is none such (unknown, started or finished)."""
        ...
