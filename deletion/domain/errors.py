"""The domain's small family of errors; the API maps each to a 4xx with its message."""

from __future__ import annotations


class DomainError(Exception):
    """A business rule refused the operation; nothing was changed."""

    status = 400


class InvalidTransition(DomainError):
    """The state machine has no edge from the current state to the one asked for."""

    status = 409

    def __init__(self, entity: str, current: str, target: str) -> None:
        super().__init__(f"{entity}: cannot go from {current!r} to {target!r}")
        self.entity = entity
        self.current = current
        self.target = target


class NotFound(DomainError):
    status = 404


class PermissionDenied(DomainError):
    """The actor may not do this (four-eyes: nobody reviews their own request)."""

    status = 403


class ValidationError(DomainError):
    """An input is malformed; ``field`` names it so a form can show the message beside it."""

    status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class PermanentJobError(DomainError):
    """A job failed in a way that retrying cannot fix (bad input, missing checkpoint)."""
