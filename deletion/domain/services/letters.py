"""The reply to the data subject (Art. 12(3) and 12(4)), from editable templates.

One template per language and outcome (``completed``: what was done and when, the
certificate and how anyone checks it offline, the limits of approximate unlearning;
``refused``: the reasons, and the rights to complain to a supervisory authority and to
seek a judicial remedy).  English and German ship as defaults; an officer's edits are
stored as new versions.  A template may use only the placeholders listed here: an
unknown one is refused on save, naming it.

The subject's name is the one piece of personal data in a letter: it is decrypted only
to render, never stored with the letter, and never written to a log or an audit row
(the audit records the reference, language, format and template version).
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from deletion.domain.audit import audit_append
from deletion.domain.errors import DomainError, NotFound, ValidationError
from deletion.domain.gdpr import DENIAL_REASONS
from deletion.domain.models import Certificate, Job, JobRequest, LetterTemplate, utcnow
from deletion.domain.services.requests import request_get, subject_identifiers
from deletion.domain.states import RequestStatus

LANGUAGES = {"en": "English", "de": "Deutsch"}
KINDS = ("completed", "refused")
MAX_SUBJECT = 200
MAX_BODY = 20_000

PLACEHOLDERS: dict[str, str] = {
    "subject_name": "the data subject's name, as the officer entered it",
    "reference": "the request's reference (ER-...)",
    "received_date": "when the request was received",
    "due_date": "the deadline in force (Art. 12(3))",
    "decision_date": "when the erasure was completed, or the request refused",
    "controller": "the controller's name (setting CONTROLLER_NAME)",
    "model": "the model the data was erased from",
    "certificate_id": "the deletion certificate's id (completed letters)",
    "certificate_check": "how anyone can check the certificate offline",
    "limits": "the limits of approximate unlearning, in the letter's language",
    "refusal_reason": "the coded reason of a refusal, in words",
    "refusal_note": "the reasons a reviewer recorded for the refusal",
}

LIMITS = {
    "en": ("The erasure used approximate machine unlearning: the model was changed to "
           "remove the influence of your records, not retrained from scratch. We measured "
           "the remaining risk that your data can be extracted against people the model "
           "never saw; these measurements bound the risk for the tests that were run, they "
           "do not prove that no trace remains."),
    "de": ("Für die Löschung wurde approximatives maschinelles Verlernen eingesetzt: Das "
           "Modell wurde so verändert, dass der Einfluss Ihrer Datensätze entfernt ist; es "
           "wurde nicht vollständig neu trainiert. Das verbleibende Risiko, dass Ihre Daten "
           "extrahiert werden können, haben wir im Vergleich mit Personen gemessen, die das "
           "Modell nie gesehen hat. Diese Messungen begrenzen das Risiko für die "
           "durchgeführten Prüfungen; sie beweisen nicht, dass keine Spur verbleibt."),
}
CERTIFICATE_CHECK = {
    "en": ("The certificate {certificate_id} is signed with our Ed25519 key. You, or anyone "
           "acting for you, may ask us for the certificate file and our public key and check "
           "the signature offline with standard tools (the recipe is published with the "
           "service's documentation); no account with us is needed."),
    "de": ("Das Zertifikat {certificate_id} ist mit unserem Ed25519-Schlüssel signiert. Sie "
           "oder eine von Ihnen beauftragte Person können die Zertifikatsdatei und unseren "
           "öffentlichen Schlüssel bei uns anfordern und die Signatur offline mit "
           "Standardwerkzeugen prüfen (die Anleitung ist mit der Dokumentation des Dienstes "
           "veröffentlicht); ein Konto bei uns ist dafür nicht nötig."),
}
REFUSAL_REASONS_DE = {
    "17(3)(a)": "Ausübung des Rechts auf freie Meinungsäußerung und Information (Art. 17 Abs. 3 lit. a DSGVO)",
    "17(3)(b)": "Erfüllung einer rechtlichen Verpflichtung oder einer Aufgabe im öffentlichen Interesse (Art. 17 Abs. 3 lit. b DSGVO)",
    "17(3)(c)": "Gründe des öffentlichen Interesses im Bereich der öffentlichen Gesundheit (Art. 17 Abs. 3 lit. c DSGVO)",
    "17(3)(d)": "Archiv-, Forschungs- oder statistische Zwecke (Art. 17 Abs. 3 lit. d DSGVO)",
    "17(3)(e)": "Geltendmachung, Ausübung oder Verteidigung von Rechtsansprüchen (Art. 17 Abs. 3 lit. e DSGVO)",
    "manifestly_unfounded_or_excessive": "offenkundig unbegründeter oder exzessiver Antrag (Art. 12 Abs. 5 DSGVO)",
    "identity_not_verified": "die Identität der antragstellenden Person konnte nicht bestätigt werden (Art. 12 Abs. 6 DSGVO)",
}

DEFAULT_TEMPLATES: dict[tuple[str, str], tuple[str, str]] = {
    ("en", "completed"): (
        "Your erasure request {reference}: your data has been erased",
        """Dear {subject_name},

