"""/healthz (the process answers) and /readyz (it can gate: snapshot, Redis, database).

Anyone gets /readyz's bare status, for load balancers; the checks, which name the snapshot
version and the store, only callers `operator_allowed` lets in."""

from django.db import connection
from django.http import HttpRequest, JsonResponse

from gatekeeper.lib.probes import operator_allowed
from limits.engine.limiter import get_limiter
from segments.index import get_index, index_status


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, dict[str, object]] = {}
    index = get_index()
    checks["snapshot"] = {"ok": index is not None, **index_status()}
    checks["redis"] = {"ok": get_limiter().ping()}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = {"ok": True}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": str(exc)}
    ready = all(check["ok"] for check in checks.values())
    body: dict[str, object] = {"ready": ready}
    if operator_allowed(request):
        body["checks"] = checks
    return JsonResponse(body, status=200 if ready else 503)
