"""`DATABASE_URL` as managed Postgres hands it out, on a private Postgres that speaks TLS only (`hostssl` rules, so a
plain connection is refused): `sslmode` with libpq's meanings, `sslrootcert`, `application_name` and `options` on
every connection the runtime opens, and the one-line errors (exit 2) when one cannot be opened."""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import text

from app import db, migrations
from tests.conftest import outside_pytest_temp
from tests.processes import free_port, start, stop, until_ready
from tests.test_cli import agents

pytestmark = pytest.mark.slow  # a Postgres server of its own, and real processes

PASSWORD = "tls-s3cret-pw"
APP_NAME = "agents-tls-test"
AGENT = "from app.spec import define_agent\ndefine_agent(name='a', side_a={'prompt': 'p', 'stop_on_response': True})\n"
PROMPT = "from app.spec import define_prompt\ndefine_prompt(name='p', model='m', prompt='be brief')\n"
MODEL = "from app.spec import define_model\ndefine_model(name='m', provider='test', script=['hello over tls'])\n"


@dataclass
class Tls:
    """A Postgres reached over TLS only at 127.0.0.1:`port`, its certificate issued by `ca` for `localhost` alone;
    role `app` (password `PASSWORD`) owns database `agents`; `admin` is a connection over its Unix socket."""

    port: int
    ca: Path
    other_ca: Path
    admin: str

    def url(self, *, host: str = "127.0.0.1", password: str = PASSWORD, database: str = "agents", **query: str) -> str:
        tail = f"?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}" if query else ""
        return f"postgresql://app:{password}@{host}:{self.port}/{database}{tail}"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, ec.EllipticCurvePrivateKey] | None
) -> x509.Certificate:
    """A certificate for `subject`: a CA's own when `issuer` is None, else a server's for `localhost`."""
    now = datetime.datetime.now(datetime.UTC)
    signer_name, signer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(signer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:  # `localhost` only: a client that checks the host name refuses 127.0.0.1
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return builder.sign(signer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _make_certificates(pgdata: Path, folder: Path, owner: str | None) -> tuple[Path, Path]:
    """The server's certificate and key in `pgdata` (owned by the server's user: Postgres insists), and the CA that
    issued it plus one that did not, in `folder`; (the CA, the other CA)."""
    ca_key, other_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca, other = folder / "ca.crt", folder / "other-ca.crt"
    ca.write_bytes(_pem(_certificate("agents test CA", ca_key, None)))
    other.write_bytes(_pem(_certificate("someone else's CA", other_key, None)))
    (pgdata / "server.crt").write_bytes(_pem(_certificate("localhost", server_key, ("agents test CA", ca_key))))
    key = pgdata / "server.key"
    key.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key.chmod(0o600)
    if owner is not None:
        for path in (key, pgdata / "server.crt"):
            shutil.chown(path, user=owner)
    return ca, other


def _binaries() -> Path | None:
    """The newest system Postgres's programs: the `pgserver` wheel's are built without TLS."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def _run(program: Path, *args: str, user: str | None) -> None:
    subprocess.run([str(program), *args], user=user, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls() -> Iterator[Tls]:
    """A throwaway cluster of its own (the system's is left alone) at a free port, TLS on, `hostssl` rules only."""
    binaries = _binaries()
    if binaries is None:
        pytest.skip("needs a system PostgreSQL (/usr/lib/postgresql/<version>/bin) built with TLS")
    user = "postgres" if os.geteuid() == 0 else None  # initdb refuses to run as root
    for folder in outside_pytest_temp():
        data, port = folder / "data", free_port()
        if user is not None:
            shutil.chown(folder, user=user)
        _run(binaries / "initdb", "-D", str(data), "-U", "postgres", "--auth=trust", user=user)
        ca, other = _make_certificates(data, folder, user)
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{folder}'\n"
            )
        (data / "pg_hba.conf").write_text(
            "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n"  # TCP: TLS and a password only
        )
        _run(binaries / "pg_ctl", "-D", str(data), "-w", "-l", str(folder / "log"), "start", user=user)
        try:
            admin = f"postgresql://postgres@/postgres?host={folder}&port={port}"
            asyncio.run(_add_app_role(admin))
            yield Tls(port, ca, other, admin)
        finally:
            _run(binaries / "pg_ctl", "-D", str(data), "-w", "-m", "immediate", "stop", user=user)


async def _add_app_role(admin: str) -> None:
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f"CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'")
        await conn.execute("CREATE DATABASE agents OWNER app")
    finally:
        await conn.close()


async def _backends(admin: str) -> list[asyncpg.Record]:
    """The server's connections of role `app` but this one: application name, TLS, last statement."""
    conn = await asyncpg.connect(admin)
    try:
        return await conn.fetch(
            "SELECT a.application_name, s.ssl, a.query FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.usename = 'app' AND a.pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()


def _agents_dir(tmp_path: Path) -> Path:
    root = tmp_path / "agents"
    for folder, source in (("agents", AGENT), ("prompts", PROMPT), ("models", MODEL)):
        (root / folder).mkdir(parents=True)
        (root / folder / "a.py").write_text(source)
    return root


async def test_migrate_then_a_turn_through_the_api_and_the_worker_over_sslmode_require(
    tls: Tls, tmp_path: Path
) -> None:
    """Every connection `agents serve` opens (API pool, worker pool, both LISTEN connections, the claimer, the
    heartbeat) goes over TLS with the URL's `application_name`."""
    url = tls.url(sslmode="require", application_name=APP_NAME)
    migrated = agents("migrate", env={"DATABASE_URL": url})
    assert migrated.returncode == 0, migrated.stderr
    port, log = free_port(), tmp_path / "serve.log"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")},
        "DATABASE_URL": url,
        "AGENTS_DIR": str(_agents_dir(tmp_path)),
        "DATA_DIR": str(tmp_path / "data"),
        "LEASE_SECONDS": "3",  # a heartbeat (and its connection) every second
    }
    server = start(["serve", "--port", str(port)], env, log)
    try:
        base = f"http://127.0.0.1:{port}"
        await until_ready(base, server, log)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            created = await client.post("/threads", json={"agent": "a"})
            assert created.status_code == 201, created.text
            tid = created.json()["id"]
            posted = await client.post(f"/threads/{tid}/messages", json={"content": "hi"}, params={"wait": 30})
            assert posted.status_code == 200 and posted.json()["done"], posted.text
            said = [m["content"] for m in posted.json()["messages"] if m["role"] == "assistant"]
            assert said == ["hello over tls"], posted.text
        for _ in range(100):  # the heartbeat's connection opens at its first beat
            backends = await _backends(tls.admin)
            if len(backends) >= 6 and sum(r["query"].startswith("LISTEN") for r in backends) >= 2:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"connections: {backends}\n{log.read_text()}")
        assert {(r["application_name"], r["ssl"]) for r in backends} == {(APP_NAME, True)}, backends
    finally:
        assert stop(server) == 0, log.read_text()


