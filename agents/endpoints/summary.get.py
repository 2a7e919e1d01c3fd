"""`GET /threads/{id}/summary`: the thread's agent, how many messages it has, and the last one's text."""

from typing import Any

from starlette.requests import Request

from app.spec import ThreadState, define_thread_endpoint


@define_thread_endpoint(description="The thread's agent, message count and last message.")
async def summary(request: Request, state: ThreadState, params: dict[str, str]) -> dict[str, Any]:
    newest = await state.get_messages(order="desc", limit=1)
    return {
        "thread_id": state.thread_id,
        "agent": state.agent_id,
        "messages": newest.total,
        "last_message": newest.messages[0].content if newest.messages else None,
    }