on {received_date} you asked us to erase your personal data (Art. 17 GDPR). We have done so: on {decision_date} your records were removed from the training data of our language model "{model}", the model was changed so that it no longer reproduces them, and the new version replaced the old one. Older versions that still held your data are scheduled for destruction.

Our deletion certificate {certificate_id} records what was done, which checks were run and their results.

{certificate_check}

{limits}

If you are not satisfied with how we handled your request, you have the right to lodge a complaint with a supervisory authority (Art. 77 GDPR) and to seek a judicial remedy (Art. 79 GDPR).

Yours sincerely,
{controller}
Reference {reference}""",
    ),
    ("en", "refused"): (
        "Your erasure request {reference}: our decision",
        """Dear {subject_name},

on {received_date} you asked us to erase your personal data (Art. 17 GDPR). On {decision_date} we decided not to erase it, for this reason: {refusal_reason}.

{refusal_note}

You have the right to lodge a complaint with a supervisory authority (Art. 77 GDPR) and to seek a judicial remedy (Art. 79 GDPR) against this decision (Art. 12(4) GDPR).

Yours sincerely,
{controller}
Reference {reference}""",
    ),
    ("de", "completed"): (
        "Ihr Löschantrag {reference}: Ihre Daten wurden gelöscht",
        """Guten Tag {subject_name},

am {received_date} haben Sie die Löschung Ihrer personenbezogenen Daten verlangt (Art. 17 DSGVO). Dem sind wir nachgekommen: Am {decision_date} wurden Ihre Datensätze aus den Trainingsdaten unseres Sprachmodells „{model}" entfernt, das Modell wurde so verändert, dass es sie nicht mehr wiedergibt, und die neue Fassung hat die alte ersetzt. Ältere Fassungen, die Ihre Daten noch enthalten, werden planmäßig vernichtet.

Unser Löschzertifikat {certificate_id} hält fest, was getan wurde, welche Prüfungen liefen und mit welchem Ergebnis.

{certificate_check}

{limits}

Wenn Sie mit der Bearbeitung Ihres Antrags nicht zufrieden sind, haben Sie das Recht, Beschwerde bei einer Aufsichtsbehörde einzulegen (Art. 77 DSGVO) und einen gerichtlichen Rechtsbehelf einzulegen (Art. 79 DSGVO).

Mit freundlichen Grüßen
{controller}
Aktenzeichen {reference}""",
    ),
    ("de", "refused"): (
        "Ihr Löschantrag {reference}: unsere Entscheidung",
        """Guten Tag {subject_name},

am {received_date} haben Sie die Löschung Ihrer personenbezogenen Daten verlangt (Art. 17 DSGVO). Am {decision_date} haben wir entschieden, sie nicht zu löschen, aus folgendem Grund: {refusal_reason}.

{refusal_note}

Sie haben das Recht, gegen diese Entscheidung Beschwerde bei einer Aufsichtsbehörde einzulegen (Art. 77 DSGVO) und einen gerichtlichen Rechtsbehelf einzulegen (Art. 79 DSGVO) (Art. 12 Abs. 4 DSGVO).

