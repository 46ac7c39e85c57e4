"""The whole workflow in a real browser (Debian's Chromium through Playwright), against
a real web server (gunicorn), a real Celery worker and beat, and the tiny model:
an officer files a request, a reviewer approves it, the page follows the job live until
it completes, and the certificate is downloaded and verified.  Screenshots of every step
land in test-artifacts/browser/."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from deletion.domain.certificates import certificate_verify_one
from deletion.domain.config import current
from deletion.domain.db import make_engine, session_scope
from deletion.domain.models import ErasureRequest
from deletion.domain.registry import corpus_current, model_get
from deletion.domain.signing import keyring_from_config
from tests.conftest import drop_database, fresh_database_url
from tests.pipeline_fixtures import (
    RunningPipeline,
    redis_broker_url,
    running_pipeline,
    tiny_assets_dir,
)

__all__ = ["tiny_assets_dir"]  # a fixture, imported so this module can use it

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
COMPLETION_TIMEOUT_MS = 300_000

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def browser_database_url() -> Iterator[str]:
    url = fresh_database_url("erasure_browser")
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def stack(browser_database_url: str, tiny_assets_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Worker + beat (tests/pipeline_fixtures.py) and gunicorn, all on one database."""
    work_dir = tmp_path_factory.mktemp("browser-stack")
    with running_pipeline(database_url=browser_database_url, broker_url=redis_broker_url(),
                          work_dir=work_dir, assets_dir=tiny_assets_dir) as pipeline:
        env = {**pipeline.env, "ALLOWED_HOSTS": "127.0.0.1,localhost"}
        _manage(env, "migrate", "--no-input", "-v", "0")
        credentials = json.loads(_manage(env, "ensure_demo_users", "--json", "--file",
                                         str(work_dir / "credentials.json")))
        port = _free_port()
        log = open(work_dir / "web.log", "ab")  # noqa: SIM115 - closed below
        web = subprocess.Popen([sys.executable, "-m", "gunicorn", "deletion.wsgi", "--bind", f"127.0.0.1:{port}",
                                "--workers", "1", "--threads", "4", "--timeout", "60"],
                               cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base_url = f"http://127.0.0.1:{port}"
        try:
            _wait_for_http(f"{base_url}/healthz", web, work_dir / "web.log")
            yield {"base_url": base_url, "credentials": credentials, "pipeline": pipeline,
                   "database_url": browser_database_url, "web_log": work_dir / "web.log"}
        finally:
            os.killpg(web.pid, 15)
            web.wait(timeout=30)
            log.close()


def _wait_for_http(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"web server exited:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - local test server
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"web server did not answer:\n{log.read_text()[-4000:]}")


def _demo_person(database_url: str) -> dict[str, Any]:
    """A person the tiny model was trained on (set building matches names in the corpus)."""
    engine = make_engine(database_url)
    try:
        with session_scope(engine) as session:
            model = model_get(session, name="demo")
            corpus_path = Path(corpus_current(session, name=model.corpus.name).path)
    finally:
        engine.dispose()
    with (corpus_path.parent / "people.jsonl").open(encoding="utf-8") as handle:
        return json.loads(handle.readline())


def _sign_in(page: Any, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")


def test_an_officer_and_a_reviewer_take_a_request_to_a_downloaded_certificate(stack: dict[str, Any]) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base_url, creds = stack["base_url"], stack["credentials"]
    pipeline: RunningPipeline = stack["pipeline"]
    person = _demo_person(stack["database_url"])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            # The officer files the request through the form.
            officer = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
            page = officer.new_page()
            _sign_in(page, base_url, "demo-officer", creds["demo-officer"])
            page.screenshot(path=str(ARTIFACTS / "01-officer-dashboard.png"), full_page=True)
            page.click("text=New request")
            page.fill("#id_name", person["name"])
            page.fill("#id_aliases", "\n".join(person.get("aliases", [])))
            page.fill("#id_emails", person.get("email", ""))
            page.select_option("#id_ground", "17(1)(b)")
            page.fill("#id_received_at", time.strftime("%Y-%m-%d", time.gmtime()))
            page.select_option("#id_model_name", "demo")
            page.check("input[name=priority][value=immediate]")
            page.screenshot(path=str(ARTIFACTS / "02-officer-new-request.png"), full_page=True)
            page.click("text=Submit for review")
            page.wait_for_url(f"{base_url}/requests/ER-*/")
            reference = page.url.rstrip("/").rsplit("/", 1)[-1]
            assert person["name"] not in page.content()  # references only, never the name
            page.screenshot(path=str(ARTIFACTS / "03-officer-submitted.png"), full_page=True)
            officer.close()

            # A second person approves it from the review queue.
            reviewer = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
            page = reviewer.new_page()
            _sign_in(page, base_url, "demo-reviewer", creds["demo-reviewer"])
            page.goto(f"{base_url}/review/")
            page.screenshot(path=str(ARTIFACTS / "04-reviewer-queue.png"), full_page=True)
            page.click(f"button[data-approve='{reference}']")
            page.wait_for_url(f"{base_url}/requests/{reference}/")

            # The detail page follows the job live until the certificate appears.
            page.wait_for_selector("#job-bar", timeout=COMPLETION_TIMEOUT_MS)
            page.screenshot(path=str(ARTIFACTS / "05-job-running.png"), full_page=True)
            try:
                page.wait_for_selector("#cert-badge", timeout=COMPLETION_TIMEOUT_MS)
            except PlaywrightTimeout:
                page.screenshot(path=str(ARTIFACTS / "05b-timeout.png"), full_page=True)
                pipeline.wait_for_request(reference, timeout_s=1)  # raises with the worker log
                raise
            page.screenshot(path=str(ARTIFACTS / "06-completed-with-certificate.png"), full_page=True)
            assert "signature and hash verified" in page.inner_text("#cert-badge")
            assert "Completed" in page.inner_text("#status-badge")

            with page.expect_download() as download_info:
                page.click("#cert-download")
            target = ARTIFACTS / download_info.value.suggested_filename
            download_info.value.save_as(str(target))
            page.goto(f"{base_url}/models/demo/")
            page.screenshot(path=str(ARTIFACTS / "07-model-lineage.png"), full_page=True)
            page.goto(f"{base_url}/audit/")
            page.screenshot(path=str(ARTIFACTS / "08-audit-trail.png"), full_page=True)
            reviewer.close()
        finally:
            browser.close()

    # The downloaded file verifies with nothing but the signer's public key.
    document = json.loads(target.read_text(encoding="utf-8"))
    public_key = keyring_from_config(current()).get(document["key_id"])
    assert certificate_verify_one(document["payload"], document["signature"], public_key).ok
    assert json.loads(document["payload"])["requests"][0]["reference"] == reference
    engine = make_engine(stack["database_url"])
    try:
        with session_scope(engine) as session:
            status = session.scalar(select(ErasureRequest.status).where(ErasureRequest.reference == reference))
    finally:
        engine.dispose()
    assert status == "completed"


def _set_policy(pipeline: RunningPipeline, policy: dict[str, Any]) -> None:
    """Replace the deployment's verification policy file and restart the worker, which
    reads it once per process (as an operator would after changing thresholds)."""
    (pipeline.work_dir / "verification-policy.json").write_text(json.dumps(policy), encoding="utf-8")
    pipeline.stop_child("worker")
    pipeline.start_worker()


def _second_person(database_url: str) -> dict[str, Any]:
    engine = make_engine(database_url)
    try:
        with session_scope(engine) as session:
            model = model_get(session, name="demo")
            corpus_path = Path(corpus_current(session, name=model.corpus.name).path)
    finally:
        engine.dispose()
    with (corpus_path.parent / "people.jsonl").open(encoding="utf-8") as handle:
        handle.readline()
        return json.loads(handle.readline())


def _api_status(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - local test server
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_a_failed_erasure_is_retried_certified_answered_and_evidenced(stack: dict[str, Any]) -> None:
    """The officer's whole case: a batch request shows when it starts, a reviewer starts
    it now, a forced rejection (a policy nothing passes) is explained, the officer
    proposes a retry with another method, a reviewer approves it, the retry is
    certified, the reply letter names the certificate, the evidence pack verifies
    offline with the documented command, and a token made in the UI works on the API
    until it is revoked."""
    from playwright.sync_api import sync_playwright

    from tests.pipeline_fixtures import PIPELINE_TEST_POLICY, REJECTING_POLICY
    from workers.integrity import chain_heads_export

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base_url, creds = stack["base_url"], stack["credentials"]
    pipeline: RunningPipeline = stack["pipeline"]
    person = _second_person(stack["database_url"])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            officer = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
            opage = officer.new_page()
            _sign_in(opage, base_url, "demo-officer", creds["demo-officer"])
            opage.goto(f"{base_url}/requests/new/")
            opage.fill("#id_name", person["name"])
            opage.fill("#id_emails", person.get("email", ""))
            opage.select_option("#id_ground", "17(1)(a)")
            opage.fill("#id_received_at", time.strftime("%Y-%m-%d", time.gmtime()))
            opage.select_option("#id_model_name", "demo")
            opage.check("input[name=priority][value=batch]")
            opage.click("text=Submit for review")
            opage.wait_for_url(f"{base_url}/requests/ER-*/")
            reference = opage.url.rstrip("/").rsplit("/", 1)[-1]

            # Approved, the batch request says when its batch starts, and why.
            reviewer = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
            rpage = reviewer.new_page()
            _sign_in(rpage, base_url, "demo-reviewer", creds["demo-reviewer"])
            rpage.goto(f"{base_url}/review/")
            rpage.click(f"button[data-approve='{reference}']")
            rpage.wait_for_url(f"{base_url}/requests/{reference}/")
            assert "UTC" in rpage.inner_text("#batch-start")
            assert "batch window of 5 minutes" in rpage.inner_text("#batch-why")
            rpage.screenshot(path=str(ARTIFACTS / "09-batch-start-time.png"), full_page=True)
            rpage.goto(f"{base_url}/")
            rpage.screenshot(path=str(ARTIFACTS / "10-dashboard-waiting-batch.png"), full_page=True)

            # A policy nothing passes forces the rejection; the reviewer starts the batch now.
            _set_policy(pipeline, REJECTING_POLICY)
            rpage.goto(f"{base_url}/requests/{reference}/")
            rpage.click("#batch-start-now")
            rpage.wait_for_url(f"{base_url}/requests/{reference}/")
            rpage.wait_for_selector("#failed-checks", timeout=COMPLETION_TIMEOUT_MS)
            assert "rejected" in rpage.inner_text("#job-outcome")
            assert "step" not in rpage.inner_text("#job-panel").split("Outcome")[-1]
            rpage.screenshot(path=str(ARTIFACTS / "11-rejected-checks-explained.png"), full_page=True)

            # The officer proposes a retry with another method; a reviewer approves it.
            opage.goto(f"{base_url}/requests/{reference}/")
            assert "We measured" in opage.inner_text("#failed-checks")
            opage.check("input[name=kind][value=retry]")
            opage.select_option("#id_method", "kif")
            opage.select_option("#id_preset", "standard")
            opage.fill("#id_note", "ASU failed the policy; KIF suppresses the facts")
            opage.click("#resolution-submit")
            opage.wait_for_url(f"{base_url}/requests/{reference}/")
            opage.screenshot(path=str(ARTIFACTS / "12-retry-proposed.png"), full_page=True)
            _set_policy(pipeline, PIPELINE_TEST_POLICY)
            rpage.goto(f"{base_url}/requests/{reference}/")
            rpage.click("#resolution-approve")
            rpage.wait_for_url(f"{base_url}/requests/{reference}/")
            rpage.wait_for_selector("#cert-badge", timeout=COMPLETION_TIMEOUT_MS)
            assert "signature and hash verified" in rpage.inner_text("#cert-badge")
            rpage.screenshot(path=str(ARTIFACTS / "13-retry-certified.png"), full_page=True)
            certificate_id = rpage.inner_text("#certificate dd.mono").strip()
            reviewer.close()

            # The reply letter names the certificate; the PDF downloads.
            opage.goto(f"{base_url}/requests/{reference}/letter/en/")
            letter = opage.inner_text("#letter-text")
            assert certificate_id in letter and person["name"] in letter
            opage.screenshot(path=str(ARTIFACTS / "14-reply-letter.png"), full_page=True)
            opage.goto(f"{base_url}/requests/{reference}/")
            with opage.expect_download() as pdf_info:
                opage.click("#letter-pdf-de")
            pdf_path = ARTIFACTS / pdf_info.value.suggested_filename
            pdf_info.value.save_as(str(pdf_path))
            assert pdf_path.read_bytes().startswith(b"%PDF")

            # The evidence pack, after the worker's quarter-hourly chain-head export (run now).
            engine = make_engine(stack["database_url"])
            try:
                from deletion.domain.signing import signer_from_config

                chain_heads_export(engine=engine, signer=signer_from_config(current()),
                                   export_dir=Path(pipeline.env["VAR_DIR"]) / "chain-heads")
            finally:
                engine.dispose()
            with opage.expect_download() as pack_info:
                opage.click("#evidence-download")
            pack_path = ARTIFACTS / pack_info.value.suggested_filename
            pack_info.value.save_as(str(pack_path))
            verified = _manage(stack["pipeline"].env, "evidence", "verify", str(pack_path))
            assert "evidence pack VERIFIES" in verified and certificate_id in verified

            # A token made in the UI works on the API and gets 401 once revoked.
            opage.goto(f"{base_url}/account/")
            opage.fill("#id_name", "browser test")
            opage.check("input[name=scope][value=read]")
            opage.click("#token-create")
            token = opage.inner_text("#token-plaintext").strip()
            opage.screenshot(path=str(ARTIFACTS / "15-token-created.png"), full_page=True)
            url = f"{base_url}/api/v1/requests/{reference}"
            assert _api_status(url, token) == 200
            opage.click(f"button[data-revoke='{token[:10]}']")
            opage.wait_for_url(f"{base_url}/account/")
            assert _api_status(url, token) == 401
            opage.screenshot(path=str(ARTIFACTS / "16-token-revoked.png"), full_page=True)
            officer.close()
        finally:
            browser.close()
