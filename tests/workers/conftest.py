"""Workers tests run real worker processes (tests/pipeline_fixtures.py)."""

pytest_plugins = ["tests.pipeline_fixtures"]
