"""Staff-facing messages: e-mail through Django's backends, and signed webhook events.

Used for deadline reminders and retraining notices.  Bodies carry references, dates
and the model's name, never a data subject's identifiers.  A webhook is signed like
the Art. 19 notifications: ``X-Erasure-Signature: sha256=HMAC(secret, "<timestamp>.<body>")``.
Every send is audited (by its event and outcome; addresses and URLs are not).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

logger = logging.getLogger(__name__)
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    channel: str
    ok: bool
    detail: str | None = None


def email_send(*, to: Sequence[str], subject: str, body: str) -> Outcome:
    recipients = [address for address in to if address]
    if not recipients:
        return Outcome("email", False, "no address")
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)
    except OSError as exc:  # SMTP refused, unreachable: reported, the next run tries again
        logger.warning("e-mail not sent: %s", type(exc).__name__)
        return Outcome("email", False, type(exc).__name__)
    return Outcome("email", True)


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def webhook_post(*, url: str | None, event: dict[str, Any], secret: str | None) -> Outcome:
    if not url:
        return Outcome("webhook", False, "no webhook configured")
    body = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "X-Erasure-Timestamp": timestamp,
               "X-Erasure-Event": str(event.get("event", "")), "User-Agent": "erasure-service/events"}
    if secret:
        headers["X-Erasure-Signature"] = webhook_signature(secret, timestamp, body)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - configured URL
            ok = 200 <= int(response.status) < 300
            return Outcome("webhook", ok, None if ok else f"HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        return Outcome("webhook", False, f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return Outcome("webhook", False, type(exc).__name__)
