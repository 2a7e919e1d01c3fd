"""Custom thread endpoint routes: file names under `endpoints/` to routes, and a request path to its endpoint.

`name.py` is `GET /name`, `name.<method>.py` picks the method, `index.py` is its folder, `[id].py` one segment
(`params["id"]`), `[...rest].py` the rest of the path (one segment or more). Among the routes of the request's method
that match, static beats dynamic beats catch-all, segment by segment from the left (`authoring.md`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# First segments of the built-in routes under `/threads/{id}/`, and the methods of `/threads/{id}` itself; a test
# checks these cover every built-in route of `create_app`. The names stay reserved for every method and depth.
RESERVED = frozenset(
    {"messages", "events", "fs", "stop", "continue", "terminate", "subagents", "logs", "effects", "variables"}
)
THREAD_METHODS = frozenset({"GET", "PATCH", "DELETE"})

_STATIC = re.compile(r"[A-Za-z0-9_~-]+")
_PARAM = re.compile(r"\[([A-Za-z_][A-Za-z0-9_]*)\]")
_REST = re.compile(r"\[\.\.\.([A-Za-z_][A-Za-z0-9_]*)\]")
_FILE = re.compile(r"(?P<segment>\[\.\.\.[^\]]*\]|\[[^\]]*\]|[^.]+)(?:\.(?P<method>[^.]*))?")
_NAMING = "name files like `summary.py`, `report.post.py`, `index.py`, `[id].py` or `[...rest].py`"

Kind = Literal["static", "param", "rest"]
_RANK: dict[Kind, int] = {"static": 0, "param": 1, "rest": 2}


class RouteError(Exception):
    """An endpoint file whose route is not usable: what is wrong, and the fix."""

    def __init__(self, message: str, fix: str, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.field = field


@dataclass(frozen=True)
class Segment:
    """One path segment of a route: literal text, a parameter, or the catch-all rest."""

    kind: Kind
    value: str  # the text of a static segment, the name of a parameter

    def __str__(self) -> str:
        return {"static": self.value, "param": f"[{self.value}]", "rest": f"[...{self.value}]"}[self.kind]


@dataclass(frozen=True)
class Route:
    """The method and path pattern an endpoint file defines."""

    method: str
    segments: tuple[Segment, ...]
    file: str  # the file's path inside `endpoints/`

    @property
    def path(self) -> str:
        return "/" + "/".join(map(str, self.segments))

    def __str__(self) -> str:
        return f"{self.method} /threads/{{id}}{self.path.rstrip('/')}"

    @property
    def shape(self) -> tuple[str, tuple[tuple[Kind, str], ...]]:
        """What two files must not share: the method and the pattern up to parameter names."""
        return self.method, tuple((s.kind, s.value if s.kind == "static" else "") for s in self.segments)

    @property
    def rank(self) -> tuple[int, ...]:
        """Lower wins: static before dynamic before catch-all, from the left."""
        return tuple(_RANK[s.kind] for s in self.segments)

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The parameters if the path's segments `parts` match this route."""
        params: dict[str, str] = {}
        for i, segment in enumerate(self.segments):
            if i >= len(parts):
                return None
            if segment.kind == "rest":
                params[segment.value] = "/".join(parts[i:])
                return params
            if segment.kind == "static" and parts[i] != segment.value:
                return None
            if segment.kind == "param":
                params[segment.value] = parts[i]
        return params if len(parts) == len(self.segments) else None


def parse(file: str) -> Route:
    """The route of the endpoint file at `file` (a path inside `endpoints/`); raises `RouteError`."""
    *folders, name = file.split("/")
    if not name.endswith(".py"):
        raise RouteError(f"`{name}` is not a Python file", _NAMING)
    found = _FILE.fullmatch(name.removesuffix(".py"))
    if found is None:
        raise RouteError(f"`{name}` is not an endpoint file name", _NAMING)
    method = (found["method"] if found["method"] is not None else "get").upper()
    if method not in METHODS:
        fix = f"end the name with one of {', '.join('.' + m.lower() for m in METHODS)} before `.py`, or with none (GET)"
        raise RouteError(f"unknown method `{found['method']}` in `{name}`", fix)
    segments = [_segment(f, folder=True) for f in folders]
    if found["segment"] != "index":
        segments.append(_segment(found["segment"], folder=False))
    names = [s.value for s in segments if s.kind != "static"]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RouteError(f"the parameter `{twice[0]}` appears twice in the path", "rename one of the segments")
    return Route(method, tuple(segments), file)


