"""Tools the tests' catalogs share."""

from __future__ import annotations

from pydantic import BaseModel

from app.spec import ThreadState, define_tool


class AddArgs(BaseModel):
    a: int
    b: int


@define_tool(description="Add two integers.")
async def add(state: ThreadState, args: AddArgs) -> str:
    return str(args.a + args.b)
