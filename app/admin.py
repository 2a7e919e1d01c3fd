"""The CLI's administration commands, `agents keys` and `agents env`: a deployment's API keys and variables, each
command one short transaction on its own engine (`app/__main__.py` parses the arguments and calls them)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from app import crypto, db, environment, keys, tables
from app.settings import Settings


async def keys_command(settings: Settings, args: argparse.Namespace) -> None:
    """`agents keys create | adopt-local | list | revoke`: what is to be captured on stdout, the rest on stderr."""
    assert settings.database_url
    engine = db.create_engine(settings.database_url, 1, pooled=settings.pooled)
    try:
        async with db.sessionmaker(engine)() as session, session.begin():
            if args.keys_command == "create":
                row, key = await keys.create(session, args.user, args.admin)
                said = f"created {'admin ' if row.admin else ''}key {row.prefix}… for user {row.user_id}"
                print(said, file=sys.stderr)  # stdout is the key alone: `KEY=$(agents keys create …)`
                adopted = await keys.adopt_open(session, args.user) if args.adopt_local else None
                _say_adopted(adopted, sys.stderr)
                theirs = args.adopt_local or args.user == keys.OPEN.user_id  # a key for `local` sees them already
                if not theirs and (count := await keys.open_threads(session)):
                    print(f"warning: {hidden_threads(count, args.user)}", file=sys.stderr)
                print(key)
            elif args.keys_command == "adopt-local":  # for a user who has a key already
                _say_adopted(await keys.adopt_open(session, args.user), sys.stdout)
            elif args.keys_command == "list":
                rows = await keys.list_all(session)
                if args.json:
                    print(json.dumps([_key_json(row) for row in rows], indent=2))
                    return
                for row in rows:
                    state = f"revoked {row.revoked_at:%Y-%m-%d}" if row.revoked_at else "active"
                    print(f"{row.id}  {row.prefix}…  user={row.user_id}  admin={row.admin}  {state}")
            elif await keys.revoke(session, args.key) == 0:
                raise SystemExit(f"error: no active key matches {args.key!r} (see `agents keys list`)")
            else:
                print("revoked 1 key")
    finally:
        await engine.dispose()


def _key_json(row: tables.ApiKey) -> dict[str, object]:
    """A key as `keys list --json` shows it: never the key, which is not stored."""
    when = {name: value.isoformat() if value else None for name, value in (
        ("created_at", row.created_at), ("last_used_at", row.last_used_at), ("revoked_at", row.revoked_at)
    )}  # fmt: skip
    return {"id": str(row.id), "prefix": row.prefix, "user": row.user_id, "admin": row.admin, **when}


def hidden_threads(count: int, user: str) -> str:
    """What to say of the open-mode threads a new key does not see, and how to give them to `user`."""
    return (
        f"{count} thread(s) made in open mode belong to user {keys.OPEN.user_id!r}: with a key only admin keys see "
        f"them; give them to a user with `agents keys adopt-local --user {user}` (or, with a new key, "
        f"`agents keys create --user {user} --adopt-local`)"
    )


def _say_adopted(adopted: keys.Adopted | None, out: TextIO) -> None:
    if adopted is None:
        return
    print(f"adopted {adopted.threads} open-mode thread(s) and {adopted.variables} user variable(s)", file=out)
    if adopted.kept:
        print(
            f"warning: user variables {', '.join(adopted.kept)} stay with {keys.OPEN.user_id!r}: the user has "
            "their own of the same names",
            file=sys.stderr,
        )


async def env_command(settings: Settings, args: argparse.Namespace) -> None:
    """`agents env set | list | delete`, for the instance or one user (`--user`)."""
    assert settings.database_url
    scope, owner = ("user", args.user) if args.user else ("instance", environment.INSTANCE)
    where = f"user {args.user}" if args.user else "the instance"
    engine = db.create_engine(settings.database_url, 1, pooled=settings.pooled)
    try:
        async with db.sessionmaker(engine)() as session, session.begin():
            if args.env_command == "set":
                values = {args.name: args.value}
                limits = environment.Limits(settings.env_max_variables, settings.env_max_value_bytes)
                environment.check(values, limits)
                secret = {args.name} if args.secret else set()
                fernet = crypto.server_key(settings)
                await environment.put(session, fernet, scope, owner, values, secret, most=limits.variables)
                print(f"set {'secret ' if args.secret else ''}{args.name} for {where}")
            elif args.env_command == "list":
                values, types = await environment.public(session, scope, owner)
                if args.json:  # as `GET /env/user` answers: secrets are null
                    print(json.dumps({"env": values, "env_types": types}, indent=2, ensure_ascii=False))
                    return
                for name, kind in types.items():
                    print(f"{name}={'***' if kind == 'secret' else values[name]}  ({kind})")
            elif await environment.remove(session, scope, owner, [args.name]) == 0:
                raise SystemExit(f"no variable {args.name} for {where}")
            else:
                print(f"deleted {args.name} for {where}")
    finally:
        await engine.dispose()
