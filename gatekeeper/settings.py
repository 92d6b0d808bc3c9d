"""Gatekeeper settings, read from the environment (django-environ).

Every setting has a working default so that `make run` starts on a laptop with nothing but
Redis: SQLite under var/, Redis at 127.0.0.1:6379, the local-directory snapshot store.
Production swaps in PostgreSQL, Redis Cluster and S3 by setting the variables documented in
README.md.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# --- Core -----------------------------------------------------------------------------------
DEBUG = env.bool("DJANGO_DEBUG", default=False)
# The default key is only good for a laptop; set DJANGO_SECRET_KEY anywhere else.
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="gatekeeper-insecure-development-key-change-me")
# Keys rotated out that signatures are still checked with (the unsubscribe links of emails sent
# before the rotation, sessions); signing always uses SECRET_KEY. Comma separated.
SECRET_KEY_FALLBACKS = env.list("DJANGO_SECRET_KEY_FALLBACKS", default=[])
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

# --- HTTPS ------------------------------------------------------------------------------------
# Served over HTTPS (directly or behind a TLS proxy): on unless DEBUG. `make run` turns it off,
# since it serves plain HTTP on loopback; so do the tests.
HTTPS = env.bool("DJANGO_HTTPS", default=not DEBUG)
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=365 * 86400 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_HSTS_PRELOAD", default=True)
# Load balancers probe the backend itself, over plain HTTP: no redirect for the probes.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# Behind a TLS proxy that sets X-Forwarded-Proto (and strips it from clients): trust it, or
# every request looks like plain HTTP and is redirected forever.
if env.bool("DJANGO_TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "gatekeeper.apps.GatekeeperAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "anymail",
    "segments",
    "limits",
    "worker",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves admin and API-docs assets from the web process itself: nothing else to run.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "gatekeeper.urls"
WSGI_APPLICATION = "gatekeeper.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'gatekeeper.sqlite3'}")
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A test database on disk, not in memory, so worker processes started by the end-to-end
    # tests can share it.
    # GATEKEEPER_TEST_SQLITE names another file, so that two test runs can go on side by side.
    test_file = env.str("GATEKEEPER_TEST_SQLITE", default=str(VAR_DIR / "test-gatekeeper.sqlite3"))
    DATABASES["default"].setdefault("TEST", {"NAME": test_file})
    # SQLite creates its file but not its directory; a fresh checkout has no var/ yet.
    VAR_DIR.mkdir(exist_ok=True)
    # Web, worker and beat write to one file: WAL lets readers run beside a writer, and
    # IMMEDIATE transactions take the write lock up front (waiting up to `timeout` seconds)
    # instead of failing with "database is locked" when two read-then-write transactions meet.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
# Connections are kept between requests and worker tasks (a worker runs thousands of chunks
# a minute; opening a PostgreSQL connection for each costs milliseconds), checked before
# reuse, and closed after DATABASE_CONN_MAX_AGE seconds or an error.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
# The languages the pages people see are shipped in (the preference page follows the
# browser's Accept-Language among them); the admin stays in LANGUAGE_CODE.
LANGUAGES = [("en", "English"), ("fr", "Français")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Static files are served by the web process (whitenoise), straight from the apps when
# `collectstatic` has not run, so a fresh checkout needs no build step.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT = env.path("STATIC_ROOT", default=str(VAR_DIR / "static"))
MEDIA_URL = "media/"
# Uploaded user lists live here unless USER_LIST_STORAGE points them at S3.
MEDIA_ROOT = env.path("MEDIA_ROOT", default=str(VAR_DIR / "media"))

# --- Redis ----------------------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
# True when REDIS_URL names one node of a Redis Cluster; the client then discovers the rest.
REDIS_CLUSTER = env.bool("REDIS_CLUSTER", default=False)
# Short timeouts: a stuck Redis must turn into an `unavailable` decision quickly, not a hung send.
REDIS_SOCKET_TIMEOUT = env.float("REDIS_SOCKET_TIMEOUT", default=0.5)
REDIS_CONNECT_TIMEOUT = env.float("REDIS_CONNECT_TIMEOUT", default=0.5)

# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default="") or None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_DEFAULT_QUEUE = "sends"
# Celery closes the database connections around every task unless told to reuse them; the
# worker then closes only unusable or old ones before each task (worker/celery_hooks.py).
CELERY_DB_REUSE_MAX = 1000
# The periodic tasks that keep everything else going run on a queue of their own, `upkeep`,
# served by a worker of its own (Procfile, docs/deploy.md): on `sends`, behind a blast's chunk
# tasks, the ledger's drain (which expires after 10 s) would never run and the ledger's stream
# would grow until trimmed. Each of these is short; the long work some of them start (chunks,
# webhook runs) goes to `sends`, and so do the periodic tasks that may run long themselves
# (the plan, a round's decision, erasures, the ledger's hourly upkeep, the dead addresses'
# report, which waits on a receiver), which would hold the upkeep worker up.
UPKEEP_QUEUE = "upkeep"
UPKEEP_TASKS = (
    "limits.tasks.ledger_drain",
    "limits.tasks.send_logs_sweep",
    "limits.tasks.suppression_journal_prune",
    "limits.tasks.webhooks_deliver_due",
    "segments.tasks.user_lists_stalled",
    "worker.tasks.send_chunks_due",
    "worker.tasks.send_jobs_start_due",
    "worker.tasks.mailbox_brakes",
)
CELERY_TASK_ROUTES = {
    "segments.tasks.*": {"queue": "builds"},
    **{name: {"queue": UPKEEP_QUEUE} for name in UPKEEP_TASKS},
}
# Above the longest task, so a task still running is never handed to a second worker.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3 * 3600),
    # How often a worker looks for tasks of dead workers whose visibility timeout has passed.
    "unacked_restore_interval": env.int("CELERY_UNACKED_RESTORE_INTERVAL", default=60),
    "unacked_restore_throttle": 1,
}
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# django-celery-beat's scheduler (the schedule in the database), run by any number of beat
# processes: the one holding a lease in Redis sends the tasks (gatekeeper/beat.py). A dead
# leader's lease ends after this many seconds and another beat takes the lead within a third
# of it more.
CELERY_BEAT_SCHEDULER = "gatekeeper.beat:LeaderScheduler"
GATEKEEPER_BEAT_LOCK_SECONDS = env.float("GATEKEEPER_BEAT_LOCK_SECONDS", default=15.0)
CELERY_BEAT_SCHEDULE = {
    # Deferred and retried chunks wait in the database, not in the broker (a countdown longer
    # than the visibility timeout would be delivered again and again); this queues them when due.
    "send-chunks-due": {"task": "worker.tasks.send_chunks_due", "schedule": 10.0},
    # Scheduled send jobs started within seconds of their start_at (not as countdown tasks:
    # the broker would hold them for days, past its visibility timeout).
    "send-jobs-start-due": {"task": "worker.tasks.send_jobs_start_due", "schedule": 2.0},
    # Rounds decided when they close (the choice runs on `sends`: a 10M-user round takes
    # minutes); a round's jobs start once it is decided.
    "rounds-decide-due": {"task": "worker.tasks.rounds_decide_due", "schedule": 5.0},
    # Mailbox providers whose complaints or bounces reach their brake paused (within 20 s).
    "mailbox-brakes": {"task": "worker.tasks.mailbox_brakes", "schedule": 15.0},
    # The plan of the scheduled jobs, made again when a job, a rule or the snapshot changes.
    "plan-refresh-due": {"task": "worker.tasks.plan_refresh_due", "schedule": 30.0},
    # A large user list whose validation task was lost is queued again.
    "user-lists-stalled": {"task": "segments.tasks.user_lists_stalled", "schedule": 300.0},
    # Users whose whole send log has aged out are dropped from their (still live) buckets.
    "send-logs-sweep": {"task": "limits.tasks.send_logs_sweep", "schedule": 60.0},
    # The send ledger: decisions moved from the Redis stream into the database; old days dropped.
    "ledger-drain": {"task": "limits.tasks.ledger_drain", "schedule": 2.0},
    "ledger-upkeep": {"task": "limits.tasks.ledger_upkeep", "schedule": 3600.0},
    # The suppression list's journal: changes older than 30 days dropped (the list stays).
    "suppression-journal-prune": {
        "task": "limits.tasks.suppression_journal_prune",
        "schedule": 86400.0,
    },
    # The event stream posted to the company's webhook endpoints: a run per endpoint due.
    "webhooks-deliver-due": {"task": "limits.tasks.webhooks_deliver_due", "schedule": 1.0},
    # Erasures: their second pass, a pass that waited for sends being made, a lost run.
    "users-erase-due": {"task": "limits.tasks.users_erase_due", "schedule": 30.0},
    # Dead push tokens and mailboxes POSTed to the deprecated GATEKEEPER_DEAD_ADDRESS_WEBHOOK
    # (when set); those the receiver did not take go again on the next run.
    "dead-addresses-report": {"task": "worker.tasks.dead_addresses_report_due", "schedule": 30.0},
}
CELERY_TIMEZONE = TIME_ZONE

# --- Gatekeeper -----------------------------------------------------------------------------
# Channel slugs a cap can name; `all` is the cross-channel scope and is always there. sms goes
# through the console until GATEKEEPER_DISPATCHERS names a provider for it (`twilio`).
GATEKEEPER_CHANNELS = env.list("GATEKEEPER_CHANNELS", default=["email", "push", "sms"])
# Every limiter key starts with this, so several deployments can share one Redis.
GATEKEEPER_KEY_PREFIX = env.str("GATEKEEPER_KEY_PREFIX", default="gk:")
# False: a Redis outage refuses sends (`unavailable`). True: it lets them through uncounted.
GATEKEEPER_FAIL_OPEN = env.bool("GATEKEEPER_FAIL_OPEN", default=False)
# Where snapshots are published: a directory, or s3://bucket/prefix.
GATEKEEPER_STORE_URL = env.str("GATEKEEPER_STORE_URL", default=str(VAR_DIR / "store"))
GATEKEEPER_S3_ENDPOINT_URL = env.str("GATEKEEPER_S3_ENDPOINT_URL", default="") or None
GATEKEEPER_S3_REGION = env.str("GATEKEEPER_S3_REGION", default="us-east-1")
GATEKEEPER_S3_ACCESS_KEY_ID = env.str("GATEKEEPER_S3_ACCESS_KEY_ID", default="") or None
GATEKEEPER_S3_SECRET_ACCESS_KEY = env.str("GATEKEEPER_S3_SECRET_ACCESS_KEY", default="") or None
# The last good snapshot is kept here so a process can start while the store is unreachable.
GATEKEEPER_SNAPSHOT_CACHE_DIR = env.path(
    "GATEKEEPER_SNAPSHOT_CACHE_DIR", default=str(VAR_DIR / "snapshot-cache")
)
# How many published versions stay in the store for rollback.
GATEKEEPER_SNAPSHOT_RETENTION = env.int("GATEKEEPER_SNAPSHOT_RETENTION", default=10)
# 32: ids fit BitMap; 64: snowflake-style ids, BitMap64 and the portable 64-bit format.
GATEKEEPER_ID_WIDTH = env.int("GATEKEEPER_ID_WIDTH", default=32)
# How often a process asks the store whether a new snapshot is live (seconds).
GATEKEEPER_SNAPSHOT_POLL_SECONDS = env.float("GATEKEEPER_SNAPSHOT_POLL_SECONDS", default=5.0)
# How long a process may use cached caps and rules before reading them again (seconds).
GATEKEEPER_CAPS_TTL_SECONDS = env.float("GATEKEEPER_CAPS_TTL_SECONDS", default=2.0)
# How long a process may decide by its in-memory suppression list before reading the changes
# made since (seconds; the process that made a change reads it at once).
GATEKEEPER_SUPPRESSION_TTL_SECONDS = env.float("GATEKEEPER_SUPPRESSION_TTL_SECONDS", default=2.0)
# The key of the hash an erased person is kept as (the gate refuses them by it). Empty: one made
# at random and kept in the database the first time it is needed. Set, never change it: a new
# key forgets who was erased.
GATEKEEPER_ERASURE_KEY = env.str("GATEKEEPER_ERASURE_KEY", default="")
# The address where recipients reach this gatekeeper: the unsubscribe links in marketing
# emails point here (https in production: mailbox providers ignore other one-click links).
GATEKEEPER_PUBLIC_URL = env.str("GATEKEEPER_PUBLIC_URL", default="http://127.0.0.1:8000")
# Users' time zone when neither the send nor their segment names one (calendar windows).
GATEKEEPER_DEFAULT_TIME_ZONE = env.str("GATEKEEPER_DEFAULT_TIME_ZONE", default="UTC")
# True while logs of the earlier two-sorted-set format may remain (docs/limiter.md, upgrading):
# the limiter moves a user's old logs into the new one before deciding for them.
GATEKEEPER_LOG_UPGRADE = env.bool("GATEKEEPER_LOG_UPGRADE", default=False)
# Buckets the sweep task looks at per run (every minute): 1,000 a minute goes through the
# 1M buckets of 270M users in about 17 hours, for about 0.3 s of Redis time a minute.
GATEKEEPER_LOG_SWEEP_BUCKETS = env.int("GATEKEEPER_LOG_SWEEP_BUCKETS", default=16_000)
# The send ledger (limits/ledger/): every decision kept in the database for this many days.
GATEKEEPER_LEDGER = env.bool("GATEKEEPER_LEDGER", default=True)
GATEKEEPER_LEDGER_DAYS = env.int("GATEKEEPER_LEDGER_DAYS", default=90)
# Backtests (worker/backtest.py): each split by user id into this many Celery tasks, so that more
# workers finish one sooner.
GATEKEEPER_BACKTEST_PARTS = env.int("GATEKEEPER_BACKTEST_PARTS", default=4)
# Outcome events (POST /api/v1/events/): an event id seen within this many days counts once.
GATEKEEPER_EVENTS_DEDUP_DAYS = env.int("GATEKEEPER_EVENTS_DEDUP_DAYS", default=30)
# Gate calls the ledger's Redis stream holds at most, undrained (about: trimmed approximately).
GATEKEEPER_LEDGER_BUFFER_MAX = env.int("GATEKEEPER_LEDGER_BUFFER_MAX", default=100_000)
# Who sees /metrics and the details of /readyz (segment slugs and sizes, the store's address):
# callers with `Authorization: Bearer <GATEKEEPER_METRICS_TOKEN>`, or from these networks (none
# by default: behind a proxy on the same host every caller would come from loopback). Everyone
# else gets /readyz's bare status (for load balancers) and a 403 from /metrics.
GATEKEEPER_METRICS_TOKEN = env.str("GATEKEEPER_METRICS_TOKEN", default="")
GATEKEEPER_METRICS_NETWORKS = env.list("GATEKEEPER_METRICS_NETWORKS", default=[])

# --- User lists -----------------------------------------------------------------------------
# An upload as sent (gzip counts compressed); a larger REST body is a 413 before it is read.
GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES = env.int(
    "GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES", default=2 * 2**30
)
# A list once decompressed, and its lines: a gzip that inflates beyond these is refused (a
# 300M-id list is about 3 GB of text).
GATEKEEPER_USER_LIST_MAX_BYTES = env.int("GATEKEEPER_USER_LIST_MAX_BYTES", default=8 * 2**30)
GATEKEEPER_USER_LIST_MAX_LINES = env.int("GATEKEEPER_USER_LIST_MAX_LINES", default=600_000_000)
# How much of an upload (decompressed) the web process validates itself, about half a second;
# a larger list is stored as `validating` and checked by a Celery task on the `builds` queue.
GATEKEEPER_USER_LIST_INLINE_BYTES = env.int("GATEKEEPER_USER_LIST_INLINE_BYTES", default=32 * 2**20)

# --- Dispatch -------------------------------------------------------------------------------
# Email goes through Django's email backends: smtp://user:pass@host:587 (add ?tls=True),
# consolemail:// (prints, the laptop default), dummymail:// (drops).
vars().update(env.email_url("EMAIL_URL", default="consolemail://"))
# Seconds each SMTP socket operation may take: a stalled server must not hold a send (and its
# chunk's lease, GATEKEEPER_CHUNK_LEASE_SECONDS) for ever.
EMAIL_TIMEOUT = env.float("EMAIL_TIMEOUT", default=20.0)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="Gatekeeper <marketing@example.com>")

# One dispatcher per channel (worker/delivery/registry.py), a JSON object:
# {"email": "smtp", "push": "fcm", "sms": "twilio"}. `smtp` sends through EMAIL_URL above; the
# name of an anymail ESP module (amazon_ses, sendgrid, mailgun, postmark, resend, ...) through
# that provider's API (worker/delivery/esp.py), its tracking webhooks feeding the suppression
# list (worker/delivery/tracking.py); `fcm`, `apns`, `webhook` send push; `twilio` sends sms;
# `console`, `memory`, `null` any channel. A channel left out keeps the earlier settings' choice
# (email: GATEKEEPER_EMAIL_PROVIDER, push: GATEKEEPER_PUSH_BACKEND, others: console). Anything
# wrong with it stops start-up with a message naming it (check worker.E002).
GATEKEEPER_DISPATCHERS = env.str("GATEKEEPER_DISPATCHERS", default="")

# Email providers (django-anymail), as earlier versions chose one (GATEKEEPER_DISPATCHERS' email
# wins): `smtp`, or the name of an anymail ESP module, which also makes it Django's EMAIL_BACKEND.
GATEKEEPER_EMAIL_PROVIDER = env.str("GATEKEEPER_EMAIL_PROVIDER", default="smtp").strip()
if GATEKEEPER_EMAIL_PROVIDER != "smtp":
    EMAIL_BACKEND = f"anymail.backends.{GATEKEEPER_EMAIL_PROVIDER}.EmailBackend"
# ANYMAIL_<NAME> is ANYMAIL["<NAME>"]: ANYMAIL_POSTMARK_SERVER_TOKEN, ANYMAIL_WEBHOOK_SECRET
# (user:password), ... A JSON object or array is decoded (ANYMAIL_AMAZON_SES_CLIENT_PARAMS=
# '{"region_name": "eu-west-1"}'), and so are numbers and true/false, except in a key, token,
# secret or password (all digits is still text there).
_ANYMAIL_TEXT = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")


def _anymail_value(name: str) -> object:
    text = env.str(name).strip()
    if text[:1] in ("{", "["):
        try:
            return env.json(name)
        except ValueError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from None
    if name.endswith(_ANYMAIL_TEXT):
        return text
    try:
        value = env.json(name)
    except ValueError:
        return text
    return value if isinstance(value, bool | int | float) else text


ANYMAIL = {
    name.removeprefix("ANYMAIL_"): _anymail_value(name)
    for name in sorted(env.ENVIRON)
    if name.startswith("ANYMAIL_")
}

# The push dispatcher as earlier versions named it (a dotted path such as
# worker.dispatchers.ConsolePushBackend, still read): GATEKEEPER_DISPATCHERS above says it now.
GATEKEEPER_PUSH_BACKEND = env.str("GATEKEEPER_PUSH_BACKEND", default="")
# Where the `webhook` push dispatcher posts each push (a relay to APNs/FCM, say).
GATEKEEPER_PUSH_WEBHOOK_URL = env.str("GATEKEEPER_PUSH_WEBHOOK_URL", default="")
# Push providers: FCM and APNs straight (worker/delivery/fcm.py, apns.py).
# Seconds one request to FCM or APNs may take: a stalled provider must not outlive the lease.
GATEKEEPER_PUSH_TIMEOUT_SECONDS = env.float("GATEKEEPER_PUSH_TIMEOUT_SECONDS", default=10.0)
# FCM: a service-account JSON file (empty: Application Default Credentials), and the project
# (empty: the credentials' own).
GATEKEEPER_FCM_CREDENTIALS = env.str("GATEKEEPER_FCM_CREDENTIALS", default="")
GATEKEEPER_FCM_PROJECT_ID = env.str("GATEKEEPER_FCM_PROJECT_ID", default="")
# FCM's endpoint, and a CA bundle trusted for it and for the credentials' token_uri (empty: the
# system's): both for a local stand-in in tests.
GATEKEEPER_FCM_URL = env.str("GATEKEEPER_FCM_URL", default="https://fcm.googleapis.com")
GATEKEEPER_FCM_CA_BUNDLE = env.str("GATEKEEPER_FCM_CA_BUNDLE", default="")
# APNs with token-based authentication: the .p8 signing key's path, its key id, the team id and
# the app's bundle id (the topic); the sandbox is for development builds of the app.
GATEKEEPER_APNS_KEY = env.str("GATEKEEPER_APNS_KEY", default="")
GATEKEEPER_APNS_KEY_ID = env.str("GATEKEEPER_APNS_KEY_ID", default="")
GATEKEEPER_APNS_TEAM_ID = env.str("GATEKEEPER_APNS_TEAM_ID", default="")
GATEKEEPER_APNS_TOPIC = env.str("GATEKEEPER_APNS_TOPIC", default="")
GATEKEEPER_APNS_SANDBOX = env.bool("GATEKEEPER_APNS_SANDBOX", default=False)
# APNs' endpoint (empty: Apple's, production or sandbox) and a CA bundle to trust for it (empty:
# the system's): both for a local stand-in in tests.
GATEKEEPER_APNS_URL = env.str("GATEKEEPER_APNS_URL", default="")
GATEKEEPER_APNS_CA_BUNDLE = env.str("GATEKEEPER_APNS_CA_BUNDLE", default="")
# SMS through Twilio (worker/delivery/twilio.py; GATEKEEPER_DISPATCHERS '{"sms": "twilio"}').
# The account, and its Auth Token: it sends when no API key is set, and always checks the STOP
# webhook's signatures (worker/delivery/twilio_inbound.py).
GATEKEEPER_TWILIO_ACCOUNT_SID = env.str("GATEKEEPER_TWILIO_ACCOUNT_SID", default="")
GATEKEEPER_TWILIO_AUTH_TOKEN = env.str("GATEKEEPER_TWILIO_AUTH_TOKEN", default="")
# An API key (SK...) and its secret to send with instead: revocable on its own.
GATEKEEPER_TWILIO_API_KEY_SID = env.str("GATEKEEPER_TWILIO_API_KEY_SID", default="")
GATEKEEPER_TWILIO_API_KEY_SECRET = env.str("GATEKEEPER_TWILIO_API_KEY_SECRET", default="")
# The sender: one of the account's numbers, or a Messaging Service (MG...) and its pool.
GATEKEEPER_TWILIO_FROM = env.str("GATEKEEPER_TWILIO_FROM", default="")
GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID = env.str(
    "GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID", default=""
)
# Seconds a text may wait in Twilio's queue before Twilio drops it (ValidityPeriod, 1 to 36000;
# 0: Twilio's default, 10 hours). With a provider rate that keeps the queue short, a few minutes
# keep a late text from arriving inside quiet hours (docs/worker.md, "SMS through Twilio").
GATEKEEPER_TWILIO_VALIDITY_SECONDS = env.int("GATEKEEPER_TWILIO_VALIDITY_SECONDS", default=0)
# Seconds to connect, and between an answer's bytes: a stalled Twilio must not outlive the lease.
GATEKEEPER_TWILIO_TIMEOUT_SECONDS = env.float("GATEKEEPER_TWILIO_TIMEOUT_SECONDS", default=10.0)
# Twilio's API and a CA bundle to trust for it (empty: the system's): for a local stand-in.
GATEKEEPER_TWILIO_API_URL = env.str("GATEKEEPER_TWILIO_API_URL", default="https://api.twilio.com")
GATEKEEPER_TWILIO_CA_BUNDLE = env.str("GATEKEEPER_TWILIO_CA_BUNDLE", default="")
# Deprecated (check worker.W004; docs/deploy.md): dead addresses are events of the event stream
# (type dead_address), posted to its webhook endpoints. Set, this version still POSTs them here
# too, per send job, as unsigned JSON (worker/delivery/dead_addresses.py); the next one will not.
GATEKEEPER_DEAD_ADDRESS_WEBHOOK = env.str("GATEKEEPER_DEAD_ADDRESS_WEBHOOK", default="")
# Sends a second per provider, kept by every worker together (worker/delivery/throttle.py):
# "smtp=14,webhook=500"; a provider not named is not throttled.
GATEKEEPER_PROVIDER_RATES = env.str("GATEKEEPER_PROVIDER_RATES", default="")
# Off: email is not grouped by mailbox provider (no rates per group, warm-up or brakes), for a
# mail server in front that does it (worker/delivery/deliverability.py).
GATEKEEPER_DELIVERABILITY = env.bool("GATEKEEPER_DELIVERABILITY", default=True)
# A recipient domain no mailbox provider names is matched by its MX hosts, asked of DNS once a
# day a domain (worker/delivery/mailboxes.py); off: it is in `other`.
GATEKEEPER_MAILBOX_MX_LOOKUP = env.bool("GATEKEEPER_MAILBOX_MX_LOOKUP", default=False)
# The brakes (worker/delivery/brakes.py): a mailbox provider is paused when, with at least
# MIN_DELIVERED delivered over 24 hours, its spam complaints reach COMPLAINT_RATE of them or its
# hard bounces BOUNCE_RATE of its sent.
GATEKEEPER_BRAKE_COMPLAINT_RATE = env.float("GATEKEEPER_BRAKE_COMPLAINT_RATE", default=0.003)
GATEKEEPER_BRAKE_BOUNCE_RATE = env.float("GATEKEEPER_BRAKE_BOUNCE_RATE", default=0.05)
GATEKEEPER_BRAKE_MIN_DELIVERED = env.int("GATEKEEPER_BRAKE_MIN_DELIVERED", default=1000)
# The name servers a sending domain's check asks (worker/delivery/dns.py): `10.0.0.2`,
# `10.0.0.2:5353`, `[2001:db8::53]:5353`, comma separated; empty: the system's resolver.
GATEKEEPER_DNS_NAMESERVERS = env.str("GATEKEEPER_DNS_NAMESERVERS", default="")
# Seconds one DNS question may take, retries included: an admin page that checks waits that long.
GATEKEEPER_DNS_TIMEOUT_SECONDS = env.float("GATEKEEPER_DNS_TIMEOUT_SECONDS", default=2.0)
# Recipients gated per gate call and per Celery task.
GATEKEEPER_SEND_CHUNK_SIZE = env.int("GATEKEEPER_SEND_CHUNK_SIZE", default=5000)
# A campaign file uploaded to POST /api/v1/sends/ or the admin, as sent (gzip counts compressed):
# refused beyond this from its Content-Length. 100M recipients are about 4 GB of plain CSV.
GATEKEEPER_SEND_FILE_MAX_UPLOAD_BYTES = env.int(
    "GATEKEEPER_SEND_FILE_MAX_UPLOAD_BYTES", default=16 * 2**30
)
# A plain campaign file larger than this is read in parts of about this size, each by whichever
# send worker is free (worker/preparing.py); at least 1 MiB.
GATEKEEPER_SEND_FILE_PART_BYTES = max(
    2**20, env.int("GATEKEEPER_SEND_FILE_PART_BYTES", default=32 * 2**20)
)
# A run holds its chunk this long, renewed as it goes; a killed worker's chunk is free after it.
GATEKEEPER_CHUNK_LEASE_SECONDS = env.float("GATEKEEPER_CHUNK_LEASE_SECONDS", default=60.0)
# A chunk handed to the broker this long ago and still not run is queued again (a lost task).
GATEKEEPER_CHUNK_REQUEUE_SECONDS = env.float("GATEKEEPER_CHUNK_REQUEUE_SECONDS", default=1800.0)

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "gatekeeper.lib.api.ApiSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Gatekeeper API",
    "DESCRIPTION": "Segment-aware frequency caps for marketing email and push.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI and Redoc assets come from the sidecar package: the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several models have a `status`: name each set of states after its model.
    "ENUM_NAME_OVERRIDES": {
        "BuildStatusEnum": "segments.models.Build.Status",
        "UserListStatusEnum": "segments.models.UserList.Status",
        "SendJobStatusEnum": "worker.models.SendJob.Status",
        "RoundStatusEnum": "worker.models.Round.Status",
        "ExperimentStatusEnum": "limits.studies.experiments.STATUSES",
        "OnCappedEnum": "worker.models.SendJob.OnCapped",
        # The same choices as a request body states them (msgspec lists a Literal's values sorted).
        "OnCappedChoiceEnum": [("defer", "defer"), ("drop", "drop")],
        "OnInvalidEnum": "worker.models.SendJob.OnInvalid",
        # A channel, and a channel or `all` (rules, caps): both are fields named `channel`.
        "ChannelEnum": "limits.channels.channels",
        # An event type of the stream: its events' `type`, and the types an endpoint takes.
        "EventTypeEnum": [
            (t, t) for t in ("dead_address", "decision", "outcome", "preferences", "suppression")
        ],
        "ScopeEnum": "limits.channels.scopes",
        # What a draft's change does (backtests): each kind of change names its own `op`.
        "DraftOpAddEnum": [("add", "add")],
        "DraftOpChangeEnum": [("change", "change")],
        "DraftOpDeleteEnum": [("delete", "delete")],
        # A decision's reason, and why a user is on the suppression list: both `reason`.
        "ReasonEnum": "limits.reasons.REASONS",
        "SuppressionReasonEnum": "limits.people.suppression.REASONS",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gatekeeper.lib.api.postprocess_schema",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    # twilio-python logs every request's URL and headers at INFO: ten lines per text.
    "loggers": {"twilio.http_client": {"level": "WARNING"}},
}

# --- Logs and errors (gatekeeper/lib/json_logs.py, gatekeeper/lib/reporting.py) -------------
# `json`: one JSON object a line, for a log shipper (Celery's worker and beat too).
GATEKEEPER_LOG_FORMAT = env.str("GATEKEEPER_LOG_FORMAT", default="plain")
if GATEKEEPER_LOG_FORMAT not in ("plain", "json"):
    raise ValueError(f"GATEKEEPER_LOG_FORMAT is {GATEKEEPER_LOG_FORMAT!r}: plain or json.")
if GATEKEEPER_LOG_FORMAT == "json":
    LOGGING = {
        **LOGGING,
        "formatters": {"json": {"()": "gatekeeper.lib.json_logs.json_formatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    }
# The level from which Celery's routine lines about the periodic tasks of CELERY_BEAT_SCHEDULE
# are written (beat's "Sending due task", a worker's "Task ... received" and "succeeded", all at
# INFO): WARNING keeps the several lines a second they make out of the logs; INFO shows them
# (worker/celery_hooks.py). Everything else logs as LOG_LEVEL and --loglevel say.
GATEKEEPER_PERIODIC_LOG_LEVEL = env.str("GATEKEEPER_PERIODIC_LOG_LEVEL", default="WARNING").upper()
if GATEKEEPER_PERIODIC_LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ValueError(
        f"GATEKEEPER_PERIODIC_LOG_LEVEL is {GATEKEEPER_PERIODIC_LOG_LEVEL!r}: DEBUG, INFO, "
        "WARNING, ERROR or CRITICAL."
    )
# Errors to Sentry (none by default): a project's DSN; sentry-sdk is imported only then.
SENTRY_DSN = env.str("SENTRY_DSN", default="")
SENTRY_ENVIRONMENT = env.str("SENTRY_ENVIRONMENT", default="")
SENTRY_TRACES_SAMPLE_RATE = env.float("SENTRY_TRACES_SAMPLE_RATE", default=0.0)
if SENTRY_DSN:
    from gatekeeper.lib.reporting import sentry_start

    sentry_start(
        dsn=SENTRY_DSN,
        environment=SENTRY_ENVIRONMENT,
        traces_sample_rate=SENTRY_TRACES_SAMPLE_RATE,
    )
