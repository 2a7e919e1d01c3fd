"""Stream tokens: exact age, scope, and nothing but this server's."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from app import errors, tokens
from app.keys import Principal

WHO = Principal(user_id="ivy", admin=False, key_id=None)


def test_a_token_is_refused_as_soon_as_it_is_older_than_its_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    fernet = Fernet(Fernet.generate_key())
    now = 1_000_000.9  # late in a whole second: Fernet's own timestamp says 1_000_000
    monkeypatch.setattr("app.tokens.time.time", lambda: now)
    token = tokens.mint(fernet, WHO, "t1")
    now += 1.9
    assert tokens.read(fernet, token, "t1", 2) == WHO
    now += 0.2  # 2.1 s old: Fernet alone (whole seconds) would still take it
    with pytest.raises(errors.Unauthorized, match="expired"):
        tokens.read(fernet, token, "t1", 2)


def test_a_token_opens_only_its_own_scope_and_only_on_its_server() -> None:
    fernet = Fernet(Fernet.generate_key())
    token = tokens.mint(fernet, WHO, "t1")
    with pytest.raises(errors.Unauthorized, match="another stream"):
        tokens.read(fernet, token, "t2", 60)
    with pytest.raises(errors.Unauthorized, match="not valid"):
        tokens.read(Fernet(Fernet.generate_key()), token, "t1", 60)
    with pytest.raises(errors.Unauthorized, match="not valid"):
        tokens.read(fernet, "x" + token, "t1", 60)
