"""Attachments (§9): uploads on `POST /messages` (JSON and multipart), what the model sees of them, files that
tools return, `attachmentsProperty` checks, and the copy between threads."""

from __future__ import annotations

import base64
import io
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from pydantic import BaseModel
from sqlalchemy import func, select

from app import attachments, errors, files, tables
from app.catalog import Catalog
from app.llm.base import LLMRequest
from app.spec import ThreadState, ToolAttachment, ToolResult, define_agent, define_model, define_prompt, define_tool
from tests.conftest import client_for, wait_for

NAME = re.compile(r"^/attachments/[A-Za-z0-9._-]+-[0-9a-f]{8}(\.[A-Za-z0-9_-]+)?$")


def png(width: int = 64, height: int = 48, color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


class PathArgs(BaseModel):
    path: str


@define_tool(description="Read a text file and return it in capitals, as a new file.")
async def shout_file(state: ThreadState, args: PathArgs) -> ToolResult:
    data = await state.read_file(args.path)
    if data is None:
        return ToolResult(status="error", error=f"no file {args.path}")
    loud = data.decode().upper().encode()
    attachment = ToolAttachment(name="loud.txt", mime_type="text/plain", data=base64.b64encode(loud).decode())
    return ToolResult(status="success", result="done", attachments=[attachment])


class Model:
    """Records requests; replies with `replies` in order, then "done"."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.requests: list[LLMRequest] = []

    def __call__(self, request: LLMRequest) -> Any:
        self.requests.append(request)
        reply = self.replies[len(self.requests) - 1] if len(self.requests) <= len(self.replies) else "done"
        return reply(request) if callable(reply) else reply


def catalog(model: Model, *, images: bool = True, threshold: int = 10, side: dict[str, Any] | None = None) -> Catalog:
    m = define_model(name="m", provider="test", respond=model, capabilities={"supports_images": images})
    p = define_prompt(
        name="p",
        tool_description="t",
        model="m",
        prompt="sys",
        include_chat=True,
        include_past_tools=True,
        recent_image_threshold=threshold,
        tools=["shout_file"],
    )
    agent = define_agent(name="agent", side_a={"prompt": "p", **(side or {})})
    return Catalog(
        root=Path("."), models={"m": m}, prompts={"p": p}, agents={"agent": agent}, tools={"shout_file": shout_file}
    )


async def start(app_factory: Any, cat: Catalog, **overrides: Any) -> tuple[Any, httpx.AsyncClient, str]:
    app = await app_factory(cat, with_worker=True, **overrides)
    client = client_for(app)
    created = await client.post("/threads", json={"agent": "agent"})
    assert created.status_code == 201, created.text
    return app, client, created.json()["id"]


async def settle(client: httpx.AsyncClient, tid: str, sessions: int = 1) -> None:
    async def idle() -> bool:
        thread = (await client.get(f"/threads/{tid}")).json()
        return bool(thread["status"] == "idle" and thread["session"]["number"] >= sessions)

    await wait_for(idle)


async def history(client: httpx.AsyncClient, tid: str) -> list[dict[str, Any]]:
    return list((await client.get(f"/threads/{tid}/messages")).json()["messages"])


def attached_paths(request: LLMRequest) -> list[str]:
    text = "\n".join(m.content or "" for m in request.messages)
    return re.findall(r"^- (/attachments/\S+)", text, re.M)


# -- uploads ------------------------------------------------------------------------------------------------


async def test_json_base64_attachment_is_stored_referenced_and_downloadable(app_factory: Any) -> None:
    _app, client, tid = await start(app_factory, catalog(Model("ok")))
    image = png(64, 48)
    body = {"content": "look", "attachments": [{"name": "my photo (1).png", "mime_type": "image/png",
                                                 "data": base64.b64encode(image).decode()}]}  # fmt: skip
    posted = await client.post(f"/threads/{tid}/messages", json=body)
    assert posted.status_code == 202, posted.text
    await settle(client, tid)
    message = (await history(client, tid))[0]
    [ref] = message["attachments"]
    assert NAME.match(ref["path"]) and ref["path"].startswith("/attachments/my-photo--1-"), ref
    assert ref["path"].endswith(".png")
    assert {k: ref[k] for k in ("name", "mime_type", "size", "width", "height")} == {
        "name": "my photo (1).png",
        "mime_type": "image/png",
        "size": len(image),
        "width": 64,
        "height": 48,
    }
    got = await client.get(f"/threads/{tid}/fs{ref['path']}")
    assert got.status_code == 200 and got.content == image and got.headers["content-type"] == "image/png"


async def test_multipart_message_with_files(app_factory: Any) -> None:
    _app, client, tid = await start(app_factory, catalog(Model("ok")))
    posted = await client.post(
        f"/threads/{tid}/messages",
        data={"content": "two files", "metadata": '{"k": 1}'},
        files=[("files", ("notes.txt", b"hello", "text/plain")), ("files", ("data.csv", b"a,b\n1,2\n", "text/csv"))],
    )
    assert posted.status_code == 202, posted.text
    await settle(client, tid)
    message = (await history(client, tid))[0]
    assert message["content"] == "two files" and message["metadata"] == {"k": 1}
    names = [(a["name"], a["mime_type"], a["size"]) for a in message["attachments"]]
    assert names == [("notes.txt", "text/plain", 5), ("data.csv", "text/csv", 8)]
    for ref, body in zip(message["attachments"], (b"hello", b"a,b\n1,2\n"), strict=True):
        assert (await client.get(f"/threads/{tid}/fs{ref['path']}")).content == body


async def test_queued_message_shows_its_attachments_before_delivery(app_factory: Any) -> None:
    app = await app_factory(catalog(Model("ok")))  # no worker: the message stays queued
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    body = {"content": "x", "attachments": [{"name": "a.txt", "mime_type": "text/plain", "data": "aGk="}]}
    assert (await client.post(f"/threads/{tid}/messages", json=body)).status_code == 202
    [queued] = await history(client, tid)
    assert queued["status"] == "pending" and queued["attachments"][0]["name"] == "a.txt"


@pytest.mark.parametrize(
    ("attachment", "status"),
    [
        ({"name": "a.txt", "mime_type": "text/plain", "data": "not base64!"}, 422),
        ({"name": "big.bin", "mime_type": "application/octet-stream", "data": base64.b64encode(b"x" * 3000).decode()},
         413),
    ],
)  # fmt: skip
async def test_bad_or_too_large_attachments_store_nothing(
    app_factory: Any, attachment: dict[str, str], status: int
) -> None:
    _app, client, tid = await start(app_factory, catalog(Model("ok")), max_file_bytes=2048)
    response = await client.post(f"/threads/{tid}/messages", json={"content": "x", "attachments": [attachment]})
    assert response.status_code == status, response.text
    assert "error" in response.json()
    assert (await client.get(f"/threads/{tid}/fs")).json()["entries"] == []
    assert await history(client, tid) == []


async def test_multipart_file_over_the_limit_is_413(app_factory: Any) -> None:
    _app, client, tid = await start(app_factory, catalog(Model("ok")), max_file_bytes=2048)
    response = await client.post(
        f"/threads/{tid}/messages", data={"content": "x"}, files={"f": ("big.bin", b"x" * 5000, "text/plain")}
    )
    assert response.status_code == 413, response.text
    assert (await client.get(f"/threads/{tid}/fs")).json()["entries"] == []


async def test_identical_uploads_are_stored_once(app_factory: Any) -> None:
    app, client, tid = await start(app_factory, catalog(Model("ok", "ok")))
    data = base64.b64encode(b"same bytes").decode()
    for _ in range(2):
        body = {"content": "x", "attachments": [{"name": "same.txt", "mime_type": "text/plain", "data": data}]}
        assert (await client.post(f"/threads/{tid}/messages", json=body)).status_code == 202
    await settle(client, tid)
    paths = [m["attachments"][0]["path"] for m in await history(client, tid) if m["role"] == "user"]
    assert len(set(paths)) == 2  # two entries …
    async with app.state.runtime.sessions() as session:
        blobs = (await session.execute(select(func.count()).select_from(tables.Blob))).scalar_one()
    assert blobs == 1  # … one blob


# -- what the model sees ------------------------------------------------------------------------------------


async def test_images_reach_a_model_that_supports_them_within_the_threshold(app_factory: Any) -> None:
    model = Model("first", "second")
    _app, client, tid = await start(app_factory, catalog(model, threshold=2))
    for color in ("red", "blue"):
        image = base64.b64encode(png(color=color)).decode()
        body = {"content": color, "attachments": [{"name": f"{color}.png", "mime_type": "image/png", "data": image}]}
        assert (await client.post(f"/threads/{tid}/messages", json=body)).status_code == 202
        await settle(client, tid)
    first, second = model.requests
    [seen] = [i for m in first.messages for i in m.images]
    assert seen.mime_type == "image/png" and base64.b64decode(seen.data or "") == png(color="red")
    assert "Attached files:" in (first.messages[-1].content or "")
    # second request: [system, user red, assistant, user blue]; the threshold keeps the last two messages' images
    carrying = [m.content.split("\n")[0] for m in second.messages if m.images and m.content]
    assert carrying == ["blue"]
    assert "red.png" not in str([i.path for m in second.messages for i in m.images])
    assert sum("Attached files:" in (m.content or "") for m in second.messages) == 2  # both still named


async def test_a_model_without_image_support_gets_names_only(app_factory: Any) -> None:
    model = Model("ok")
    _app, client, tid = await start(app_factory, catalog(model, images=False))
    image = base64.b64encode(png()).decode()
    body = {"attachments": [{"name": "pic.png", "mime_type": "image/png", "data": image}]}  # no text at all
    assert (await client.post(f"/threads/{tid}/messages", json=body)).status_code == 202
    await settle(client, tid)
    [request] = model.requests
    assert not any(m.images for m in request.messages)
    assert attached_paths(request)[0].startswith("/attachments/pic-")
    assert "image/png" in (request.messages[-1].content or "") and "64x48" in (request.messages[-1].content or "")


async def test_upload_tool_reads_it_returns_an_attachment_download_round_trip(app_factory: Any) -> None:
    def call_tool(request: LLMRequest) -> dict[str, Any]:
        [path] = attached_paths(request)
        return {"tool_calls": [{"name": "shout_file", "arguments": {"path": path}}]}

    model = Model(call_tool, "all done")
    _app, client, tid = await start(app_factory, catalog(model))
    posted = await client.post(
        f"/threads/{tid}/messages",
        data={"content": "shout this"},
        files={"f": ("quiet.txt", b"hush now", "text/plain")},
    )
    assert posted.status_code == 202, posted.text
    await settle(client, tid)
    rows = await history(client, tid)
    [tool] = [r for r in rows if r["role"] == "tool"]
    assert tool["tool_status"] == "success" and tool["content"] == "done"
    [ref] = tool["attachments"]
    assert ref["name"] == "loud.txt" and NAME.match(ref["path"]) and ref["size"] == 8
    assert (await client.get(f"/threads/{tid}/fs{ref['path']}")).content == b"HUSH NOW"
    # the model saw the returned file named in the tool result
    tool_text = next(m.content for m in model.requests[1].messages if m.role == "tool") or ""
    assert ref["path"] in tool_text


async def test_attachments_property_must_name_files_of_the_thread(app_factory: Any) -> None:
    binding = {"name": "deliver", "message_property": "summary", "attachments_property": "files"}

    def deliver_missing(_: LLMRequest) -> dict[str, Any]:
        return {"tool_calls": [{"name": "deliver", "arguments": {"summary": "s", "files": ["/attachments/nope.txt"]}}]}

    def deliver_real(request: LLMRequest) -> dict[str, Any]:
        return {"tool_calls": [{"name": "deliver", "arguments": {"summary": "s", "files": attached_paths(request)}}]}

    model = Model(deliver_missing, deliver_real)
    _app, client, tid = await start(app_factory, catalog(model, side={"session_stop": binding}))
    body = {"content": "go", "attachments": [{"name": "r.txt", "mime_type": "text/plain", "data": "cmVwb3J0"}]}
    assert (await client.post(f"/threads/{tid}/messages", json=body)).status_code == 202
    await settle(client, tid)
    tools = [r for r in await history(client, tid) if r["role"] == "tool"]
    assert tools[0]["tool_status"] == "error" and "/attachments/nope.txt" in tools[0]["content"]
    assert tools[1]["tool_status"] == "success"
    [ref] = tools[1]["attachments"]
    assert ref["name"].startswith("r-") and ref["mime_type"] == "text/plain" and ref["size"] == 6
    session = (await client.get(f"/threads/{tid}")).json()["session"]
    assert session["status"] == "success" and session["result"]["attachments"] == [ref["path"]]


# -- copying between threads --------------------------------------------------------------------------------


def test_path_for_sanitises_and_makes_names_unique() -> None:
    one, two = attachments.path_for("Q4 report (final).pdf"), attachments.path_for("Q4 report (final).pdf")
    assert one != two and NAME.match(one) and one.startswith("/attachments/Q4-report--final-") and one.endswith(".pdf")
    assert attachments.path_for("../../etc/passwd").startswith("/attachments/passwd-")
    assert attachments.path_for("x" * 300 + ".txt").split("/")[-1].split("-")[0] == "x" * 64
    assert NAME.match(attachments.path_for(".hidden"))
    assert NAME.match(attachments.path_for("naïve café.md"))


async def test_copy_between_threads_shares_the_blob_and_rewrites_the_path(app_factory: Any) -> None:
    app, client, source = await start(app_factory, catalog(Model()))
    destination = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    image = png(10, 20)
    put = await client.put(f"/threads/{source}/fs/out/chart final.png", content=image,
                           headers={"content-type": "image/png"})  # fmt: skip
    assert put.status_code == 201
    async with app.state.runtime.sessions() as session, session.begin():
        ref = await attachments.copy(session, uuid.UUID(source), "/out/chart final.png", uuid.UUID(destination))
        with pytest.raises(errors.FileNotFound, match=r"/out/missing\.png"):
            await attachments.copy(session, uuid.UUID(source), "/out/missing.png", uuid.UUID(destination))
    assert NAME.match(ref["path"]) and ref["path"].startswith("/attachments/chart-final-") and ref["path"] != put.json()
    assert (ref["name"], ref["size"], ref["width"], ref["height"]) == ("chart final.png", len(image), 10, 20)
    got = await client.get(f"/threads/{destination}/fs{ref['path']}")
    assert got.content == image and got.headers["etag"] == f'"{put.json()["etag"]}"'
    async with app.state.runtime.sessions() as session:
        assert (await session.execute(select(func.count()).select_from(tables.Blob))).scalar_one() == 1
        copied = await files.stat(session, uuid.UUID(destination), ref["path"])
    assert copied.sha256 == put.json()["etag"]


async def test_messages_given_at_thread_creation_may_carry_attachments(app_factory: Any) -> None:
    app = await app_factory(catalog(Model("ok")))
    client = client_for(app)
    attachment = {"name": "brief.md", "mime_type": "text/markdown", "data": base64.b64encode(b"# Brief").decode()}
    created = await client.post(
        "/threads", json={"agent": "agent", "messages": [{"content": "read this", "attachments": [attachment]}]}
    )
    assert created.status_code == 201, created.text
    [queued] = await history(client, created.json()["id"])
    [ref] = queued["attachments"]
    assert ref["name"] == "brief.md" and ref["size"] == 7
    assert (await client.get(f"/threads/{created.json()['id']}/fs{ref['path']}")).content == b"# Brief"
