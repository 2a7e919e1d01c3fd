"""The server key: encrypts secret variable values at rest, and (a key derived from it) signs stream tokens."""

from __future__ import annotations

import base64
import hashlib
import secrets

from cryptography.fernet import Fernet, InvalidToken

from app import errors
from app.settings import Settings

INSECURE_KEYS = frozenset({"", "changeme", "change-me", "secret", "dev", "development"})


def server_key(settings: Settings) -> Fernet:
    """The Fernet for secrets: from `SECRET_KEY`, or on loopback a key generated once under `DATA_DIR`."""
    return _fernet(_secret(settings))


def token_key(settings: Settings) -> Fernet:
    """The Fernet that signs stream tokens: derived from the same key, for this use only."""
    return _fernet("stream-tokens:" + _secret(settings))


def _fernet(key: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(key.encode()).digest()))


def _secret(settings: Settings) -> str:
    key = settings.secret_key
    if key is None or key.strip().lower() in INSECURE_KEYS:
        if not settings.loopback:
            raise errors.ConfigError(
                "SECRET_KEY is missing or a default value; set a long random SECRET_KEY to serve beyond loopback"
            )
        path = settings.data_dir / "secret_key"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(48))
            path.chmod(0o600)
        key = path.read_text().strip()
    return key


def encrypt(fernet: Fernet, value: str) -> str:
    return fernet.encrypt(value.encode()).decode()


def decrypt(fernet: Fernet, token: str) -> str:
    try:
        return fernet.decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise errors.ConfigError("a stored secret cannot be decrypted: SECRET_KEY changed?") from exc