def _segment(text: str, *, folder: bool) -> Segment:
    if _STATIC.fullmatch(text):
        return Segment("static", text)
    if found := _PARAM.fullmatch(text):
        return Segment("param", found[1])
    if found := _REST.fullmatch(text):
        if folder:
            raise RouteError(f"the catch-all folder `{text}` is not last", f"make it a file: `{text}.py`")
        return Segment("rest", found[1])
    what = "folder" if folder else "file"
    fix = "use letters, digits, `_`, `-` or `~`; `[name]` for a parameter, `[...name]` for the rest of the path"
    raise RouteError(f"`{text}` is not a valid {what} name for a route segment", fix)


def builtin(route: Route) -> bool:
    """Whether a built-in thread route owns the route's path (built-in routes always win)."""
    if not route.segments:
        return route.method in THREAD_METHODS
    first = route.segments[0]
    return first.kind == "static" and first.value in RESERVED


def unreserved_regex() -> str:
    """A regex of the paths under `/threads/{id}/` whose first segment is not a reserved name."""
    names = "|".join(sorted(map(re.escape, RESERVED)))
    return rf"(?!(?:{names})(?:/|$))[^/].*"


def split(path: str) -> list[str]:
    """A request path's segments (empty ones dropped)."""
    return [p for p in path.split("/") if p]


@dataclass(frozen=True)
class Match(Generic[T]):
    """The endpoint a request path resolves to (`None` if none answers its method) and what the path allows."""

    route: Route | None
    endpoint: T | None
    params: dict[str, str]
    allow: tuple[str, ...]


class Router(Generic[T]):
    """Endpoints by route; `match` resolves a request."""

    def __init__(self, routes: Iterable[tuple[Route, T]] = ()) -> None:
        self._routes = sorted(routes, key=lambda r: r[0].rank)

    @property
    def routes(self) -> list[Route]:
        return [r for r, _ in self._routes]

    @property
    def entries(self) -> list[tuple[Route, T]]:
        """Each route with its endpoint, best first."""
        return list(self._routes)

    def match(self, method: str, path: str) -> Match[T] | None:
        """The best route for `method` and `path`; `None` if no route matches the path whatever the method."""
        parts = split(path)
        found = [
            (route, endpoint, params) for route, endpoint in self._routes if (params := route.match(parts)) is not None
        ]
        if not found:
            return None
        allow = tuple(m for m in METHODS if any(route.method == m for route, _, _ in found))
        for route, endpoint, params in found:  # sorted by rank: the first of the method is the best
            if route.method == method:
                return Match(route, endpoint, params, allow)
        return Match(None, None, {}, allow)


def build(endpoints: Mapping[str, T]) -> tuple[Router[T], list[tuple[str, RouteError]]]:
    """A router over endpoints by file (paths inside `endpoints/`), and the files whose route is refused."""
    accepted: dict[tuple[str, tuple[tuple[Kind, str], ...]], tuple[Route, T]] = {}
    problems: list[tuple[str, RouteError]] = []
    for file in sorted(endpoints):
        try:
            route = parse(file)
        except RouteError as exc:
            problems.append((file, exc))
            continue
        if builtin(route):
            fix = "rename the file or its folder (built-in routes always win)"
            problems.append((file, RouteError(f"`{route}` is a built-in thread route", fix, "route")))
        elif route.shape in accepted:
            first = accepted[route.shape][0]
            message = f"`{route}` is also defined by endpoints/{first.file}"
            problems.append((file, RouteError(message, "keep one of the two files", "route")))
        else:
            accepted[route.shape] = (route, endpoints[file])
    return Router(accepted.values()), problems
