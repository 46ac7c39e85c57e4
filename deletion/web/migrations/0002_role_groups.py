"""Create the four role groups, so that a fresh database has them without a command."""
from __future__ import annotations

from django.db import migrations

ROLES = ("officer", "reviewer", "auditor", "admin")


def create_groups(apps, schema_editor):  # type: ignore[no-untyped-def]
    group = apps.get_model("auth", "Group")
    for name in ROLES:
        group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [("web", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
