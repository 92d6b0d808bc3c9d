"""Recipient domains grouped by their mail servers (GATEKEEPER_MAILBOX_MX_LOOKUP): a company's
own domain whose mail Google Workspace or Microsoft 365 hosts is Gmail's or Microsoft's to accept
or refuse, whatever its name.

A domain's MX hosts are asked of DNS (worker/delivery/dns.py, within
GATEKEEPER_DNS_TIMEOUT_SECONDS) once a day: kept in Redis (`<prefix>mx:<domain>`, the hosts
comma separated) for every process, and in this process for as long. A domain DNS could not
answer for is `other` and asked again after MX_FAILED_SECONDS, so that a slow name server
costs a chunk its timeout once in a while, not once a chunk. A domain's group is the group whose
`mx_hosts` its most preferred server ends with (`aspmx.l.google.com` ends with `google.com`).
"""

import contextlib
import logging
import time
from collections.abc import Iterable, Sequence

from django.conf import settings

from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis
from worker.delivery.dns import DnsUnavailable, mx_hosts

logger = logging.getLogger(__name__)

MX_KEPT_SECONDS = 86_400
MX_FAILED_SECONDS = 300
UNKNOWN = "?"  # DNS did not answer
KNOWN_MAX = 100_000  # domains this process keeps

_known: dict[str, tuple[float, str]] = {}  # domain -> (until, hosts as kept)


def mx_key(domain: str) -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}mx:{domain}"


def mx_forget() -> None:
    _known.clear()


def _looked_up(domain: str) -> tuple[str, int]:
    """(the hosts as kept, seconds to keep them), from DNS."""
    try:
        return ",".join(mx_hosts(domain)), MX_KEPT_SECONDS
    except DnsUnavailable as exc:
        logger.warning("The mail servers of %s are unknown: %s", domain, exc)
        return UNKNOWN, MX_FAILED_SECONDS


def mx_of(domains: Iterable[str]) -> dict[str, list[str]]:
    """Each domain's MX hosts, most preferred first ([] when none, or unknown)."""
    now = time.monotonic()
    found: dict[str, str] = {}
    asked = []
    for domain in dict.fromkeys(domains):
        kept = _known.get(domain)
        if kept is not None and kept[0] > now:
            found[domain] = kept[1]
        else:
            asked.append(domain)
    stored: list[str | None] = [None] * len(asked)
    if asked:
        with contextlib.suppress(*REDIS_DOWN):  # DNS, then
            stored = [
                v.decode() if isinstance(v, bytes) else v
                for v in get_redis().mget([mx_key(d) for d in asked])
            ]
    writes = {}
    for domain, hosts in zip(asked, stored, strict=True):
        keep = MX_KEPT_SECONDS
        if hosts is None:
            hosts, keep = _looked_up(domain)
            writes[domain] = (hosts, keep)
        found[domain] = hosts
        if len(_known) < KNOWN_MAX:
            _known[domain] = (now + (MX_FAILED_SECONDS if hosts == UNKNOWN else keep), hosts)
    if writes:
        with contextlib.suppress(*REDIS_DOWN), get_redis().pipeline(transaction=False) as pipe:
            for domain, (hosts, keep) in writes.items():  # kept in this process anyway
                pipe.set(mx_key(domain), hosts, ex=keep)
            pipe.execute()
    return {d: [] if h in ("", UNKNOWN) else h.split(",") for d, h in found.items()}


def mx_group(hosts: Sequence[str], suffixes: Sequence[tuple[str, str]], default: str) -> str:
    """The group whose MX host suffix the most preferred host ends with (`suffixes` longest
    first); `default` when none does."""
    if not hosts:
        return default
    host = hosts[0]
    for suffix, group in suffixes:
        if host == suffix or host.endswith("." + suffix):
            return group
    return default
