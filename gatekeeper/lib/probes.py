"""Who may read the operator's probes (/metrics, the details of /readyz): callers with
`Authorization: Bearer <GATEKEEPER_METRICS_TOKEN>`, or from GATEKEEPER_METRICS_NETWORKS (none by
default: behind a reverse proxy on the same host every caller comes from loopback). See
docs/api.md, "Health and metrics".
"""

import hmac
import ipaddress
from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@cache
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    try:
        return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries if entry)
    except ValueError as exc:
        raise ImproperlyConfigured(f"GATEKEEPER_METRICS_NETWORKS: {exc}") from exc


def operator_allowed(request: HttpRequest) -> bool:
    token = str(settings.GATEKEEPER_METRICS_TOKEN)
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(
        address in network for network in _networks(tuple(settings.GATEKEEPER_METRICS_NETWORKS))
    )
