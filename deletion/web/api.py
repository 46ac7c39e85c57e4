"""The JSON API under /api/v1/ (django-ninja), described by /api/v1/openapi.json.

Authentication is a bearer token (made under Account in the pages, or with
manage.py create_api_token USER).  A token may do what both its scope (read, submit,
review) and its user's roles allow; a revoked or expired token gets 401 (and the
refusal is audited).  The OpenAPI document and its browser answer only a signed-in
staff member or a valid token.  Every error is {"error": {"message": ..., "field":
...}} with a 4xx status."""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from functools import wraps
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI, Path, Query, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer
from pydantic import BaseModel, Field

from deletion.domain.certificates import certificate_verify_one, parse_payload
from deletion.domain.errors import DomainError, NotFound, ValidationError
from deletion.domain.gdpr import DENIAL_REASONS, GROUNDS
from deletion.domain.services.access import token_event_record
from deletion.domain.services.requests import (
    request_approve,
    request_deny,
    request_file,
)
from deletion.web import selectors
from deletion.web.certificate_status import (
    certificate_chain_status,
    certificate_status,
    chain_summary,
)
from deletion.web.domain_session import domain_engine, domain_session
from deletion.web.forms import MAX_LIST_ITEMS, MAX_NAME, MAX_NOTE, hidden_character_problem
from deletion.web.models import api_token_authenticate, api_token_find
from deletion.web.progress import job_progress_json
from deletion.web.roles import actor_of, user_can

logger = logging.getLogger(__name__)


def _refuse_known_token(plaintext: str, path: str) -> None:
    """A token that exists but was revoked or expired: refuse it, and audit that."""
    token = api_token_find(plaintext)
    if token is not None and token.state() != "active":
        with domain_session() as session:
            token_event_record(session, actor=actor_of(token.user), action="token.refused", hint=token.hint,
                               details={"state": token.state(), "path": path[:100]})


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
        found = api_token_authenticate(token)
        if found is None:
            _refuse_known_token(token, request.path)
            return None
        request.user = found.user
        request.api_token = found  # type: ignore[attr-defined]
        return found.user


