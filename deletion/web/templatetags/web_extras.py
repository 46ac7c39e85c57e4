from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def label(code: str | None) -> str:
    """in_progress -> In progress."""
    text = (code or "").replace("_", " ").replace(".", " ")
    return text[:1].upper() + text[1:]


@register.filter
def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    total = int(round(float(seconds)))
    minutes, secs = divmod(total, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


@register.filter
def short(value: str | None, n: int = 12) -> str:
    return (value or "")[:n]


@register.filter
def get(mapping: dict[object, object], key: object) -> object:
    return mapping.get(key) if isinstance(mapping, dict) else None
