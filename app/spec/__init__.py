"""The authoring surface: everything code under `agents/` imports from `app`."""

from app.llm.base import LLMMessage
from app.spec.define import (
    EndpointDefinition,
    HookDefinition,
    ToolDefinition,
    define_agent,
    define_hook,
    define_model,
    define_prompt,
    define_thread_endpoint,
    define_tool,
)
from app.spec.definitions import (
    AgentDefinition,
    ModelDefinition,
    PromptDefinition,
    SessionToolConfig,
    SideConfig,
    ToolEntry,
    VariableDefinition,
)
from app.spec.results import ToolAttachment, ToolResult
from app.spec.state import (
    ExecutionState,
    FileRecord,
    FileStats,
    FindResult,
    GrepMatch,
    MessagesResult,
    ReaddirResult,
    StateLog,
    StateMessage,
    ThreadState,
)

__all__ = [
    "AgentDefinition",
    "EndpointDefinition",
    "ExecutionState",
    "FileRecord",
    "FileStats",
    "FindResult",
    "GrepMatch",
    "HookDefinition",
    "LLMMessage",
    "MessagesResult",
    "ModelDefinition",
    "PromptDefinition",
    "ReaddirResult",
    "SessionToolConfig",
    "SideConfig",
    "StateLog",
    "StateMessage",
    "ThreadState",
    "ToolAttachment",
    "ToolDefinition",
    "ToolEntry",
    "ToolResult",
    "VariableDefinition",
    "define_agent",
    "define_hook",
    "define_model",
    "define_prompt",
    "define_thread_endpoint",
    "define_tool",
]
