"""Service benchmark (issue 7 item 4): the request-creation API under load, and the audit chain.

API: gunicorn serving deletion.wsgi on a fresh PostgreSQL database, loaded
with ``wrk`` for the same number of seconds and connections on
``POST /api/v1/requests`` (a new subject per request, so every call writes a
request, its blind index rows and an audit event) and on ``GET /healthz``
(the same stack's trivial endpoint: one ``SELECT 1``).

Audit chain: ``n`` valid, chained events are generated with the domain's own
hash function and bulk-loaded with COPY, then ``audit_verify`` walks them all (the
full walk, goal 100,000 events/s); then a keyed seal is placed ``TAIL`` events before
the head and the incremental check (``audit_seals_verify``, what the audit page and
the sealer run) is timed and its rows counted: it must read the tail only.

Certificate chain: ``n`` signed, chained certificates are generated with the domain's
chain arithmetic and an Ed25519 bench key and bulk-loaded with COPY; the full walk
(``certificate_chain_check(full=True)``: every hash and signature) is timed, then a
signed verified head is placed ``CERTIFICATE_TAIL`` certificates before the head and
the incremental check (what the certificate page and the API run) is timed and its
rows counted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.assets import REPO_ROOT
from bench.console import Console
from bench.results import measure
from bench.settings import BenchSettings

logger = logging.getLogger(__name__)

POSTGRES_SERVER_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
WRK = shutil.which("wrk") or "/usr/bin/wrk"

# Goals of issue 15 (the service under load), printed beside the figures.
GOALS = {"create_vs_trivial": 0.5, "create_p99_ms": 50.0, "audit_events_per_s": 100_000.0}
TAIL = 1000
CERTIFICATE_TAIL = 100
MAX_CERTIFICATES = 20_000

# Every wrk thread has its own Lua state with the same unseeded random numbers, so the
# thread's number is part of the name: a new subject per request, never a repeat of the
# other thread's (which the blind index would match, reading the earlier request back).
CREATE_LUA = """
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("thread_number", threads)
end
counter = 0
request = function()
  counter = counter + 1
  local body = string.format('{"name": "Bench Subject %%d-%%d-%%d", "ground": "17(1)(b)", '
    .. '"received_at": "2026-11-01", "model_name": "%(model)s", "priority": "batch"}',
    thread_number or 0, counter, math.random(1, 1000000000))
  return wrk.format("POST", "/api/v1/requests", {["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer %(token)s", ["Host"] = "127.0.0.1"}, body)
end
"""


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty PostgreSQL database (dropped afterwards); yields its SQLAlchemy URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    server = make_url(POSTGRES_SERVER_URL)
    name = f"erasure_bench_{uuid.uuid4().hex[:10]}"

    def admin() -> Any:
        return psycopg.connect(host=server.host, port=server.port or 5432, user=server.username,
                               password=server.password, dbname=server.database or "postgres",
                               autocommit=True, connect_timeout=5)

    with admin() as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"gunicorn did not answer {url} within {timeout:.0f} s")


_LATENCY = re.compile(r"^\s+(50|75|90|99)(?:\.000)?%\s+([0-9.]+)(us|ms|s)\s*$", re.M)
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(text: str) -> dict[str, Any]:
    """Requests/s, latency percentiles (ms), request and non-2xx counts from `wrk --latency`."""
    rate = re.search(r"Requests/sec:\s+([0-9.]+)", text)
    total = re.search(r"(\d+) requests in", text)
    if rate is None or total is None:
        raise ValueError(f"unexpected wrk output: {text[-300:]!r}")
    latency = {f"p{p}_ms": float(v) * _UNIT[u] for p, v, u in _LATENCY.findall(text)}
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errors = re.search(r"Socket errors:(.*)", text)
    return {"requests_per_s": float(rate.group(1)), "requests": int(total.group(1)), **latency,
            "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": errors.group(1).strip() if errors else None}


def _wrk(url: str, *, seconds: int, connections: int, script: Path | None = None) -> dict[str, Any]:
    command = [WRK, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "10s"]
    if script is not None:
        command += ["-s", str(script)]
    done = subprocess.run([*command, url], capture_output=True, text=True, timeout=seconds + 60, check=True)
    return parse_wrk(done.stdout)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pids: set[int] | None, command: bytes) -> float:
    """User + system CPU seconds so far of the processes in `pids` and their children (None:
    every process whose command line starts with `command`), from /proc."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:  # the process ended meanwhile
            continue
        pid, parent = int(entry), int(fields[1])
        if (pids is not None and (pid in pids or parent in pids)) or (pids is None and cmdline.startswith(command)):
            total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def _wrk_with_cpu(url: str, *, server: int, seconds: int, connections: int,
                  script: Path | None = None) -> dict[str, Any]:
    """`_wrk`, plus the CPU milliseconds per request the server (gunicorn's arbiter and workers)
    and PostgreSQL (every `postgres` process: the backends, the WAL writer ...) spent: on a
    machine that runs both, these decide the ratio of two endpoints' rates.  None where /proc
    cannot be read."""
    readable = Path("/proc/self/stat").is_file()
    before = (_cpu_seconds({server}, b""), _cpu_seconds(None, b"postgres")) if readable else None
    out = _wrk(url, seconds=seconds, connections=connections, script=script)
    if before is not None and out["requests"]:
        after = (_cpu_seconds({server}, b""), _cpu_seconds(None, b"postgres"))
        out["cpu_ms_per_request"] = {name: 1000 * (b - a) / out["requests"]
                                     for name, a, b in zip(("server", "postgres"), before, after, strict=True)}
    return out


WARM_UP_BURST_S = 2
WARM_UP_BURSTS = 8
WARM_UP_AGREEMENT = 0.10


def _warm_up(url: str, *, connections: int) -> list[float]:
    """Short wrk bursts until two in a row agree within 10 % (at most 8); their rates.

    wrk keeps its connections open, and gunicorn answers the first request as soon as one
    worker is up: the other may still be importing the views.  A run that starts then
    holds all its connections on that one worker to its end (seen with `ss`: 4 of 4
    connections on one worker pid, 591 req/s; the next run spread 2 / 2, 1,186 req/s), so
    the first figure measured half the server.  Bursts until the rate is steady make sure
    every worker is serving before either endpoint is measured."""
    rates: list[float] = []
    for _ in range(WARM_UP_BURSTS):
        rates.append(_wrk(url, seconds=WARM_UP_BURST_S, connections=connections)["requests_per_s"])
        if len(rates) >= 2 and abs(rates[-1] - rates[-2]) <= WARM_UP_AGREEMENT * max(rates[-2:]):
            break
    return rates


def api_throughput(settings: BenchSettings, *, work: Path, console: Console) -> dict[str, Any]:
    if not Path(WRK).is_file():
        raise FileNotFoundError("wrk is not installed")
    work.mkdir(parents=True, exist_ok=True)
    with fresh_database() as url:
        var = work / "api-var"
        shutil.rmtree(var, ignore_errors=True)
        env = {**os.environ, "DATABASE_URL": url, "VAR_DIR": str(var), "DEBUG": "0",
               "ALLOWED_HOSTS": "127.0.0.1,localhost", "DJANGO_SETTINGS_MODULE": "deletion.settings"}
        with console.task("migrate a fresh PostgreSQL database"):
            subprocess.run([sys.executable, "manage.py", "migrate_all"], cwd=REPO_ROOT, env=env, check=True,
                           capture_output=True, timeout=300)
            setup = subprocess.run([sys.executable, "-m", "bench.service_setup"], cwd=REPO_ROOT, env=env,
                                   check=True, capture_output=True, text=True, timeout=120)
        ids = json.loads(setup.stdout.strip().splitlines()[-1])
        script = work / "create_request.lua"
        script.write_text(CREATE_LUA % ids, encoding="utf-8")
        port = _free_port()
        gunicorn = shutil.which("gunicorn", path=str(Path(sys.executable).parent)) or "gunicorn"
        log = (work / "gunicorn.log").open("wb")
        process = subprocess.Popen(
            [gunicorn, "deletion.wsgi:application", "-w", str(settings.gunicorn_workers), "-b", f"127.0.0.1:{port}",
             "--log-level", "warning"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_ready(base + "/healthz", process)
            out: dict[str, Any] = {"gunicorn_workers": settings.gunicorn_workers, "seconds": settings.wrk_seconds,
                                   "connections": settings.wrk_connections}
            with console.task("warm up until two bursts on /healthz agree"):
                out["warm_up_requests_per_s"] = _warm_up(base + "/healthz", connections=settings.wrk_connections)
            with console.task(f"wrk GET /healthz ({settings.wrk_seconds} s)"):
                out["trivial"] = _wrk_with_cpu(base + "/healthz", server=process.pid, seconds=settings.wrk_seconds,
                                               connections=settings.wrk_connections)
            with console.task(f"wrk POST /api/v1/requests ({settings.wrk_seconds} s)"):
                out["create_request"] = _wrk_with_cpu(base + "/api/v1/requests", server=process.pid,
                                                      seconds=settings.wrk_seconds,
                                                      connections=settings.wrk_connections, script=script)
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()
        out["create_request"]["rows_written"], out["create_request"]["distinct_subjects"] = _count_requests(url)
        shutil.rmtree(var, ignore_errors=True)
    out["create_vs_trivial"] = out["create_request"]["requests_per_s"] / out["trivial"]["requests_per_s"]
    out["goals"] = {k: GOALS[k] for k in ("create_vs_trivial", "create_p99_ms")}
    if out["create_request"]["non_2xx"]:
        logger.warning("%s request-creation calls were refused", out["create_request"]["non_2xx"])
    return out


def _count_requests(url: str) -> tuple[int, int]:
    """Requests written, and how many distinct subjects (blind indexes) they name."""
    from sqlalchemy import distinct, func, select

    from deletion.domain.db import make_engine
    from deletion.domain.models import ErasureRequest

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            rows, subjects = connection.execute(select(
                func.count(), func.count(distinct(ErasureRequest.subject_hmac)))).one()
            return int(rows), int(subjects)
    finally:
        engine.dispose()


def _chained_rows(n: int) -> Iterator[tuple[Any, ...]]:
    from deletion.domain.audit import audit_event_hash
    from deletion.domain.canonical import GENESIS_HASH, canonical_json

    prev = GENESIS_HASH
    start = datetime(2026, 1, 1, tzinfo=UTC)
    actions = ("request.submitted", "request.approved", "job.stage", "certificate.issued")
    for seq in range(1, n + 1):
        at = start + timedelta(seconds=seq)
        action = actions[seq % len(actions)]
        details = canonical_json({"n": seq, "ref": f"ER-2026-{seq:08d}"})
        digest = audit_event_hash(seq=seq, at=at, actor="system:bench", action=action, object_type="request",
                                  object_ref=f"ER-2026-{seq:08d}", details=details, prev_hash=prev)
        yield (seq, at, "system:bench", action, "request", f"ER-2026-{seq:08d}", details, prev, digest)
        prev = digest


def audit_chain(settings: BenchSettings, *, console: Console) -> dict[str, Any]:
    import psycopg
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import Session

    from deletion.domain.audit import audit_verify
    from deletion.domain.db import make_engine
    from deletion.domain.migrate import upgrade

    n = settings.audit_events
    with fresh_database() as url:
        upgrade(url)
        u = make_url(url)
        with console.task(f"write {n:,} chained audit events"):
            started = time.perf_counter()
            with psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, password=u.password,
                                 dbname=u.database) as connection:
                last = ("", "")
                with connection.cursor() as cursor, cursor.copy(
                        "COPY audit_events (seq, at, actor, action, object_type, object_ref, details, prev_hash, hash)"
                        " FROM STDIN") as copy:
                    for row in _chained_rows(n):
                        copy.write_row(row)
                        last = (row[0], row[-1])
                connection.execute("INSERT INTO chain_heads (name, seq, hash) VALUES ('audit', %s, %s)", last)
                connection.commit()
            write_s = time.perf_counter() - started
        engine = make_engine(url)
        try:
            with console.task(f"audit_verify over {n:,} events"), Session(engine) as session:
                started = time.perf_counter()
                verdict = audit_verify(session)
                verify_s = time.perf_counter() - started
            with console.task(f"check from a seal {TAIL:,} events before the head"):
                incremental = _incremental_check(engine, n)
        finally:
            engine.dispose()
    if verdict.checked != n:
        raise RuntimeError(f"audit_verify checked {verdict.checked} of {n} events: {verdict.reason}")
    return {"events": n, "ok": verdict.ok, "reason": verdict.reason, "write_s": write_s, "verify_s": verify_s,
            "events_per_s": n / verify_s, "goal_events_per_s": GOALS["audit_events_per_s"],
            "backend": "postgresql", "incremental": incremental}


def _incremental_check(engine: Any, n: int) -> dict[str, Any]:
    """Seal the chain TAIL events before its head (a bench key), then time the check a
    page or the sealer runs: it must recompute the tail and nothing before it."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from deletion.domain.db import session_scope
    from deletion.domain.models import AuditEvent, AuditSeal
    from deletion.domain.seals import SealKeys, audit_seals_verify, seal_mac

    keys = SealKeys(b"bench-seal-key-0123456789abcdef!")
    sealed_seq = max(n - TAIL, 1)
    with session_scope(engine) as session:
        chain_hash = session.execute(select(AuditEvent.hash).where(AuditEvent.seq == sealed_seq)).scalar_one()
        moment = datetime.now(UTC)
        session.add(AuditSeal(sealed_seq=sealed_seq, chain_hash=chain_hash, key_id=keys.key_id, sealed_at=moment,
                              mac=seal_mac(keys.current, sealed_seq=sealed_seq, chain_hash=chain_hash,
                                           key_id_=keys.key_id, sealed_at=moment)))
    with Session(engine) as session:
        started = time.perf_counter()
        check = audit_seals_verify(session, keys=keys)
        seconds = time.perf_counter() - started
    return {"ok": check.ok, "events_read": check.checked, "tail": n - sealed_seq, "seconds": seconds,
            "problems": list(check.problems)}


def _certificate_rows(n: int, signer: Any) -> Iterator[tuple[Any, ...]]:
    """Certificates 1..n as stored rows (seq, certificate_id, payload, payload_hash,
    prev_hash, signature, key_id, signed_at, job_id), each chained and signed."""
    from deletion.domain.canonical import GENESIS_HASH, canonical_json
    from deletion.domain.certificates import (
        SCHEMA_VERSION,
        chain_hash_of,
        payload_hash_of,
        plain_value,
    )

    prev = GENESIS_HASH
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for seq in range(1, n + 1):
        signed_at = start + timedelta(seconds=seq)
        certificate_id = f"DC-2026-{seq:06d}"
        text = canonical_json(plain_value({
            "schema": SCHEMA_VERSION, "certificate_id": certificate_id, "seq": seq, "prev_hash": prev,
            "signer_key_id": signer.key_id, "job_id": None, "timestamps": {"signed": signed_at},
            "requests": [{"reference": f"ER-2026-{seq:08d}", "subject_hmac": f"{seq:064x}"}]}))
        payload_hash = payload_hash_of(text)
        chain_hash = chain_hash_of(seq, prev, payload_hash)
        yield (seq, certificate_id, text, payload_hash, prev,
               signer.sign(bytes.fromhex(chain_hash)).hex(), signer.key_id, signed_at, None)
        prev = chain_hash


def certificate_chain(settings: BenchSettings, *, console: Console) -> dict[str, Any]:
    """Certificates verified per second: the full walk, and the check from a signed
    verified head CERTIFICATE_TAIL certificates before the chain head."""
    import psycopg
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import Session

    from deletion.domain.certificate_heads import (
        PAGE_TAIL_LIMIT,
        certificate_chain_check,
        verified_head_sign,
    )
    from deletion.domain.certificates import chain_hash_of
    from deletion.domain.db import make_engine, session_scope
    from deletion.domain.migrate import upgrade
    from deletion.domain.models import Certificate
    from deletion.domain.signing import KeyRing, Signer

    n = max(min(settings.audit_events // 20, MAX_CERTIFICATES), CERTIFICATE_TAIL + 1)
    signer = Signer.from_private_key(Ed25519PrivateKey.generate())
    keyring = KeyRing({signer.key_id: signer.public_key})
    with fresh_database() as url:
        upgrade(url)
        u = make_url(url)
        with console.task(f"write {n:,} signed, chained certificates"):
            with psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, password=u.password,
                                 dbname=u.database) as connection:
                last: tuple[int, str] = (0, "")
                with connection.cursor() as cursor, cursor.copy(
                        "COPY certificates (seq, certificate_id, payload, payload_hash, prev_hash, signature,"
                        " key_id, signed_at, job_id) FROM STDIN") as copy:
                    for row in _certificate_rows(n, signer):
                        copy.write_row(row)
                        last = (row[0], chain_hash_of(row[0], row[4], row[3]))
                connection.execute("INSERT INTO chain_heads (name, seq, hash) VALUES ('certificates', %s, %s)",
                                   last)
                connection.commit()
        engine = make_engine(url)
        try:
            with console.task(f"full walk over {n:,} certificates"), Session(engine) as session:
                started = time.perf_counter()
                full = certificate_chain_check(session, keyring, full=True)
                full_s = time.perf_counter() - started
            verified_seq = n - CERTIFICATE_TAIL
            with session_scope(engine) as session:
                row = session.query(Certificate).filter(Certificate.seq == verified_seq).one()
                session.add(verified_head_sign(
                    signer, verified_seq=verified_seq, from_seq=0, verified_at=datetime.now(UTC),
                    chain_hash=chain_hash_of(verified_seq, row.prev_hash, row.payload_hash)))
            with console.task(f"check from a verified head {CERTIFICATE_TAIL} certificates before the head"), \
                    Session(engine) as session:
                started = time.perf_counter()
                incremental = certificate_chain_check(session, keyring, tail_limit=PAGE_TAIL_LIMIT)
                incremental_s = time.perf_counter() - started
        finally:
            engine.dispose()
    if full.checked != n:
        raise RuntimeError(f"the full walk checked {full.checked} of {n} certificates: {full.reason}")
    return {"certificates": n, "ok": full.ok, "reason": full.reason, "full_s": full_s,
            "full_per_s": n / full_s, "backend": "postgresql",
            "incremental": {"ok": incremental.ok, "mode": incremental.mode, "checked": incremental.checked,
                            "tail": CERTIFICATE_TAIL, "seconds": incremental_s,
                            "per_s": incremental.checked / incremental_s, "reason": incremental.reason}}


def run_service(settings: BenchSettings, *, work: Path, console: Console) -> dict[str, Any]:
    out: dict[str, Any] = {}
    measure(out, "api", lambda: api_throughput(settings, work=work, console=console))
    measure(out, "audit", lambda: audit_chain(settings, console=console))
    measure(out, "certificates", lambda: certificate_chain(settings, console=console))
    return out
