"""What a step is between its transactions: opened (`Step`), or how the run ended (`RELEASED`, `OPEN_ON_ITS_OWN`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from app import tables
from app.engine import types
from app.llm.base import LLMResponse
from app.spec.definitions import AgentDefinition, Side, SideConfig
from app.spec.messages import ToolCall


class Released:
    """What a step returns when its last transaction also gave the thread back (the turn ended; nothing waits)."""


RELEASED = Released()


class OpenOnItsOwn:
    """What opening a step inside a closing transaction returns when input or effects wait: the close commits, and the
    step opens in a transaction of its own (effects run first, outside any; a delivery that fails rolls back only
    that opening)."""


OPEN_ON_ITS_OWN = OpenOnItsOwn()


@dataclass
class Step:
    """What the opening transaction of a step decided: who acts and with what, and either the request to make or
    (a resumed step) the answer whose calls are left to run."""

    side: Side
    number: int
    message_id: uuid.UUID  # the step's assistant message: the pending one the call streams into, or the answer
    agent: AgentDefinition  # the thread's agent as the step began (a handoff switches it, §7.3)
    config: SideConfig  # the acting side's config, for its session tool bindings
    env: types.Env
    request: Any = None  # the request to make; None when the step resumes an answer
    response: LLMResponse | None = None  # the model's answer, once stored
    calls: list[ToolCall] = field(default_factory=list)  # tool calls still to run
    requests_before: int | None = None  # requests made to the model before this step's, counted at its announce
    message: tables.Message | None = None  # that pending message as the opening transaction committed it
