"""A data subject as an erasure request names them (shared by set building and probes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Subject:
    """A data subject as the request names them; all of these are matched."""

    name: str
    aliases: tuple[str, ...] = ()
    identifiers: tuple[str, ...] = ()  # emails, phone numbers, account names

    def patterns(self) -> tuple[str, ...]:
        return (self.name, *self.aliases, *self.identifiers)
