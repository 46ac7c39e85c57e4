"""Forms parse and bound the input; the domain services decide.  Free text that a person
types is limited in length and stripped of invisible control characters that could
make a reference or a name look like something else on screen."""
from __future__ import annotations

import unicodedata
from datetime import date, timedelta
from typing import Any

from django import forms
from django.core.validators import validate_email
from django.utils import timezone

from deletion.domain.config import MAX_BATCH_WINDOW_MINUTES
from deletion.domain.methods import METHODS, PRESETS
from deletion.web.choices import DENY_CHOICES, GROUND_CHOICES, PRIORITY_CHOICES

MAX_NAME = 200
MAX_LIST_ITEMS = 20
MAX_NOTE = 2000

# Bidi overrides/isolates and zero-width characters that render as nothing: they let a
# string masquerade as another (CVE-2021-42574 style).  ZWNJ and ZWJ stay allowed
# because Persian and Indic names need them.
INVISIBLE = {"\u200b", "\u2060", "\ufeff", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e",
             "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f", "\u061c"}


def hidden_character_problem(value: str, *, multiline: bool = False) -> str | None:
    """Why the text would not show what it holds, or None (shared with the JSON API)."""
    for ch in value:
        if ch in INVISIBLE:
            return f"remove invisible formatting characters (U+{ord(ch):04X})"
        if unicodedata.category(ch) == "Cc" and not (multiline and ch in "\r\n\t"):
            return "remove control characters"
    return None


def check_visible_text(value: str, *, multiline: bool = False) -> str:
    problem = hidden_character_problem(value, multiline=multiline)
    if problem is not None:
        raise forms.ValidationError(problem[:1].upper() + problem[1:] + ".")
    return value