def docs_need_a_user(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The API's description is for staff and their tools, not for anyone who asks."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if user_can(request.user, "read"):
            return view(request, *args, **kwargs)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and api_token_authenticate(token.strip()) is not None:
            return view(request, *args, **kwargs)
        response = JsonResponse(error_body("sign in, or send a valid API token"), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="api"'
        return response

    return wrapped


api = NinjaAPI(title="Erasure service API", version="1", auth=TokenAuth(), docs_decorator=docs_need_a_user,
               description="GDPR Art. 17 erasure requests, their progress, and signed deletion certificates.")


def error_body(message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "field": field}}


@api.exception_handler(DomainError)
def on_domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    field = exc.field if isinstance(exc, ValidationError) else None
    return api.create_response(request, error_body(str(exc), field), status=exc.status)


@api.exception_handler(NinjaValidationError)
def on_validation_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    first = exc.errors[0] if exc.errors else {}
    location = [str(p) for p in first.get("loc", ()) if p not in ("body", "payload", "query", "path")]
    message = str(first.get("msg", "invalid input"))
    return api.create_response(request, error_body(message, ".".join(location) or None), status=422)


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = api.create_response(request, error_body("a valid API token is required"), status=401)
    response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return api.create_response(request, error_body(str(exc)), status=exc.status_code)


@api.exception_handler(Http404)
def on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return api.create_response(request, error_body(str(exc) or "not found"), status=404)


def require(request: HttpRequest, capability: str) -> str:
    if not user_can(request.user, capability):
        raise HttpError(403, f"this token's user may not do this ({capability})")
    token = getattr(request, "api_token", None)
    if token is not None and not token.allows(capability):
        raise HttpError(403, f"this token's scope ({token.scope}) does not allow {capability}")
    return actor_of(request.user)


def visible(value: str, field: str, *, multiline: bool = False) -> str:
    problem = hidden_character_problem(value, multiline=multiline)
    if problem is not None:
        raise ValidationError(field, problem)
    return value


# ------------------------------------------------------------------------ schemas


# The request-filing schemas are plain pydantic models, not ninja Schemas: a Schema's wrap
# validator (run in Python) hands pydantic a getter that reads each field through Python
# attribute look-ups, which is for ORM objects and cost a filing 0.13 ms of CPU (57 us in,
# 82 us out) against 10 us validated in pydantic's core; these schemas only ever see the
# JSON body and the dicts the routes build.  Same fields, same constraints, same OpenAPI.
class RequestIn(BaseModel):
    name: str = Field(min_length=1, max_length=MAX_NAME)
    aliases: list[str] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    emails: list[str] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    ground: str = Field(description="Art. 17(1) ground: " + ", ".join(GROUNDS), max_length=40)
    received_at: date
    model_name: str = Field(max_length=100)
    priority: str = Field(default="batch", pattern="^(batch|immediate)$")
    notes: str = Field(default="", max_length=MAX_NOTE)


class DenyIn(Schema):
    reason_code: str = Field(description="one of " + ", ".join(DENIAL_REASONS), max_length=48)
    note: str = Field(default="", max_length=MAX_NOTE)


class JobOut(Schema):
    id: int
    stage: str
    method: str
    outcome: str = Field(description="running, retrying, certified, rejected or dead_lettered")
    step: int | None
    total: int | None
    eta_seconds: float | None
    percent: float | None = Field(description="share of the pipeline done; null once a job ended unfinished")
    attempts: int
    error: str | None


class RequestOut(BaseModel):
    reference: str
    status: str
    ground: str
    model: str
    priority: str
    received_at: datetime
    due_at: datetime
    submitted_by: str
    reviewed_by: str | None
    reason_code: str | None
    earlier_requests: list[str] = []
    job: JobOut | None
    certificate_id: str | None


class CertificateSummary(Schema):
    certificate_id: str
    seq: int
    signed_at: datetime
    key_id: str
    job_id: int | None


class CertificateOut(CertificateSummary):
    payload: str = Field(description="the signed canonical JSON, byte for byte")
    payload_hash: str
    prev_hash: str
    signature: str
    document: dict[str, Any]


class VerificationOut(Schema):
    certificate_id: str
    valid: bool = Field(description="the certificate's own hash and signature verify")
    reason: str | None
    key_id: str
    chain_valid: bool = Field(description="the chain verifies over the stretch this check read")
    chain_checked: int = Field(description="certificates after chain_verified_from recomputed")
    chain_first_bad_seq: int | None
    chain_reason: str | None = Field(description="why the chain does not verify")
    chain_mode: str = Field(description="incremental: from the newest signed verified head; "
                                        "full: from genesis (?full=1, or no trusted head)")
    chain_verified_from: int = Field(description="the seq the walk began after (0: genesis); "
                                                 "rows up to it were not re-read")
    chain_verified_at: datetime | None = Field(description="when the worker signed that verified head")
    chain_head_seq: int = Field(description="the chain head when the check began")
    chain_unchecked: int = Field(description="certificates before the head this read left to the "
                                             "worker's check (a read re-checks at most 1,000)")
    chain_summary: str = Field(description="what was checked, in one sentence")
    chain_warnings: list[str]


class OfflineVerifyIn(Schema):
    payload: str = Field(max_length=1_000_000)
    signature: str = Field(max_length=256)
    public_key_pem: str = Field(max_length=4096)


class OfflineVerifyOut(Schema):
    valid: bool
    reason: str | None
    payload_hash: str


class ServingOut(Schema):
    model: str
    version: int
    digest: str
    directory: str
    status: str
    promoted_at: datetime | None
    certificates: list[str]


class ErrorOut(Schema):
    error: dict[str, Any]


REF = Path(..., pattern=r"^[A-Za-z0-9._-]{1,64}$")
MODEL_NAME = Path(..., max_length=100)

ERRORS: dict[int, type[Schema]] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


# ----------------------------------------------------------------------- routes


def _request_out(session: Any, reference: str, earlier: list[str] | None = None) -> dict[str, Any]:
    row = selectors.request_by_reference(session, reference)
    if row is None:
        raise NotFound(f"no erasure request {reference}")
    jobs = selectors.jobs_of_request(session, row.id)
    job = jobs[-1] if jobs else None
    certificate = selectors.certificate_of_job(session, job.id) if job else None
    return _request_json(row, model_name=row.model.name, job=job, earlier=earlier,
                         certificate_id=certificate.certificate_id if certificate else None)


def _request_json(row: Any, *, model_name: str, job: Any = None, earlier: list[str] | None = None,
                  certificate_id: str | None = None) -> dict[str, Any]:
    return {
        "reference": row.reference, "status": row.status, "ground": row.ground, "model": model_name,
        "priority": row.priority, "received_at": row.received_at, "due_at": row.due_at,
        "submitted_by": row.submitted_by, "reviewed_by": row.reviewed_by, "reason_code": row.reason_code,
        "earlier_requests": earlier or [], "job": job_progress_json(job) if job else None,
        "certificate_id": certificate_id,
    }


@api.post("/requests", response={201: RequestOut, **ERRORS}, tags=["requests"])
def create_request(request: HttpRequest, body: RequestIn) -> HttpResponse:
    """File an erasure request (officer tokens).  `earlier_requests` lists requests the
    blind index matched to the same subject."""
    actor = require(request, "request.submit")
    visible(body.name, "name")
    for field, values in (("aliases", body.aliases), ("emails", body.emails)):
        for value in values:
            if len(value) > MAX_NAME + 54:
                raise ValidationError(field, "an entry is too long")
            visible(value, field)
    visible(body.notes, "notes", multiline=True)
    received = datetime.combine(body.received_at, time(0), tzinfo=UTC)
    # The filing is all its transaction writes: it commits with its last round trip, on a
    # pooled connection of the domain's engine without a Session (request_file).
    filed = request_file(domain_engine(), actor=actor, actor_id=request.user.pk, name=body.name, aliases=body.aliases,
                         emails=body.emails, ground=body.ground, received_at=received, model_name=body.model_name,
                         priority=body.priority, notes=body.notes)
    # A request just filed has no job and no certificate yet: answer from the row in hand
    # instead of reading it back (the service already matched earlier ones).  Rendered as
    # ninja renders a RequestOut, the same bytes (tested), but without validating this dict,
    # built here from the row just written, into the model and dumping it back (half of the
    # answer's CPU, 40-60 us a filing).
    return api.create_response(request, _request_json(filed.request, model_name=body.model_name,
                                                      earlier=list(filed.earlier)), status=201)


@api.get("/requests/{reference}", response={200: RequestOut, **ERRORS}, tags=["requests"])
def get_request(request: HttpRequest, reference: str = REF) -> dict[str, Any]:
    """Status and progress of one request."""
    require(request, "read")
    with domain_session() as session:
        return _request_out(session, reference)


@api.post("/requests/{reference}/approve", response={200: RequestOut, **ERRORS}, tags=["review"])
def approve_request(request: HttpRequest, reference: str = REF) -> dict[str, Any]:
    """Approve (reviewer tokens; never the submitter's own request)."""
    actor = require(request, "request.review")
    with domain_session() as session:
        request_approve(session, actor=actor, actor_id=request.user.pk, reference=reference)
    with domain_session() as session:
        return _request_out(session, reference)


@api.post("/requests/{reference}/deny", response={200: RequestOut, **ERRORS}, tags=["review"])
def deny_request(request: HttpRequest, body: DenyIn, reference: str = REF) -> dict[str, Any]:
    """Deny with a coded Art. 17(3) / Art. 12 reason (reviewer tokens)."""
    actor = require(request, "request.review")
    visible(body.note, "note", multiline=True)
    with domain_session() as session:
        request_deny(session, actor=actor, actor_id=request.user.pk, reference=reference,
                     reason_code=body.reason_code, note=body.note)
    with domain_session() as session:
        return _request_out(session, reference)


@api.get("/certificates", response={200: list[CertificateSummary], **ERRORS}, tags=["certificates"])
def list_certificates(request: HttpRequest) -> list[Any]:
    require(request, "read")
    with domain_session() as session:
        return list(selectors.certificate_page(session))


# Declared before /certificates/{certificate_id}, which would otherwise match "verify".
@api.post("/certificates/verify", response={200: OfflineVerifyOut, **ERRORS}, tags=["certificates"])
def verify_certificate_document(request: HttpRequest, body: OfflineVerifyIn) -> dict[str, Any]:
    """Check a certificate someone holds (payload, hex signature, signer's public key PEM)
    without trusting the database."""
    require(request, "read")
    try:
        check = certificate_verify_one(body.payload, body.signature, body.public_key_pem.encode("utf-8"))
    except (ValueError, TypeError) as exc:
        raise ValidationError("public_key_pem", f"cannot read the public key: {type(exc).__name__}") from None
    return {"valid": check.ok, "reason": check.reason, "payload_hash": check.payload_hash}


@api.get("/certificates/{certificate_id}", response={200: CertificateOut, **ERRORS}, tags=["certificates"])
def get_certificate(request: HttpRequest, certificate_id: str = REF) -> dict[str, Any]:
    require(request, "read")
    with domain_session() as session:
        row = selectors.certificate_by_id(session, certificate_id)
        if row is None:
            raise NotFound(f"certificate {certificate_id} does not exist")
        return {"certificate_id": row.certificate_id, "seq": row.seq, "signed_at": row.signed_at,
                "key_id": row.key_id, "job_id": row.job_id, "payload": row.payload,
                "payload_hash": row.payload_hash, "prev_hash": row.prev_hash, "signature": row.signature,
                "document": parse_payload(row.payload) or {}}


@api.get("/certificates/{certificate_id}/verification", response={200: VerificationOut, **ERRORS},
         tags=["certificates"])
def verify_certificate(request: HttpRequest, certificate_id: str = REF,
                       full: bool = Query(False, description="walk the whole chain from genesis")
                       ) -> dict[str, Any]:
    """Check the stored certificate's hash and signature against the public key ring, and
    the certificate chain from its newest signed verified head to the head (rows before
    that head are not re-read); ``?full=1`` walks the whole chain instead (auditors and
    admins only: it costs seconds on a long chain)."""
    require(request, "read")
    if full and not user_can(request.user, "chain.verify_full"):  # the role decides; a read token suffices
        raise HttpError(403, "only an auditor or an admin may walk the whole chain (chain.verify_full)")
    with domain_session() as session:
        row = selectors.certificate_by_id(session, certificate_id)
        if row is None:
            raise NotFound(f"certificate {certificate_id} does not exist")
        status = certificate_status(row)
        chain = certificate_chain_status(session, full=full)
        return {"certificate_id": row.certificate_id, "valid": status.valid, "reason": status.reason,
                "key_id": row.key_id, "chain_valid": chain.ok, "chain_checked": chain.checked,
                "chain_first_bad_seq": chain.first_bad_seq, "chain_reason": chain.reason,
                "chain_mode": chain.mode, "chain_verified_from": chain.verified_from,
                "chain_verified_at": chain.verified_at, "chain_head_seq": chain.head_seq,
                "chain_unchecked": chain.unchecked,
                "chain_summary": chain_summary(chain), "chain_warnings": list(chain.warnings)}


@api.get("/models/{name}/serving", response={200: ServingOut, **ERRORS}, tags=["models"])
def serving_checkpoint(request: HttpRequest, name: str = MODEL_NAME) -> dict[str, Any]:
    """The checkpoint a serving system must load for this model, and the certificates
    of the erasures it embodies."""
    require(request, "read")
    with domain_session() as session:
        model = selectors.model_by_name(session, name)
        if model is None:
            raise NotFound(f"no model {name}")
        checkpoint = model.serving_checkpoint
        if checkpoint is None:
            raise NotFound(f"model {model.name} has no serving checkpoint")
        certificates = selectors.certificates_by_checkpoint(session, [checkpoint.id]).get(checkpoint.id, [])
        return {"model": model.name, "version": checkpoint.version, "digest": checkpoint.digest,
                "directory": checkpoint.directory, "status": checkpoint.status,
                "promoted_at": checkpoint.promoted_at, "certificates": [c.certificate_id for c in certificates]}


def api_not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other address under /api/: JSON, like every API answer."""
    return JsonResponse(error_body("no such API endpoint"), status=404)
