"""The playground: a static page at `/` (with its script and stylesheet) that talks to the API like any client.

It holds no data and needs no key to load: everything it shows comes from the API, with the key the user pastes
(`Authorization: Bearer`) or, for streams, a stream token. Its Content-Security-Policy allows only the server's
own script, styles and connections (and `blob:` images, the thumbnails it fetched with the key).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Depends, Response

from app import errors
from app.api import deps

router = APIRouter(include_in_schema=False, dependencies=[Depends(deps.local_in_open_mode)])

JS = "text/javascript; charset=utf-8"
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": JS,
    "client.js": JS,  # clients/js/src/index.js, copied (tests/test_client_js.py)
    "dom.js": JS,
    "files.js": JS,
    "markdown.js": JS,
    "messages.js": JS,
    "page.js": JS,
    "subagents.js": JS,
    "trace.js": JS,
    "map.js": JS,
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
    # npm packages copied byte for byte, with their licences (vendor/README.md: versions and checksums)
    "vendor/marked.esm.js": JS,
    "vendor/purify.es.mjs": JS,
    "vendor/LICENSE-marked.txt": "text/plain; charset=utf-8",
    "vendor/LICENSE-dompurify.txt": "text/plain; charset=utf-8",
    "vendor/README.md": "text/markdown; charset=utf-8",
}
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files("app") / "playground" / name).read_bytes()


CONTENT = {name: _read(name) for name in ASSETS}  # read once: a missing file fails at import, not on a request


def _asset(name: str) -> Response:
    return Response(CONTENT[name], media_type=ASSETS[name], headers=HEADERS)


@router.get("/")
async def page() -> Response:
    """The playground page."""
    return _asset("index.html")


@router.get("/playground/{name:path}")
async def asset(name: str) -> Response:
    """A file of the page; anything not in `ASSETS` is 404."""
    if name not in ASSETS or name == "index.html":
        raise errors.NotFound()
    return _asset(name)
