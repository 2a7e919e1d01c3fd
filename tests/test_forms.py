"""Multipart bodies are taken whole or not at all: a body that ends before its closing boundary is a 400."""

from __future__ import annotations

from typing import Any

import pytest

from app import catalog
from tests.conftest import ROOT, client_for

BOUNDARY = "b0undary"
PARTS = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="content"\r\n\r\nhello\r\n'
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="f"; filename="a.txt"\r\n'
    "Content-Type: text/plain\r\n\r\nfile body\r\n"
)


@pytest.mark.parametrize(
    "body",
    [
        PARTS,  # no closing boundary
        PARTS + f"--{BOUNDARY}",  # the closing boundary cut short
        PARTS[:-20],  # cut inside the file part
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="content"\r\n\r\nhel',
    ],
)
async def test_an_unterminated_multipart_message_is_refused(app_factory: Any, body: str) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    response = await client.post(f"/threads/{tid}/messages", content=body.encode(), headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "malformed_multipart" and response.json()["error"]["message"]
    assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []
    assert (await client.get(f"/threads/{tid}/fs")).json()["entries"] == []
    whole = await client.post(
        f"/threads/{tid}/messages", content=(PARTS + f"--{BOUNDARY}--\r\n").encode(), headers=headers
    )
    assert whole.status_code == 202, whole.text
