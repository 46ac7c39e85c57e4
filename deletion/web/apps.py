from __future__ import annotations

from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "deletion.web"
    label = "web"
    verbose_name = "Erasure service web"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from deletion.web import access  # noqa: F401 - connects the lock-out audit receivers