Mit freundlichen Grüßen
{controller}
Aktenzeichen {reference}""",
    ),
}


@dataclass(frozen=True)
class TemplateText:
    language: str
    kind: str
    subject: str
    body: str
    version: int  # 0: the shipped default, never edited
    updated_by: str | None


@dataclass(frozen=True)
class RenderedLetter:
    reference: str
    language: str
    kind: str
    subject: str
    paragraphs: tuple[str, ...]
    certificate_id: str | None
    template_version: int

    def __repr__(self) -> str:  # the text holds the subject's name: never in a log line
        return f"RenderedLetter({self.reference}, {self.language}, {self.kind}, <redacted>)"


def template_placeholders(text: str, field: str) -> set[str]:
    """The placeholders ``text`` uses; ValidationError naming the first unknown or
    malformed one (attribute or index access, a conversion, a format spec)."""
    names: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValidationError(field, f"malformed placeholder ({exc}); write a literal brace as {{{{ or }}}}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            raise ValidationError(field, f"unknown placeholder {{{name}}}; known: "
                                  + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
        if spec or conversion:
            raise ValidationError(field, f"placeholder {{{name}}} takes no format or conversion")
        names.add(name)
    return names


def letter_template_get(session: Session, *, language: str, kind: str) -> TemplateText:
    _check_language_kind(language, kind)
    row = session.scalar(select(LetterTemplate).where(LetterTemplate.language == language,
                                                      LetterTemplate.kind == kind))
    if row is None:
        subject, body = DEFAULT_TEMPLATES[(language, kind)]
        return TemplateText(language, kind, subject, body, 0, None)
    return TemplateText(language, kind, row.subject, row.body, row.version, row.updated_by)


def letter_template_save(session: Session, *, actor: str, language: str, kind: str,
                         subject: str, body: str) -> TemplateText:
    """Store an edited template (a new version), after checking every placeholder."""
    _check_language_kind(language, kind)
    subject, body = " ".join(subject.split()), body.replace("\r\n", "\n").strip()
    if not subject or len(subject) > MAX_SUBJECT:
        raise ValidationError("subject", f"between 1 and {MAX_SUBJECT} characters")
    if not body or len(body) > MAX_BODY:
        raise ValidationError("body", f"between 1 and {MAX_BODY} characters")
    template_placeholders(subject, "subject")
    used = template_placeholders(body, "body")
    if "reference" not in used:
        raise ValidationError("body", "the letter must quote the request's {reference}")
    row = session.scalar(select(LetterTemplate).where(LetterTemplate.language == language,
                                                      LetterTemplate.kind == kind)
                         .with_for_update())
    if row is None:
        row = LetterTemplate(language=language, kind=kind, version=0)
        session.add(row)
    row.subject, row.body = subject, body
    row.version = (row.version or 0) + 1
    row.updated_by, row.updated_at = actor, utcnow()
    session.flush()
    audit_append(session, actor=actor, action="letter.template_saved", object_type="letter_template",
                 object_ref=f"{language}/{kind}",
                 details={"version": row.version,
                          "sha256": hashlib.sha256((subject + "\n" + body).encode()).hexdigest()})
    return TemplateText(language, kind, subject, body, row.version, actor)


def letter_kind_for(status: str) -> str:
    if status == RequestStatus.COMPLETED:
        return "completed"
    if status == RequestStatus.DENIED:
        return "refused"
    raise ValidationError("reference", f"a {status} request has no reply letter yet; "
                          "it is written on completion or refusal")


def letter_render(session: Session, *, reference: str, language: str, controller: str,
                  now: datetime | None = None) -> RenderedLetter:
    """The letter for a completed or refused request, its name decrypted for this only."""
    if language not in LANGUAGES:
        raise ValidationError("language", f"one of {', '.join(LANGUAGES)}")
    request = request_get(session, reference=reference)
    kind = letter_kind_for(request.status)
    template = letter_template_get(session, language=language, kind=kind)
    certificate = _certificate_of(session, request_id=request.id) if kind == "completed" else None
    if kind == "completed" and certificate is None:
        raise DomainError(f"{reference} is completed but no certificate names it")
    try:
        name = subject_identifiers(session, reference).name
    except NotFound:
        raise DomainError(f"{reference}: the subject's identifiers were purged after the "
                          "retention period; the letter can no longer be addressed") from None
    decided = request.completed_at if kind == "completed" else request.decided_at
    values = {
        "subject_name": name,
        "reference": request.reference,
        "received_date": _date(request.received_at, language),
        "due_date": _date(request.due_at, language),
        "decision_date": _date(decided or now or utcnow(), language),
        "controller": controller,
        "model": request.model.name,
        "certificate_id": certificate.certificate_id if certificate else "",
        "limits": LIMITS[language],
        "refusal_reason": _refusal_reason(request.reason_code, language),
        "refusal_note": request.decision_note or "",
    }
    values["certificate_check"] = CERTIFICATE_CHECK[language].format(**values)
    subject = template.subject.format(**values)
    body = template.body.format(**values)
    paragraphs = tuple(p.strip() for p in body.split("\n\n") if p.strip())
    return RenderedLetter(request.reference, language, kind, subject, paragraphs,
                          certificate.certificate_id if certificate else None, template.version)


def letter_issue_record(session: Session, *, actor: str, letter: RenderedLetter, fmt: str) -> None:
    """Audit that a letter left the service (reference, language, format, version only)."""
    audit_append(session, actor=actor, action="letter.issued", object_type="erasure_request",
                 object_ref=letter.reference,
                 details={"language": letter.language, "kind": letter.kind, "format": fmt,
                          "template_version": letter.template_version,
                          "certificate": letter.certificate_id})


def _certificate_of(session: Session, *, request_id: int) -> Certificate | None:
    return session.scalar(
        select(Certificate).join(Job, Job.id == Certificate.job_id)
        .join(JobRequest, JobRequest.job_id == Job.id)
        .where(JobRequest.request_id == request_id).order_by(Certificate.seq.desc()).limit(1)
    )


MONTHS_DE = ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August",
             "September", "Oktober", "November", "Dezember")


def _date(moment: datetime, language: str) -> str:
    if language == "de":
        return f"{moment.day}. {MONTHS_DE[moment.month - 1]} {moment.year}"
    return f"{moment.day} {moment.strftime('%B')} {moment.year}"


def _refusal_reason(code: str | None, language: str) -> str:
    if code is None:
        return ""
    if language == "de":
        return REFUSAL_REASONS_DE.get(code, code)
    label = DENIAL_REASONS.get(code, code)
    return f"{label} (Art. {code} GDPR)" if code.startswith("17(") else label


def _check_language_kind(language: str, kind: str) -> None:
    if language not in LANGUAGES:
        raise ValidationError("language", f"one of {', '.join(LANGUAGES)}")
    if kind not in KINDS:
        raise ValidationError("kind", f"one of {', '.join(KINDS)}")
