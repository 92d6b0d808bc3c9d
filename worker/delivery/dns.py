"""The one place that asks DNS: a sending domain's TXT records (SPF, DKIM, DMARC:
worker/delivery/dns_checks.py) and a recipient domain's mail servers (MX).

- `GATEKEEPER_DNS_NAMESERVERS` names the servers asked (`10.0.0.2`, `10.0.0.2:5353`,
  `[2001:db8::53]:5353`, comma separated); empty: the system's (/etc/resolv.conf).
- `GATEKEEPER_DNS_TIMEOUT_SECONDS` bounds each question, its retries and every server tried
  included (dnspython's `lifetime`): a page that asks waits that long at most per question.
- A name that does not exist, or has no record of the type asked, has none: `[]`. DNS that could
  not answer (a timeout, every server failing or refusing, none configured) raises
  `DnsUnavailable`, with words: "we could not tell" is never read as "there is none".
- Names are asked as absolute names: the system's search domains are never appended.
- An answer too large for UDP is asked again over TCP (dnspython does it on a truncated answer):
  a 2048-bit DKIM key with its record's other tags often is.
"""

import functools
import ipaddress
from typing import Any

import dns.exception
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver
from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured

DNS_PORT = 53


class DnsUnavailable(Exception):
    """DNS could not answer a question (as against: there is no such record). `timed_out`: no
    answer came within GATEKEEPER_DNS_TIMEOUT_SECONDS, so asking again at once would wait as
    long."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _nameserver(entry: str) -> tuple[str, int] | None:
    """`10.0.0.2`, `10.0.0.2:5353`, `2001:db8::53` or `[2001:db8::53]:5353` as (address,
    port); None when it is none of these."""
    host, port = entry, str(DNS_PORT)
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else port
    elif entry.count(":") == 1:  # a bare IPv6 address has several colons
        host, port = entry.split(":")
    try:
        address, number = str(ipaddress.ip_address(host)), int(port)
    except ValueError:
        return None
    return (address, number) if 0 < number < 65536 else None


@functools.lru_cache(maxsize=8)
def nameservers_parsed(text: str) -> tuple[tuple[str, int], ...]:
    """`GATEKEEPER_DNS_NAMESERVERS`: (address, port) pairs; () for the system's resolver.
    ImproperlyConfigured names the entry that is not an IP address with an optional port."""
    servers = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        server = _nameserver(entry)
        if server is None:
            raise ImproperlyConfigured(
                f"GATEKEEPER_DNS_NAMESERVERS: {entry!r} is not an IP address with an optional "
                "port (10.0.0.2, 10.0.0.2:5353, [2001:db8::53]:5353)."
            )
        servers.append(server)
    return tuple(servers)


def _timeout() -> float:
    return float(settings.GATEKEEPER_DNS_TIMEOUT_SECONDS)


def dns_resolver() -> dns.resolver.Resolver:
    """A resolver asking GATEKEEPER_DNS_NAMESERVERS (or the system's), each question bounded
    by GATEKEEPER_DNS_TIMEOUT_SECONDS. DnsUnavailable when none is configured, or the setting
    is wrong."""
    try:
        servers = nameservers_parsed(str(settings.GATEKEEPER_DNS_NAMESERVERS))
    except ImproperlyConfigured as exc:  # check worker.E004 says so at start-up too
        raise DnsUnavailable(str(exc)) from exc
    if servers:
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = [
            dns.nameserver.Do53Nameserver(address, port) for address, port in servers
        ]
    else:
        try:
            resolver = dns.resolver.Resolver()
        except dns.resolver.NoResolverConfiguration as exc:
            raise DnsUnavailable(
                "no name server to ask: the system names none (/etc/resolv.conf) and "
                "GATEKEEPER_DNS_NAMESERVERS is empty"
            ) from exc
    resolver.timeout = resolver.lifetime = _timeout()
    resolver.cache = None  # a check reads what DNS holds now, not what it held a minute ago
    return resolver


def _answer(name: str, rdtype: dns.rdatatype.RdataType) -> list[Any]:
    """The records of `rdtype` at `name` ([] when the name or the type has none)."""
    try:
        absolute = dns.name.from_text(name)
    except dns.exception.DNSException:
        return []  # not a name DNS can hold (a label too long, an empty label): no records
    type_name = dns.rdatatype.to_text(rdtype)
    try:
        return list(dns_resolver().resolve(absolute, rdtype, search=False))
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return []
    except dns.resolver.LifetimeTimeout as exc:
        raise DnsUnavailable(
            f"no answer about {name} ({type_name}) within {_timeout():g} s", timed_out=True
        ) from exc
    except dns.resolver.NoNameservers as exc:
        errors = exc.kwargs.get("errors") or []
        # (server, over TCP, port, what went wrong, answer) for each attempt
        said = "; ".join(f"{e[0]}:{e[2]} {e[3]}" for e in errors[:3]) if errors else str(exc)
        raise DnsUnavailable(f"no name server answered about {name} ({type_name}): {said}") from exc
    except dns.exception.DNSException as exc:
        raise DnsUnavailable(f"DNS failed about {name} ({type_name}): {exc}") from exc


def txt_records(name: str) -> list[str]:
    """The TXT records at `name`, each one text (its strings joined, as SPF, DKIM and DMARC
    read them); [] when there are none."""
    return [
        b"".join(rdata.strings).decode("utf-8", errors="replace")
        for rdata in _answer(name, dns.rdatatype.TXT)
    ]


def mx_hosts(domain: str) -> list[str]:
    """The mail servers of `domain`, most preferred first (then by name): lowercase, without the
    trailing dot. [] when it has none, or says it takes no mail (RFC 7505's `0 .`)."""
    records = sorted(
        (rdata.preference, rdata.exchange.to_text(omit_final_dot=True).lower())
        for rdata in _answer(domain, dns.rdatatype.MX)
    )
    return [host for _, host in records if host and host != "."]


@register()
def dns_settings_check(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    try:
        nameservers_parsed(str(settings.GATEKEEPER_DNS_NAMESERVERS))
    except ImproperlyConfigured as exc:
        messages.append(Error(str(exc), id="worker.E004"))
    timeout = settings.GATEKEEPER_DNS_TIMEOUT_SECONDS
    if not isinstance(timeout, int | float) or not 0 < timeout <= 60:
        messages.append(
            Error(
                f"GATEKEEPER_DNS_TIMEOUT_SECONDS is {timeout!r}: seconds, more than 0 and at "
                "most 60.",
                id="worker.E004",
            )
        )
    return messages
