"""Mailbox providers: the groups recipients' email domains fall in (gmail, microsoft, yahoo,
apple, other), and the rates each dispatcher sends to each group at.

A recipient's group is found by its address's domain, lowercase: a group's `domains` name it
(`gmail.com`), or name its first labels followed by `*` (`hotmail.*`: hotmail.com, hotmail.co.uk;
`yahoo.co.*`). A domain no group names falls in `other`, unless GATEKEEPER_MAILBOX_MX_LOOKUP is
on and its mail servers (MX hosts, asked of DNS once a day a domain, within
GATEKEEPER_DNS_TIMEOUT_SECONDS, `other` when DNS does not answer) end in a group's `mx_hosts`:
a company's own domain whose mail Google or Microsoft hosts is theirs to accept or refuse.

A group's rates: for a dispatcher (its `provider`: smtp, amazon_ses, ...) or for every one
(`*`, when the dispatcher has none of its own), messages a second, a minute and an hour. The
tightest of them, spread evenly, is the group's rate: one token bucket per dispatcher and
group in Redis (`<prefix>rate:{<dispatcher>}:<group>`), shared by every worker
(worker/delivery/throttle.py), with a burst of 4% of a
second's worth, so that the rate holds within 4% over any second and within a send over any
minute or hour. A group without a rate is not held.

Every process reads the groups from the database at most every GROUPS_TTL seconds: a change
(a paused group above all) reaches every worker within that.

The one rule for a group's fields is `mailbox_problems`.
"""

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.delivery.dns_checks import LABEL, hostname_problem
from worker.delivery.mx import mx_group, mx_of
from worker.delivery.throttle import BURST_SECONDS, PROVIDER, RATE_MAX, Rate

OTHER = "other"  # the group of every domain no other group names; it cannot be deleted
ANY_DISPATCHER = "*"
GROUPS_TTL = 5.0  # seconds a process keeps the groups it read
GROUPS_MAX = 50
DOMAINS_MAX = 500  # domains (or MX host suffixes) a group names
SLUG = re.compile(r"[a-z][a-z0-9_-]{0,31}")
PERIODS = (("per_second", 1), ("per_minute", 60), ("per_hour", 3600))


def domain_of(address: str) -> str:
    """An email address's domain, lowercase, without a trailing dot."""
    return _plain(address.rpartition("@")[2])


def _plain(domain: str) -> str:
    return domain.strip().rstrip(".").lower()


def rate_of(entry: Mapping[str, Any]) -> Rate:
    """A rates entry's bucket: the tightest of its periods as sends a second, and its burst."""
    per_second = min(float(entry[name]) / seconds for name, seconds in PERIODS if entry.get(name))
    return Rate(per_second, max(1, int(per_second * BURST_SECONDS)))


@dataclass
class Mailboxes:
    """The groups as one process read them: which group a domain is in, each group's rates by
    dispatcher, and the paused groups (with the brake's figures)."""

    exact: dict[str, str] = field(default_factory=dict)  # domain -> group
    starts: dict[str, str] = field(default_factory=dict)  # "hotmail" of "hotmail.*" -> group
    mx: list[tuple[str, str]] = field(default_factory=list)  # (host suffix, group)
    rates: dict[tuple[str, str], Rate] = field(default_factory=dict)  # (dispatcher, group)
    paused: dict[str, Any] = field(default_factory=dict)  # group -> why
    known: dict[str, str] = field(default_factory=dict)  # domains looked up so far

    def group_of(self, address: str) -> str:
        return self.group_of_domain(domain_of(address))

    def group_of_domain(self, domain: str) -> str:
        found = self.known.get(domain)
        if found is None:
            found = self._named(domain)
            if found is None:
                found = mx_group(mx_of([domain])[domain], self.mx, OTHER) if self.mx else OTHER
            self._keep(domain, found)
        return found

    def groups_of(self, addresses: Iterable[str]) -> list[str]:
        """Each address's group. The domain is looked up as written first (most are written
        as the last time), made lowercase and plain only when not known yet."""
        raws = [a[a.rfind("@") + 1 :] for a in addresses]
        known = self.known
        if self.mx:
            # Every domain no group names, asked of the MX cache (and DNS) in one go.
            plain = {_plain(raw) for raw in set(raws) if raw not in known}
            unnamed = [d for d in plain if d not in known and self._named(d) is None]
            if unnamed:
                for domain, hosts in mx_of(unnamed).items():
                    self._keep(domain, mx_group(hosts, self.mx, OTHER))
        out = []
        for raw in raws:
            found = known.get(raw)
            if found is None:
                found = self.group_of_domain(_plain(raw))
                self._keep(raw, found)
            out.append(found)
        return out

    def _named(self, domain: str) -> str | None:
        """The group whose `domains` name it, or None."""
        found = self.exact.get(domain)
        if found is None and self.starts:
            labels = domain.split(".")
            for k in range(len(labels) - 1, 0, -1):
                found = self.starts.get(".".join(labels[:k]))
                if found is not None:
                    break
        return found

    def _keep(self, domain: str, group: str) -> None:
        if len(self.known) < 100_000:
            self.known[domain] = group

    def rate_for(self, dispatcher: str, group: str) -> Rate | None:
        """The group's rate through the dispatcher: its own, else every dispatcher's."""
        found = self.rates.get((dispatcher, group))
        return found if found is not None else self.rates.get((ANY_DISPATCHER, group))