class BoundedCharField(forms.CharField):
    def __init__(self, *args: Any, multiline: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.multiline = multiline

    def clean(self, value: Any) -> Any:
        # Length first, so a megabyte of input is refused before any per-character work.
        if isinstance(value, str) and self.max_length is not None and len(value) > self.max_length:
            raise forms.ValidationError(f"At most {self.max_length} characters.")
        cleaned = super().clean(value)
        return check_visible_text(cleaned, multiline=self.multiline) if cleaned else cleaned


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


class RequestForm(forms.Form):
    name = BoundedCharField(max_length=MAX_NAME, label="Data subject's full name",
                            widget=forms.TextInput(attrs={"autocomplete": "off"}))
    aliases = BoundedCharField(max_length=MAX_NAME * MAX_LIST_ITEMS, required=False, multiline=True,
                               label="Aliases", help_text="Other names the subject is known by, one per line.",
                               widget=forms.Textarea(attrs={"rows": 2}))
    emails = BoundedCharField(max_length=254 * MAX_LIST_ITEMS, required=False, multiline=True,
                              label="E-mail addresses", help_text="One per line.",
                              widget=forms.Textarea(attrs={"rows": 2}))
    ground = forms.ChoiceField(choices=GROUND_CHOICES, label="Art. 17(1) ground")
    received_at = forms.DateField(label="Date received", widget=forms.DateInput(attrs={"type": "date"}),
                                  help_text="The one-month deadline (Art. 12(3)) runs from this date.")
    model_name = forms.ChoiceField(choices=(), label="Target model")
    priority = forms.ChoiceField(choices=PRIORITY_CHOICES, initial="batch", widget=forms.RadioSelect)
    notes = BoundedCharField(max_length=MAX_NOTE, required=False, multiline=True, label="Internal note",
                             help_text="No personal data beyond the identifiers above.",
                             widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args: Any, model_names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model_name"].choices = [(n, n) for n in model_names]

    def clean_aliases(self) -> list[str]:
        aliases = _lines(self.cleaned_data.get("aliases") or "")
        if len(aliases) > MAX_LIST_ITEMS:
            raise forms.ValidationError(f"At most {MAX_LIST_ITEMS} aliases.")
        if any(len(a) > MAX_NAME for a in aliases):
            raise forms.ValidationError(f"Each alias has at most {MAX_NAME} characters.")
        return aliases

    def clean_emails(self) -> list[str]:
        emails = _lines(self.cleaned_data.get("emails") or "")
        if len(emails) > MAX_LIST_ITEMS:
            raise forms.ValidationError(f"At most {MAX_LIST_ITEMS} addresses.")
        for email in emails:
            try:
                validate_email(email)
            except forms.ValidationError:
                raise forms.ValidationError("Not a valid e-mail address: line %(n)s.",
                                            params={"n": emails.index(email) + 1}) from None
        return emails

    def clean_received_at(self) -> date:
        received: date = self.cleaned_data["received_at"]
        today = timezone.now().date()
        if received > today:
            raise forms.ValidationError("A request cannot be received in the future.")
        if received < today - timedelta(days=366):
            raise forms.ValidationError("More than a year ago: check the date.")
        return received


class DenyForm(forms.Form):
    reason_code = forms.ChoiceField(choices=DENY_CHOICES, label="Art. 17(3) reason")
    note = BoundedCharField(max_length=MAX_NOTE, multiline=True, label="Note for the file",
                            widget=forms.Textarea(attrs={"rows": 3}))


class ExtendForm(forms.Form):
    months = forms.TypedChoiceField(choices=((1, "1 month"), (2, "2 months")), coerce=int, label="Extend by")
    reason = BoundedCharField(max_length=MAX_NOTE, multiline=True, label="Reason (Art. 12(3))",
                              widget=forms.Textarea(attrs={"rows": 2}))


class ScheduleForm(forms.Form):
    batch_window_minutes = forms.IntegerField(
        min_value=1, max_value=MAX_BATCH_WINDOW_MINUTES, label="Batch window (minutes)",
        help_text="Approved batch requests for this model are merged into one job at most this often "
                  "(1440 = one day).")


class OwnerForm(forms.Form):
    owner_email = forms.EmailField(max_length=254, required=False, label="Owner's e-mail (ML team)")
    owner_webhook_url = forms.URLField(max_length=500, required=False, label="Owner's webhook URL",
                                       assume_scheme="https")


class CancelForm(forms.Form):
    reason = BoundedCharField(max_length=MAX_NOTE, required=False, multiline=True, label="Reason for the file",
                              widget=forms.Textarea(attrs={"rows": 2}))


RESOLUTION_CHOICES = (
    ("retry", "Retry with another method or a stronger preset"),
    ("retraining", "Retraining required: unlearning will not do"),
    ("refusal", "Refuse the erasure (Art. 17(3) reason)"),
)


class ResolutionForm(forms.Form):
    kind = forms.ChoiceField(choices=RESOLUTION_CHOICES, widget=forms.RadioSelect, label="Proposal")
    method = forms.ChoiceField(choices=tuple(METHODS.items()), required=False, label="Method")
    preset = forms.ChoiceField(choices=tuple((k, f"{k}: {v}") for k, v in PRESETS.items()), required=False,
                               label="Preset")
    reason_code = forms.ChoiceField(choices=(("", "—"), *DENY_CHOICES), required=False, label="Refusal reason")
    note = BoundedCharField(max_length=MAX_NOTE, required=False, multiline=True, label="Note (reasons)",
                            widget=forms.Textarea(attrs={"rows": 3}))


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=(("approve", "Approve"), ("decline", "Decline")))
    note = BoundedCharField(max_length=MAX_NOTE, required=False, multiline=True, label="Note",
                            widget=forms.Textarea(attrs={"rows": 2}))


class LetterTemplateForm(forms.Form):
    subject = BoundedCharField(max_length=200, label="Subject line")
    body = BoundedCharField(max_length=20_000, multiline=True, label="Letter",
                            widget=forms.Textarea(attrs={"rows": 22, "class": "mono"}))


class TokenForm(forms.Form):
    name = BoundedCharField(max_length=100, label="Note", help_text="What the token is for, e.g. “serving cluster eu-1”.")
    scope = forms.ChoiceField(choices=(), widget=forms.RadioSelect, label="Scope")
    days = forms.IntegerField(min_value=1, max_value=365, initial=90, label="Expires after (days)")

    def __init__(self, *args: Any, scopes: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["scope"].choices = scopes


class PreferencesForm(forms.Form):
    reminders_enabled = forms.BooleanField(required=False, label="E-mail me deadline reminders "
                                           "(7 and 2 days before, and on the day)")


class RecipientForm(forms.Form):
    name = BoundedCharField(max_length=200, label="Recipient (organisation)",
                            help_text="An organisation, not a person: it appears in audit events.")
    kind = forms.ChoiceField(choices=(("webhook", "Signed webhook"), ("manual", "Manual (told by the officer)")))
    endpoint_url = forms.URLField(max_length=500, required=False, label="Webhook URL", assume_scheme="https")
    secret = BoundedCharField(max_length=200, required=False, label="Webhook signing secret",
                              widget=forms.PasswordInput(render_value=False))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("kind") == "webhook" and not data.get("endpoint_url"):
            self.add_error("endpoint_url", "A webhook recipient needs a URL.")
        return data
