"""What tools return."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolAttachment(BaseModel):
    """A file a tool returns (stored under `/attachments/`)."""

    name: str
    mime_type: str
    data: str = Field(description="base64 content")


class ToolResult(BaseModel):
    """The spec's `ToolResult`."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["success", "error"]
    result: str | None = None
    error: str | None = None
    error_code: str | None = None
    error_data: dict[str, Any] | None = None
    stack: str | None = None
    attachments: list[ToolAttachment] = Field(default_factory=list)

    @property
    def text(self) -> str:
        """What the model sees."""
        if self.status == "error":
            return self.error or self.result or "Tool failed"
        return self.result or ""
