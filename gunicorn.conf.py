"""gunicorn settings of the web process: `make run` (workers/processes.py) and the
compose `web` service both start gunicorn with this file.

Threaded workers, because the audit trail's CSV/JSON export streams for as long as
the filtered trail takes to read (minutes for millions of events): a sync worker is
killed by the arbiter once one request outlives `timeout` (30 s by default), which cut
long exports off mid-file.  A gthread worker's main thread keeps reporting to the
arbiter while its threads serve, so `timeout` only catches a worker that hangs as a
whole, and a slow download holds one thread, not the worker.
"""

worker_class = "gthread"
threads = 4
# A worker whose main loop is stuck this long is restarted (requests themselves may run longer).
timeout = 120
graceful_timeout = 30
# Behind a proxy that keeps connections open.
keepalive = 5
accesslog = "-"


def post_worker_init(worker: object) -> None:
    """Import the URLconf, and with it every view and the libraries they load (the PDF
    writer alone takes seconds), and configure the domain's mappers when the worker starts:
    lazily, the first request each worker served waited for it (the service benchmark's
    p99 was that one request)."""
    from django.urls import get_resolver
    from sqlalchemy.orm import configure_mappers

    get_resolver().url_patterns  # noqa: B018 - the property imports the URLconf
    # SQLAlchemy configures the mappers (every relationship of every domain class) the first
    # time an instance of one is made: in a worker warmed on /healthz, that was the first
    # filing, 0.06 s of CPU with the GIL held (more on a loaded machine) while the worker's
    # other threads waited.
    configure_mappers()