def mailboxes_built(rows: Iterable[Any], *, mx_lookup: bool) -> Mailboxes:
    """Mailboxes from MailboxProvider rows (or anything with their fields)."""
    built = Mailboxes()
    for row in rows:
        for pattern in row.domains:
            if pattern.endswith(".*"):
                built.starts[pattern[:-2]] = row.slug
            else:
                built.exact[pattern] = row.slug
        if mx_lookup:
            built.mx.extend((suffix, row.slug) for suffix in row.mx_hosts)
        for entry in row.rates:
            built.rates[(entry["dispatcher"], row.slug)] = rate_of(entry)
        if row.paused_at is not None:
            built.paused[row.slug] = row.paused_why or {}
    # The longest suffix first: mail.protection.outlook.com before outlook.com.
    built.mx.sort(key=lambda pair: -len(pair[0]))
    return built


_read: tuple[float, Mailboxes] | None = None


def mailboxes(*, fresh: bool = False) -> Mailboxes:
    """The groups, read from the database at most every GROUPS_TTL seconds per process."""
    global _read
    now = time.monotonic()
    if fresh or _read is None or now - _read[0] > GROUPS_TTL:
        from django.conf import settings

        from worker.models import MailboxProvider

        rows = list(MailboxProvider.objects.all())
        _read = (now, mailboxes_built(rows, mx_lookup=settings.GATEKEEPER_MAILBOX_MX_LOOKUP))
    return _read[1]


def mailboxes_forget() -> None:
    """Read the groups again at the next call (this process's own change, tests)."""
    global _read
    _read = None


# --- the one rule for a group's fields --------------------------------------------------------


def _number_problem(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return f"{name} is {value!r}: a number of messages, or null."
    if not 0 < value <= RATE_MAX * 3600:
        return f"{name} is {value}: more than 0 (null: no limit), at most {RATE_MAX * 3600:,}."
    return None


def rates_problems(rates: Any) -> list[str]:
    """What is wrong with a group's `rates`, in words (empty: nothing)."""
    if not isinstance(rates, list):
        return ["A list of rates: [{dispatcher, per_second, per_minute, per_hour}]."]
    problems: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(rates):
        where = f"Rate {i + 1}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: an object {{dispatcher, per_second, per_minute, per_hour}}.")
            continue
        unknown = set(entry) - {"dispatcher", *(name for name, _ in PERIODS)}
        if unknown:
            problems.append(f"{where}: unknown field {', '.join(sorted(unknown))}.")
        dispatcher = entry.get("dispatcher", ANY_DISPATCHER)
        if dispatcher != ANY_DISPATCHER and not (
            isinstance(dispatcher, str) and PROVIDER.fullmatch(dispatcher)
        ):
            problems.append(
                f"{where}: the dispatcher {dispatcher!r} is not a provider's name (smtp, "
                "amazon_ses, ...) or '*' (every dispatcher)."
            )
        elif dispatcher in seen:
            problems.append(f"{where}: the dispatcher {dispatcher!r} has a rate already.")
        seen.add(str(dispatcher))
        found = [(name, entry.get(name)) for name, _ in PERIODS]
        problems.extend(
            f"{where}: {problem}"
            for name, value in found
            if (problem := _number_problem(name, value)) is not None
        )
        if all(value is None for _, value in found):
            problems.append(f"{where}: give per_second, per_minute or per_hour.")
    return problems


def rates_normalised(rates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Valid rates as stored: each with its dispatcher and its three periods (null: none)."""
    return [
        {"dispatcher": entry.get("dispatcher", ANY_DISPATCHER)}
        | {name: entry.get(name) for name, _ in PERIODS}
        for entry in rates
    ]


def _pattern_problem(pattern: str, *, mx: bool) -> str | None:
    """What keeps a group's domain (`hotmail.*` too) or MX host suffix from being one."""
    if not mx and pattern.endswith(".*"):
        first = pattern[:-2].split(".")
        if pattern[:-2] and all(LABEL.fullmatch(label) for label in first):
            return None
        return f"{pattern!r}: the labels before '.*' are lowercase letters, digits and '-'."
    found = hostname_problem(pattern)
    if found is None or pattern in found:
        return found
    return f"{pattern!r}: {found}"


def domains_problems(domains: Any, *, mx: bool = False) -> list[str]:
    """What is wrong with a group's domains (or, `mx`, its MX host suffixes)."""
    what = "MX host suffix" if mx else "domain"
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        return [f"A list of {what}s."]
    if len(domains) > DOMAINS_MAX:
        return [f"{len(domains)} {what}s: at most {DOMAINS_MAX}."]
    problems = [p for d in domains if (p := _pattern_problem(d, mx=mx)) is not None]
    twice = sorted({d for d in domains if domains.count(d) > 1})
    if twice:
        problems.append(f"Named twice: {', '.join(twice)}.")
    return problems


def mailbox_problems(
    fields: Mapping[str, Any], *, others: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Problems by field of a group's fields (slug, name, domains, mx_hosts, rates); `others`:
    the other groups' domains by slug (a domain is in one group only)."""
    problems: dict[str, list[str]] = {}
    slug = fields.get("slug")
    if not isinstance(slug, str) or not SLUG.fullmatch(slug):
        problems["slug"] = [
            "Lowercase letters, digits, '-' and '_', starting with a letter, at most 32."
        ]
    name = fields.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        problems["name"] = ["A name of 1 to 100 characters."]
    domains = fields.get("domains", [])
    found = domains_problems(domains)
    if not found and slug == OTHER and domains:
        found = ["'other' takes every domain no group names: it names none itself."]
    if not found:
        taken = {d: s for s, named in others.items() if s != slug for d in named}
        found = [f"{d!r} is in the group {taken[d]!r} already." for d in domains if d in taken]
    if found:
        problems["domains"] = found
    found = domains_problems(fields.get("mx_hosts", []), mx=True)
    if found:
        problems["mx_hosts"] = found
    found = rates_problems(fields.get("rates", []))
    if found:
        problems["rates"] = found
    return problems
