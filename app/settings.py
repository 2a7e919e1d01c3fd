"""Settings, read once from the environment (and `.env`), then passed explicitly."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from dotenv import dotenv_values
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app import dsn

ENV_FILE = Path(".env")  # read from the working directory, below the environment
DEFAULT_TOOL_TIMEOUT = 300.0  # seconds
KEY_FORMAT = re.compile(r"sa_[A-Za-z0-9_-]{32,200}")  # what `agents keys create` makes: `sa_` + 43 random characters
MAKE_A_KEY = "python3 -c 'import secrets; print(\"sa_\" + secrets.token_urlsafe(32))'"


class Settings(BaseSettings):
    """Every knob of the runtime; the only reader of `os.environ`."""

    model_config = SettingsConfigDict(env_file=ENV_FILE, extra="ignore")

    database_url: str | None = Field(
        default=None, description="Postgres URL (libpq's sslmode and friends in its query); unset = embedded Postgres"
    )
    database_direct_url: str | None = Field(
        default=None,
        description="when DATABASE_URL is a pooler in transaction mode (PgBouncer, Supabase's or Neon's pooler): a "
        "direct Postgres URL for what needs a session of its own (LISTEN, migrations); unset: DATABASE_URL is direct",
    )
    agents_dir: Path = Field(default=Path("agents"), description="folder of agents, prompts, models, tools")
    data_dir: Path = Field(default=Path(".data"), description="embedded Postgres data and the generated key")
    secret_key: str | None = Field(default=None, description="encrypts secrets at rest")
    admin_api_key: SecretStr | None = Field(
        default=None,
        description="an admin key of the operator's choosing, stored (hashed) for user `admin` by `agents migrate` "
        "and at API start-up if it is not stored yet; one revoked stays revoked",
    )
    worker_heartbeat_file: Path | None = Field(
        default=None, description="a file each worker rewrites every few seconds, read by `agents health worker`"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="the least severe log lines the processes write"
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="`json`: one JSON object per line (time, level, logger, message, exception)"
    )
    access_log: bool = Field(default=True, description="one log line per HTTP request (off: fewer lines, less CPU)")
    log_requests: Literal["brief", "full"] | None = Field(
        default=None,
        description="what each model call's `logs` row keeps of its request: `brief` (model, tool names, message "
        "count, the last message's start) or `full` (every message, the tools offered, the settings; secrets masked; "
        "about the size of the request sent, per call); unset: `full` under `agents serve` when it serves the "
        "playground, `brief` otherwise",
    )
    keep_alive_seconds: int = Field(
        default=75,
        ge=1,
        description="how long an idle client connection is kept open; longer than clients and proxies keep theirs, "
        "so a request is never sent on a connection the server is closing",
    )
    host: str = "127.0.0.1"
    port: int = 8000
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="web origins whose pages may call the API (comma-separated, e.g. `https://app.example.com`; "
        "`*` for any); empty: none",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="in open mode, host names served besides loopback ones (comma-separated): any other `Host` is "
        "refused, so a web page cannot reach the API by DNS rebinding",
    )
    public_url: str | None = Field(
        default=None,
        description="the server's address as clients reach it (`https://agents.example.com`, a path prefix allowed): "
        "the base of the full URLs the API makes of absolute paths (agent icons); unset: each request's own base URL",
    )
    playground: bool | None = Field(
        default=None, description="serve the browser playground at `/`; unset: on when the API binds to loopback"
    )
    worker_concurrency: int = Field(
        default=1000,
        ge=1,
        description="thread executions at once per worker process; one waiting on a model costs memory (~50 KB), "
        "not CPU nor a database connection",
    )
    worker_active: int = Field(
        default=50,
        ge=1,
        description="of a worker's executions, those at once that are not waiting on a model (opening and closing "
        "steps, running tools): the bound for CPU-bound work; the others wait on their model, or for a turn",
    )
    lease_seconds: float = Field(default=10.0, gt=0)
    poll_interval: float = Field(default=1.0, gt=0)
    watchdog_seconds: float = Field(
        default=120.0, gt=0, description="a worker whose event loop is stuck this long exits, so its leases pass on"
    )
    tool_concurrency: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="tool calls of one answer that run at once when its prompt sets `parallel_tool_calls` "
        "(children and handoffs are not counted)",
    )
    tool_timeout: float = Field(
        default=DEFAULT_TOOL_TIMEOUT, gt=0, description="seconds a tool call may run (a tool's own `timeout` wins)"
    )
    max_session_steps: int = Field(default=250, ge=1)
    db_pool_size: int = Field(
        default=20,
        ge=1,
        description="connections in each process's pool (the API's, a worker's: executions hold one only inside a "
        "transaction, never while they wait on a model or a tool), each kept open once opened",
    )
    migrate_on_start: bool = True
    stream_token_seconds: float = Field(
        default=900.0, gt=0, description="how long a stream token (`POST /stream-tokens`) may open a stream"
    )
    sse_buffer: int = Field(default=1000, ge=1, description="live events a stream may lag before it is cut off")
    sse_send_timeout: float = Field(
        default=30.0, gt=0, description="seconds a stream waits for a client that stopped reading, then drops it"
    )
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, description="largest request body accepted")
    max_file_bytes: int = Field(default=50 * 1024 * 1024, ge=1024, description="largest file a thread may store")
    env_max_variables: int = Field(
        default=200, ge=1, description="variables one thread, user or the instance may hold (and one request set)"
    )
    env_max_value_bytes: int = Field(default=64 * 1024, ge=1, description="largest variable value, in UTF-8 bytes")
    event_retention_days: float = Field(default=7.0, gt=0, description="how long stored events are kept")
    log_retention_days: float = Field(
        default=30.0, gt=0, description="how long stored logs (LLM requests, tool calls, hook errors) are kept"
    )
    metric_retention_days: float = Field(
        default=30.0, gt=0, description="how long a metrics series no worker added to is kept (then it restarts at 0)"
    )
    set_aside_retention_days: float = Field(
        default=30.0, gt=0, description="how long input set aside because its delivery kept failing is kept"
    )
    effect_retention_days: float = Field(
        default=7.0, gt=0, description="how long a finished effect (done, failed, cancelled) is kept"
    )
    cleanup_interval: float = Field(default=300.0, gt=0, description="seconds between retention sweeps (workers)")
    metrics_flush_seconds: float = Field(
        default=5.0, gt=0, description="seconds between a worker's additions of its counts to the metrics totals"
    )
    blob_grace_seconds: float = Field(
        default=3600.0, ge=0, description="how long file content no file points at is kept before it is deleted"
    )
    llm_attempts: int = Field(default=2, ge=1, description="attempts per model before its fallbacks")
    llm_first_chunk_timeout: float = Field(default=120.0, gt=0, description="seconds to wait for a first chunk")
    llm_stall_timeout: float = Field(default=45.0, gt=0, description="seconds a stream may pause between chunks")
    llm_backoff: float = Field(default=1.0, ge=0, description="seconds before a retry; doubles with each attempt")
    llm_max_delay: float = Field(default=60.0, ge=0, description="the longest retry wait, even for Retry-After")
    process_env: dict[str, str] = Field(default_factory=lambda: dict(os.environ), exclude=True)

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        return dsn.normalise(value) if value else None

    @property
    def pooled(self) -> bool:
        """Whether `database_url` is a pooler in transaction mode: `database_direct_url` is set beside it."""
        return self.database_direct_url is not None

    @property
    def session_url(self) -> str | None:
        """The URL for what needs a session of its own (LISTEN, migrations): the direct one when there is one."""
        return self.database_direct_url or self.database_url

    @field_validator("worker_heartbeat_file", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("admin_api_key", mode="before")
    @classmethod
    def _key_format(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # compose passes an unset variable as ""
        plain = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not isinstance(plain, str) or not KEY_FORMAT.fullmatch(plain):
            raise ValueError(
                "must be `sa_` followed by 32 to 200 letters, digits, `-` or `_` (the format of the keys "
                f"`agents keys create` makes); make one with: {MAKE_A_KEY}"
            )
        return plain

    @field_validator("public_url", mode="before")
    @classmethod
    def _base_url(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # compose passes an unset variable as ""
        if not isinstance(value, str):
            return value
        url = value.strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError("must be an http(s) URL without a query or fragment, e.g. `https://agents.example.com`")
        return url.rstrip("/")

    @field_validator("allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip().lower().rstrip("/") for item in value.split(",") if item.strip()]
        return value

    def origin(self, field: str) -> str:
        """Where a setting's value came from, for messages: the environment, else the `.env` file (by its path)."""
        name = field.upper()
        if any(key.upper() == name for key in self.process_env):
            return "the environment"
        if ENV_FILE.is_file() and name in {key.upper() for key in dotenv_values(ENV_FILE)}:
            return str(ENV_FILE.resolve())
        return "the settings"

    def serving(self, with_worker: bool) -> Settings:
        """The settings `agents serve` (`with_worker`) or `agents api` runs with: an unset `LOG_REQUESTS` is `full`
        where `agents serve` serves the playground (a developer's machine), else `brief`."""
        if self.log_requests is not None:
            return self
        full = with_worker and self.playground_enabled
        return self.model_copy(update={"log_requests": "full" if full else "brief"})

    @property
    def loopback(self) -> bool:
        """Whether the API binds only to this machine."""
        return is_loopback(self.host)

    @property
    def playground_enabled(self) -> bool:
        """Whether `/` serves the playground: `PLAYGROUND` when set, else whether the API binds to loopback."""
        return self.loopback if self.playground is None else self.playground


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
