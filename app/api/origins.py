"""Which web origin a browser says a request comes from, for open mode: there no key stands between a page and the
API, and a browser sends a form's POST, or a `fetch` in `no-cors` mode, to any address without asking anyone.

A browser names the page's origin in `Origin` (every request but a GET or HEAD without CORS) and, in `Sec-Fetch-Site`,
how it relates to the request's own origin; a page can set neither. A client that sends neither is not a browser
acting for a page, and is trusted as open mode trusts any local program.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

DEFAULT_PORTS = {"http": "80", "https": "443"}


def own(scheme: str, host: str) -> str:
    """The origin a browser gives a page served at `host` (a `Host` header) over `scheme`: no default port."""
    origin = f"{scheme.lower()}://{host.strip().lower()}"
    default = DEFAULT_PORTS.get(scheme.lower())
    return origin.removesuffix(f":{default}") if default else origin


def foreign(headers: Mapping[str, str], scheme: str, allowed: Collection[str]) -> str | None:
    """The other origin a browser sends this request from (`null` for an opaque one, `another site` when it says
    only that), or None: no browser's, the server's own origin, or one listed in `allowed` (`*` is no origin)."""
    origin = headers.get("origin")
    site = headers.get("sec-fetch-site", "").lower()
    if origin is not None:
        origin = origin.strip().lower()
        if origin == "null":  # a sandboxed frame, a `file:` page, a redirect from another origin
            return origin
        host = headers.get("host")
        if origin in allowed or (host is not None and origin == own(scheme, host)):
            return None
        # the browser compared the page's origin with the URL it asked for; a proxy in front may have rewritten Host
        return None if site == "same-origin" else origin
    # no Origin: a GET or HEAD (a link, an <img>, a <script>), or a browser of old; `same-site` is another port or
    # another name of the same site, which is another origin all the same
    return "another site" if site in ("cross-site", "same-site") else None
