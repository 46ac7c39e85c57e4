"""The reminder command starts on a worker that holds no copy of the web's secret key."""

from __future__ import annotations

from workers.reminders import child_env


def test_a_worker_without_the_web_secret_gives_the_command_an_ephemeral_one() -> None:
    first = child_env({"PATH": "/bin"})
    second = child_env({"PATH": "/bin"})
    assert len(first["DJANGO_SECRET_KEY"]) >= 50 and first["PATH"] == "/bin"
    assert first["DJANGO_SECRET_KEY"] != second["DJANGO_SECRET_KEY"]  # never a fixed key


def test_a_given_key_or_key_file_is_left_alone() -> None:
    assert child_env({"DJANGO_SECRET_KEY": "k"})["DJANGO_SECRET_KEY"] == "k"
    assert "DJANGO_SECRET_KEY" not in child_env({"DJANGO_SECRET_KEY_FILE": "/run/secrets/x"})
