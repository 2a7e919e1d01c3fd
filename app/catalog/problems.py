"""What is wrong (or worth a warning) in an agents folder, and pydantic's errors said as problems."""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_snake

from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition, VariableDefinition

_ROOTS = {m.__name__: m for m in (ModelDefinition, PromptDefinition, AgentDefinition, VariableDefinition)}


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) in the agents folder."""

    file: str
    field: str
    message: str
    fix: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}: " if self.field else f"{self.file}: "
        tag = "warning: " if self.severity == "warning" else ""
        return f"{where}{tag}{self.message} — fix: {self.fix}"


def from_validation(rel: str, exc: ValidationError) -> list[Problem]:
    """One problem per error; union branches that did not apply are left out."""
    located = [(*_walk(_ROOTS.get(exc.title), err["loc"]), err) for err in exc.errors()]
    problems: list[Problem] = []
    for path, owner, err in located:
        deeper = any(p != path and (not path or p.startswith((f"{path}.", f"{path}["))) for p, _, _ in located)
        if err["type"] == "missing":  # pydantic names a missing field by its alias
            path = path.removesuffix(_last(path)) + to_snake(_last(path))
        if not deeper and all(p.field != path for p in problems):
            problems.append(Problem(rel, *_explain(path, owner, err)))
    return problems


def _explain(path: str, owner: type[BaseModel] | None, err: Any) -> tuple[str, str, str]:
    """(field, message, fix) for one pydantic error."""
    key, kind, msg, ctx = _last(path), err["type"], err["msg"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        names = [n for f, info in (owner.model_fields.items() if owner else ()) for n in (f, info.alias) if n]
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        return path, f"unknown field `{key}`", f"remove `{key}`{hint}"
    if kind == "missing":
        return path, f"`{key}` is required", f"add `{key}`"
    if kind == "literal_error":
        return path, msg, f"use one of: {str(ctx.get('expected')).replace(' or ', ', ')}"
    if kind == "union_tag_invalid":
        return path, msg, f"use a `type` of: {ctx.get('expected_tags')}"
    if kind == "value_error":  # a rule of a definition's validator, e.g. "a `dual_ai` agent needs `side_b`"
        text = str(ctx.get("error", msg))
        needs = text.partition(" needs ")[2]
        named = [w for w in (needs or text).split("`")[1::2] if owner is None or _field(owner, w)]
        field = path or (named[0] if named else "")
        if needs:
            return field, text, f"add {needs}"
        return field, text, "keep only one of them" if "not both" in text else f"remove `{field}`"
    return path, msg, f"change `{key}`: {msg[:1].lower()}{msg[1:]}"


def _last(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _field(model: type[BaseModel], key: str) -> Any:
    return next((info for f, info in model.model_fields.items() if key in (f, info.alias)), None)


def _walk(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> tuple[str, type[BaseModel] | None]:
    """The field path as the author wrote it (union branch tags dropped) and the model owning its end."""
    path, tp, owner = "", _strip(model), model
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
            args = typing.get_args(tp)
            tp = _strip(args[0]) if args else None
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            owner, info = tp, _field(tp, item)
            path += f".{item}" if path else item
            tp = _strip(info.annotation) if info else None
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = _branch(tp, item)
        else:  # a dict key, or a place we cannot follow
            path += f".{item}" if path else item
            args = typing.get_args(tp)
            tp = _strip(args[1]) if len(args) == 2 else None
    return path, owner


def _strip(tp: Any) -> Any:
    """`tp` without `Annotated` metadata, and without `None` if it is an optional."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if len(members) == 1:
            return _strip(members[0])
    return tp


def _branch(union: Any, tag: str) -> Any:
    """The member of `union` that a pydantic loc tag (class name, discriminator value, `list[...]`) names."""
    for member in map(_strip, typing.get_args(union)):
        if isinstance(member, type) and issubclass(member, BaseModel):
            discriminator = member.model_fields.get("type")
            if member.__name__ == tag or (discriminator and tag in typing.get_args(discriminator.annotation)):
                return member
        elif tag.split("[")[0] == getattr(typing.get_origin(member), "__name__", None):
            return member
    return None
