"""Django settings.  Every value comes from deletion.domain.config, which reads the
environment once (see .env.example); nothing here reads os.environ directly, so the
web, the workers and the CLIs can never disagree about a setting."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from deletion.domain import config as domain_config

BASE_DIR = Path(__file__).resolve().parent.parent
CONFIG = domain_config.current()  # the same Config object the rest of the process reads


def django_database(url: str) -> dict[str, Any]:
    """Translate the SQLAlchemy DATABASE_URL into Django's DATABASES entry, so that
    Django's auth/session tables live in the same database as the domain tables."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        name = parsed.database or ""
        path = Path(name) if Path(name).is_absolute() else BASE_DIR / name
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(path),
            # The worker writes the same file through SQLAlchemy; wait instead of failing.
            "OPTIONS": {"timeout": 30},
        }
    if backend == "postgresql":
        return {
            "ENGINE": "deletion.web.postgresql",  # Django's, health-checking idle connections only
            "NAME": parsed.database or "",
            "USER": parsed.username or "",
            "PASSWORD": parsed.password or "",
            "HOST": parsed.host or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise domain_config.ConfigError("DATABASE_URL", f"unsupported backend {backend!r}")


if not CONFIG.django_secret_key:
    # Workers run without it (config._web_secret); the web must never run with an empty one.
    raise domain_config.ConfigError("DJANGO_SECRET_KEY", "the web process needs it (or DJANGO_SECRET_KEY_FILE)")
SECRET_KEY = CONFIG.django_secret_key
DEBUG = CONFIG.debug
ALLOWED_HOSTS = list(CONFIG.allowed_hosts)
# The SQLAlchemy URL the domain services use; the tests point it at a fresh database.
DOMAIN_DATABASE_URL = CONFIG.database_url
DATABASES = {"default": django_database(CONFIG.database_url)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # only so that its Swagger UI is served from local static files, not a CDN
    "axes",  # sign-in throttling (lock-outs are audited by deletion.web.access)
    "deletion.web",
]

# django-axes first: it refuses a locked-out account before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Lock the account name (not the address): credential stuffing from many addresses
# still stops, at the price that an attacker can hold an account locked for the
# cool-off; an admin releases it early with `manage.py unlock_account`.
AXES_FAILURE_LIMIT = CONFIG.login_failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=CONFIG.login_lockout_minutes)
AXES_LOCKOUT_PARAMETERS = ["username"]
# axes would rather also lock addresses; one office behind one NAT address would then be
# locked out as a whole by one mistyping colleague, so the account is the unit here.
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
AXES_RESET_ON_SUCCESS = True
AXES_USERNAME_CALLABLE = "deletion.web.access.axes_username"
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_TEMPLATE = "web/locked_out.html"
AXES_ENABLE_ADMIN = False
AXES_VERBOSE = False  # its log lines would name the address; the audit trail has the event
AXES_DISABLE_ACCESS_LOG = True  # no per-login rows with addresses and browsers

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "deletion.web.middleware.RejectNulBytesMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, so that every view (not only the decorated ones) needs a login.
    "deletion.web.middleware.LoginRequiredMiddleware",
    "axes.middleware.AxesMiddleware",
]

# Staff e-mail (reminders, retraining notices); the embedded default prints to the console.
EMAIL_BACKEND = CONFIG.email_backend
EMAIL_HOST = CONFIG.email_host
EMAIL_PORT = CONFIG.email_port
DEFAULT_FROM_EMAIL = CONFIG.email_from

ROOT_URLCONF = "deletion.urls"
WSGI_APPLICATION = "deletion.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "deletion.web.roles.roles_context",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns about a missing root
# Served by whitenoise straight from the app's static folder: no CDN, no collectstatic
# needed for the embedded run.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# The request form accepts a few identifiers; a megabyte of hostile input must be a
# clean 400 from the form, not a RequestDataTooBig from the middleware.
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

# Hardening that always applies.
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = 8 * 3600
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"

if not DEBUG:
    # Production sits behind a TLS proxy: cookies never travel in clear and browsers
    # remember to use HTTPS.  The redirect from http:// is the proxy's job; browsers
    # treat http://127.0.0.1 as a secure context, so the embedded run still signs in.
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    CSRF_COOKIE_HTTPONLY = True
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    # Request bodies can hold subject identifiers; never log them.
    "loggers": {"django.request": {"level": "WARNING", "propagate": True}},
}
