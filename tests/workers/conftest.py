"""Workers tests run real worker processes (tests/pipeline_fixtures.py, loaded by the root conftest)."""