async def test_verify_full_with_the_issuing_ca_migrates_and_carries_application_name_and_options(tls: Tls) -> None:
    url = tls.url(
        host="localhost",
        sslmode="verify-full",
        sslrootcert=str(tls.ca),
        application_name=APP_NAME,
        options="-c work_mem=7MB -c search_path=public",
        connect_timeout="10",
    )
    engine = db.create_engine(url, 1)
    try:
        await migrations.upgrade(engine)
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT current_setting('work_mem'), current_setting('application_name'), ssl "
                        "FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                    )
                )
            ).one()
        assert tuple(row) == ("7MB", APP_NAME, True)
    finally:
        await engine.dispose()
    raw = await db.connect(url)
    try:
        assert await raw.fetchval("SHOW work_mem") == "7MB"
        assert await raw.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
    finally:
        await raw.close()


async def test_sslmodes_mean_what_libpq_means(tls: Tls) -> None:
    """`verify-ca` checks the issuer only; `verify-full` the host name too (the certificate names `localhost`, not
    127.0.0.1); `require` with an `sslrootcert` checks the issuer as `verify-ca` does; `prefer` and `require`
    without one take any certificate; `disable` is refused by this server's `hostssl` rules."""

    async def outcome(**query: str) -> str:
        try:
            conn = await db.connect(tls.url(**query))
        except db.Unreachable as exc:
            return str(exc)
        await conn.close()
        return "ok"

    right, wrong = str(tls.ca), str(tls.other_ca)
    assert await outcome(sslmode="prefer") == "ok"
    assert await outcome(sslmode="require") == "ok"
    assert await outcome(sslmode="verify-ca", sslrootcert=right) == "ok"
    assert await outcome(sslmode="verify-full", sslrootcert=right, host="localhost") == "ok"
    assert "certificate is not trusted" in await outcome(sslmode="verify-full", sslrootcert=right)  # 127.0.0.1
    assert "certificate is not trusted" in await outcome(sslmode="verify-ca", sslrootcert=wrong)
    assert "certificate is not trusted" in await outcome(sslmode="require", sslrootcert=wrong)
    assert "no encryption" in await outcome(sslmode="disable")


def _refused(url: str) -> str:
    """`agents migrate`'s one line for a URL it cannot connect to (exit 2, no traceback)."""
    result = agents("migrate", env={"DATABASE_URL": url})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert "DATABASE_URL" in result.stderr
    return result.stderr


def test_verify_full_with_another_ca_is_one_line_naming_database_url(tls: Tls) -> None:
    said = _refused(tls.url(host="localhost", sslmode="verify-full", sslrootcert=str(tls.other_ca)))
    assert "certificate is not trusted" in said and PASSWORD not in said


def test_a_wrong_password_is_one_line_that_never_prints_a_password(tls: Tls) -> None:
    said = _refused(tls.url(password="not-the-password", sslmode="require"))
    assert 'password authentication failed for user "app"' in said
    assert "not-the-password" not in said and PASSWORD not in said
