"""A sending domain checked in DNS, as receivers read it: SPF, DKIM for the selectors its email
provider signs with, DMARC, and whether they align with the domain mail is From; each check with
what was found and, in plain words, what to fix (docs/deliverability.md). And the one rule for a
sending domain's fields (`sending_domain_problems`).

- **SPF**: exactly one `v=spf1` TXT record at the return-path domain (the bounce address's
  domain, which receivers check; the domain itself when the provider uses it). Two records are
  an error to receivers (SPF fails for every message), so is `+all` (anyone may send as the
  domain); `?all` or no `all` at the end leaves unlisted servers neutral (a warning).
- **DKIM**: a key (`v=DKIM1`, or any record with `p=`) at `<selector>._domainkey.<domain>` for
  each selector; an empty `p=` is a revoked key.
- **DMARC**: one `v=DMARC1` record at `_dmarc.<domain>`, or else at the organizational domain's
  `_dmarc` (as receivers look: its `sp=`, or `p=`, then governs). None is a problem: Gmail and
  Yahoo require one from bulk senders since February 2024. `p=none` only reports (a warning).
- **Alignment**: DMARC passes a message when DKIM or SPF passes for a domain aligned with the
  From domain. DKIM aligns when a selector's key is found at the domain (the provider signs
  `d=<domain>`); SPF aligns when the return-path domain is the domain, or (relaxed, unless
  `aspf=s`) shares its organizational domain.

A check DNS could not answer is `unknown` ("could not check: ..."), never a problem. Once a
question timed out, the others are not asked (each would wait as long): a name server that
does not answer costs a page that checks one GATEKEEPER_DNS_TIMEOUT_SECONDS, not one per
question.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from worker.delivery.dns import DnsUnavailable, txt_records

SELECTORS_MAX = 10
HOSTNAME_MAX = 253
LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
SELECTOR = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
SPF_LOOKUPS_MAX = 10  # DNS lookups receivers allow an SPF check (RFC 7208, 4.6.4)

# Second-level names under which registries hand out names (example.co.uk): there the
# organizational domain has three labels, elsewhere two. A small set of common ones, not the
# Public Suffix List: a domain under a public suffix not named here (example.gov.br) is read as
# one organization with its neighbours, so SPF may be said to align where a receiver would not.
PUBLIC_SECOND_LEVEL = frozenset(
    {
        "co.uk", "org.uk", "ac.uk", "gov.uk", "me.uk", "ltd.uk", "plc.uk",
        "com.au", "net.au", "org.au", "edu.au", "gov.au",
        "co.nz", "net.nz", "org.nz",
        "co.jp", "ne.jp", "or.jp", "ac.jp", "go.jp",
        "com.br", "net.br", "org.br",
        "co.za", "org.za",
        "co.in", "net.in", "org.in",
        "co.kr", "or.kr",
        "com.cn", "net.cn", "org.cn",
        "com.hk", "com.sg", "com.tw", "com.mx", "com.ar", "com.tr", "co.il", "co.id",
        "com.my", "com.ph", "co.th", "com.vn", "com.ua",
    }
)  # fmt: skip


class Status(StrEnum):
    OK = "ok"
    WARNING = "warning"
    PROBLEM = "problem"
    UNKNOWN = "unknown"  # DNS could not answer


# Worst first: a report's status is its worst check's.
SEVERITY = (Status.PROBLEM, Status.UNKNOWN, Status.WARNING, Status.OK)
STATUS_WORDS = {
    Status.OK: "OK",
    Status.WARNING: "Warning",
    Status.PROBLEM: "Problem",
    Status.UNKNOWN: "Could not check",
}


@dataclass(frozen=True)
class Check:
    """One check: `name` ("SPF", "DKIM s1", "DMARC", "Alignment"), its status, the DNS name
    it read (`where`), the records found there, what they mean (`words`) and what to do about
    them (`fix`; empty when nothing)."""

    name: str
    status: Status
    where: str
    found: tuple[str, ...]
    words: str
    fix: str = ""

    @property
    def status_words(self) -> str:
        return STATUS_WORDS[self.status]


@dataclass(frozen=True)
class DmarcPolicy:
    """A DMARC record read: its policy (`p`), its subdomains' (`sp`, empty: as `p`), DKIM's
    and SPF's alignment modes (`r` relaxed, `s` strict) and where aggregate reports go."""

    p: str
    sp: str = ""
    adkim: str = "r"
    aspf: str = "r"
    rua: tuple[str, ...] = ()
    pct: int = 100


@dataclass(frozen=True)
class DomainReport:
    domain: str
    spf: Check
    dkim: tuple[Check, ...]
    dmarc: Check
    alignment: Check
    # The DMARC record that governs the domain, read (None: none, or DNS could not tell).
    policy: DmarcPolicy | None = None
    dkim_aligned: bool = False
    spf_aligned: bool = False

    @property
    def checks(self) -> tuple[Check, ...]:
        return (self.spf, *self.dkim, self.dmarc, self.alignment)

    @property
    def status(self) -> Status:
        statuses = {check.status for check in self.checks}
        return next(s for s in SEVERITY if s in statuses)


# --- the fields' one rule ---------------------------------------------------------------------


@dataclass(frozen=True)
class SendingDomainFields:
    domain: str
    dkim_selectors: tuple[str, ...] = ()
    return_path: str = ""


def hostname_problem(name: str) -> str | None:
    """What keeps `name` from being a domain mail can be sent from (None: nothing)."""
    if not name:
        return "Give a domain, such as example.com."
    if name != name.lower():
        return f"Write it in lowercase: {name.lower()}."
    if any(c.isspace() for c in name):
        return f"{name!r} has a space in it: a domain is letters, digits, '-' and dots."
    if len(name) > HOSTNAME_MAX:
        return f"At most {HOSTNAME_MAX} characters; this is {len(name)}."
    labels = name.split(".")
    if len(labels) < 2:
        return f"{name!r} is one label: a domain has a dot, such as example.com."
    for label in labels:
        if not LABEL.fullmatch(label):
            return (
                f"{label or '(empty)'!r} is not a DNS label: 1 to 63 lowercase letters, digits "
                "and '-', neither first nor last."
            )
    if labels[-1].isdigit():
        return f"{name!r} is an address, not a domain."
    return None


def sending_domain_problems(fields: SendingDomainFields) -> dict[str, list[str]]:
    """What is wrong with a sending domain's fields, by field: the one rule, every caller's."""
    problems: dict[str, list[str]] = {}
    if problem := hostname_problem(fields.domain):
        problems["domain"] = [problem]
    selectors = list(fields.dkim_selectors)
    if len(selectors) > SELECTORS_MAX:
        problems["dkim_selectors"] = [f"At most {SELECTORS_MAX}; these are {len(selectors)}."]
    else:
        bad = [s for s in selectors if not SELECTOR.fullmatch(s)]
        if bad:
            problems["dkim_selectors"] = [
                f"{bad[0]!r} is not a selector: one DNS label of 1 to 63 lowercase letters, "
                "digits, '-' and '_' (no dots); the provider names it (s1, k1, google)."
            ]
        elif len(set(selectors)) != len(selectors):
            problems["dkim_selectors"] = ["Name each selector once."]
    if fields.return_path and (problem := hostname_problem(fields.return_path)):
        problems["return_path"] = [problem]
    return problems


# --- reading records --------------------------------------------------------------------------


def organizational_domain(name: str) -> str:
    """The registered domain `name` is part of: its last two labels, or three under a public
    second level (PUBLIC_SECOND_LEVEL: mail.example.co.uk -> example.co.uk)."""
    labels = name.lower().rstrip(".").split(".")
    keep = 3 if ".".join(labels[-2:]) in PUBLIC_SECOND_LEVEL else 2
    return ".".join(labels[-keep:])


def tags(record: str) -> dict[str, str]:
    """A DKIM or DMARC record's `tag=value; ...` pairs (tag names lowercase; the first of a
    repeated tag)."""
    found: dict[str, str] = {}
    for part in record.split(";"):
        name, equals, value = part.partition("=")
        if equals:
            found.setdefault(name.strip().lower(), value.strip())
    return found


def is_spf(record: str) -> bool:
    return record.lower() == "v=spf1" or record.lower().startswith("v=spf1 ")


def is_dmarc(record: str) -> bool:
    """A DMARC record: its first tag is v=DMARC1 (other TXT records may share the name)."""
    tag, _, value = record.split(";", 1)[0].partition("=")
    return tag.strip().lower() == "v" and value.strip().upper() == "DMARC1"


def dmarc_policy(record: str) -> DmarcPolicy:
    found = tags(record)

    def mode(tag: str) -> str:
        return "s" if found.get(tag, "r").lower() == "s" else "r"

    try:
        pct = max(0, min(100, int(found.get("pct", "100"))))
    except ValueError:
        pct = 100
    return DmarcPolicy(
        p=found.get("p", "").lower(),
        sp=found.get("sp", "").lower(),
        adkim=mode("adkim"),
        aspf=mode("aspf"),
        rua=tuple(u.strip() for u in found.get("rua", "").split(",") if u.strip()),
        pct=pct,
    )


class _Asker:
    """The report's questions: each name asked once; after a question timed out, the rest are
    not asked (each would wait as long) and raise the same DnsUnavailable."""

    def __init__(self) -> None:
        self.asked: dict[str, list[str]] = {}
        self.timeout: DnsUnavailable | None = None

    def __call__(self, name: str) -> list[str]:
        if self.timeout is not None:
            raise self.timeout
        if name not in self.asked:
            try:
                self.asked[name] = txt_records(name)
            except DnsUnavailable as exc:
                if exc.timed_out:
                    self.timeout = exc
                raise
        return self.asked[name]


# --- the checks -------------------------------------------------------------------------------


def _unknown(name: str, where: str, exc: DnsUnavailable) -> Check:
    return Check(
        name, Status.UNKNOWN, where, (), f"Could not check: {exc}.",
        "Nothing to fix here yet: check again later. If it keeps failing, the name servers "
        "this gatekeeper asks (GATEKEEPER_DNS_NAMESERVERS) may be unreachable from it.",
    )  # fmt: skip


def spf_checked(where: str, ask: Callable[[str], list[str]]) -> Check:
    name = "SPF"
    try:
        records = [r for r in ask(where) if is_spf(r)]
    except DnsUnavailable as exc:
        return _unknown(name, where, exc)
    found = tuple(records)
    if not records:
        return Check(
            name, Status.PROBLEM, where, found,
            f"There is no SPF record at {where}, so receivers cannot tell which servers may "
            f"send its mail.",
            f"Add one TXT record at {where} as your email provider gives it, such as "
            f'"v=spf1 include:<your provider\'s domain> ~all".',
        )  # fmt: skip
    if len(records) > 1:
        return Check(
            name, Status.PROBLEM, where, found,
            f"{where} has {len(records)} SPF records. Receivers treat that as an error: SPF "
            "fails for every message.",
            "Merge them into one record: one \"v=spf1\", every include: of each, and one ~all "
            "at the end.",
        )  # fmt: skip
    terms = records[0].split()[1:]
    lookups = sum(
        1
        for t in terms
        if re.match(r"[+?~-]?(include:|a\b|mx\b|ptr\b|exists:|redirect=)", t.lower())
    )
    if lookups > SPF_LOOKUPS_MAX:
        return Check(
            name, Status.PROBLEM, where, found,
            f"The record makes {lookups} DNS lookups itself; receivers allow "
            f"{SPF_LOOKUPS_MAX} in all, so SPF fails with an error.",
            "Remove the includes of services that no longer send for you, or ask your provider "
            "for a flattened record.",
        )  # fmt: skip
    ending = next((t.lower() for t in terms if t.lower().lstrip("+-~?") == "all"), None)
    redirect = next((t for t in terms if t.lower().startswith("redirect=")), None)
    if ending in ("+all", "all"):
        return Check(
            name, Status.PROBLEM, where, found,
            f'The record ends with "{ending}": it says every server in the world may send as '
            f"{where}, so SPF proves nothing and spam filters distrust it.",
            'End it with "~all" (soft fail) or "-all" (fail) instead.',
        )  # fmt: skip
    if ending == "?all":
        return Check(
            name, Status.WARNING, where, found,
            'The record ends with "?all": mail from servers it does not list is neither '
            "passed nor failed, so SPF does little against someone sending as you.",
            'End it with "~all" (soft fail), or "-all" once every sender is listed.',
        )  # fmt: skip
    if ending is None and redirect is None:
        return Check(
            name, Status.WARNING, where, found,
            'The record has no "all" at its end: mail from servers it does not list is '
            "judged neutral.",
            'End it with "~all" (soft fail), or "-all" once every sender is listed.',
        )  # fmt: skip
    said = f"its ending comes from {redirect}" if ending is None else f'it ends with "{ending}"'
    return Check(
        name, Status.OK, where, found,
        f"One SPF record; {said}: servers it does not list fail.",
    )  # fmt: skip


def dkim_checked(domain: str, selector: str, ask: Callable[[str], list[str]]) -> Check:
    name, where = f"DKIM {selector}", f"{selector}._domainkey.{domain}"
    try:
        records = ask(where)
    except DnsUnavailable as exc:
        return _unknown(name, where, exc)
    keys = [r for r in records if tags(r).get("v", "").upper() == "DKIM1" or "p" in tags(r)]
    found = tuple(keys)
    if not keys:
        return Check(
            name, Status.PROBLEM, where, tuple(records),
            f"No DKIM key at {where}: receivers cannot verify mail signed with selector "
            f"{selector!r}, so it fails DKIM.",
            f"Publish the record your email provider gives for selector {selector!r} (a TXT or "
            "a CNAME pointing at theirs), or remove the selector here if they do not sign "
            "with it.",
        )  # fmt: skip
    if len(keys) > 1:
        return Check(
            name, Status.WARNING, where, found,
            f"{len(keys)} DKIM records at {where}: a receiver may read either, so mail may "
            "fail when it reads the wrong one.",
            "Keep only the key your provider signs with.",
        )  # fmt: skip
    key = tags(keys[0])
    if not re.sub(r"\s", "", key.get("p", "")):
        return Check(
            name, Status.PROBLEM, where, found,
            f"The key at {where} is revoked (its p= is empty): mail signed with selector "
            f"{selector!r} fails DKIM.",
            f"Publish the provider's current key for {selector!r}, or remove the selector here "
            "if they no longer sign with it.",
        )  # fmt: skip
    if "y" in [f.strip().lower() for f in key.get("t", "").split(":")]:
        return Check(
            name, Status.WARNING, where, found,
            "The key is marked as testing (t=y): receivers may treat a failed signature as no "
            "signature.",
            "Remove t=y from the record once signing works.",
        )  # fmt: skip
    return Check(
        name, Status.OK, where, found,
        f"A key is published: mail the provider signs as {domain} with selector {selector!r} "
        "can pass DKIM.",
    )  # fmt: skip


def _no_selectors(domain: str) -> Check:
    return Check(
        "DKIM", Status.WARNING, f"<selector>._domainkey.{domain}", (),
        "No DKIM selectors are named for this domain, so DKIM was not checked.",
        f"Ask your email provider which selectors it signs {domain}'s mail with (SendGrid: s1 "
        "and s2; Mailchimp: k1; Amazon SES: three long ones; Google: google) and add them here.",
    )  # fmt: skip


def _policy_words(policy: DmarcPolicy) -> str:
    said = [f"p={policy.p}"]
    if policy.sp:
        said.append(f"sp={policy.sp}")
    said.append("DKIM alignment " + ("strict" if policy.adkim == "s" else "relaxed"))
    said.append("SPF alignment " + ("strict" if policy.aspf == "s" else "relaxed"))
    said.append(f"reports to {', '.join(policy.rua)}" if policy.rua else "no reports (no rua=)")
    if policy.pct < 100:
        said.append(f"applied to {policy.pct}% of failing mail")
    return "; ".join(said)


def dmarc_checked(domain: str, ask: Callable[[str], list[str]]) -> tuple[Check, DmarcPolicy | None]:
    name, where = "DMARC", f"_dmarc.{domain}"
    organization = organizational_domain(domain)
    try:
        records = [r for r in ask(where) if is_dmarc(r)]
        inherited = False
        if not records and organization != domain:
            # Receivers look at the organizational domain's record next (RFC 7489, 6.6.3).
            where, inherited = f"_dmarc.{organization}", True
            records = [r for r in ask(where) if is_dmarc(r)]
    except DnsUnavailable as exc:
        return _unknown(name, where, exc), None
    found = tuple(records)
    if not records:
        looked = f"_dmarc.{domain}" + (f" nor at {where}" if inherited else "")
        return Check(
            name, Status.PROBLEM, where, found,
            f"No DMARC record at {looked}. Since February 2024 Gmail and Yahoo require one "
            "from anyone sending them bulk mail; without it more of your mail is rejected or "
            "goes to spam.",
            f'Add a TXT record at _dmarc.{domain}: "v=DMARC1; p=none; '
            f'rua=mailto:dmarc-reports@{domain}" to start with; once the reports show your '
            "mail passes, move to p=quarantine.",
        ), None  # fmt: skip
    if len(records) > 1:
        return Check(
            name, Status.PROBLEM, where, found,
            f"{where} has {len(records)} DMARC records: receivers then ignore DMARC as if "
            "there were none.",
            "Keep one record.",
        ), None  # fmt: skip
    policy = dmarc_policy(records[0])
    applied = (policy.sp or policy.p) if inherited else policy.p
    source = (
        f"The record of the organizational domain {organization} covers {domain} "
        f"({'its sp=' if policy.sp else 'its p=, having no sp='}). "
        if inherited
        else ""
    )
    read = f"{source}Read: {_policy_words(policy)}."
    if applied not in ("none", "quarantine", "reject"):
        return Check(
            name, Status.PROBLEM, where, found,
            f"{read} The record has no valid policy (p= must be none, quarantine or reject), "
            "so receivers may ignore it.",
            "Add p=none to start with, then p=quarantine once the reports show your mail passes.",
        ), policy  # fmt: skip
    if applied == "none":
        fix = (
            "After a few weeks of reports showing your mail passes, move to p=quarantine "
            "(then p=reject)."
        )
        if not policy.rua:
            fix = (
                f"Add rua=mailto:dmarc-reports@{organization} to get the reports; once they show "
                "your mail passes, move to p=quarantine."
            )
        return Check(
            name, Status.WARNING, where, found,
            f"{read} With p=none receivers only report: mail that fails DMARC, someone "
            "sending as you included, is still delivered.",
            fix,
        ), policy  # fmt: skip
    return Check(
        name, Status.OK, where, found,
        f"{read} Mail that fails DMARC is {'quarantined' if applied == 'quarantine' else 'rejected'}"
        " by receivers.",
    ), policy  # fmt: skip


def alignment_checked(
    domain: str,
    *,
    spf_domain: str,
    spf: Check,
    dkim: Sequence[Check],
    signing: Sequence[str],
    policy: DmarcPolicy | None,
) -> tuple[Check, bool, bool]:
    """(the check, DKIM aligns, SPF aligns). `signing`: the selectors whose key was found."""
    name, where = "Alignment", domain
    strict_spf = policy is not None and policy.aspf == "s"
    dkim_aligned = bool(signing)
    if spf_domain == domain:
        same, how = True, f"the return path is {domain} itself"
    elif strict_spf:
        same, how = False, f"the return path {spf_domain} is not {domain} (aspf=s: strict)"
    elif organizational_domain(spf_domain) == organizational_domain(domain):
        same, how = (
            True,
            (
                f"the return path {spf_domain} is under the same organizational domain "
                f"({organizational_domain(domain)})"
            ),
        )
    else:
        same, how = (
            False,
            (
                f"the return path {spf_domain} is on another organizational domain "
                f"({organizational_domain(spf_domain)}) than {domain} "
                f"({organizational_domain(domain)})"
            ),
        )
    spf_passes = spf.status in (Status.OK, Status.WARNING)
    spf_aligned = same and spf_passes
    keys = f"the key{'s' if len(signing) > 1 else ''} of {', '.join(signing)}"
    dkim_words = (
        f"DKIM aligns: the provider signs as {domain}, where {keys} "
        f"{'are' if len(signing) > 1 else 'is'} published"
        if dkim_aligned
        else "DKIM does not align: no key of a named selector was found at " + domain
    )
    if spf_aligned:
        spf_words = f"SPF aligns: {how}"
    elif same:
        spf_words = f"SPF would align ({how}), but its record cannot pass as it is"
    else:
        spf_words = f"SPF does not align: {how}"
    unknown = [c for c in (spf, *dkim) if c.status == Status.UNKNOWN]
    said = f"{dkim_words}. {spf_words}."
    if dkim_aligned and spf_aligned:
        return Check(
            name, Status.OK, where, (), f"{said} DMARC passes on either.",
        ), True, True  # fmt: skip
    if dkim_aligned:
        return Check(
            name, Status.OK, where, (),
            f"{said} DMARC passes on DKIM alone, so a message whose signature breaks on its "
            "way fails.",
            "" if same else
            f"Optional: ask your provider for a return path under "
            f"{organizational_domain(domain)} (a custom bounce domain, such as bounces.{domain}) "
            "so that SPF aligns too.",
        ), True, False  # fmt: skip
    if unknown:
        return Check(
            name, Status.UNKNOWN, where, (),
            f"Could not check: {unknown[0].words.removeprefix('Could not check: ')}",
            "Check again later.",
        ), False, spf_aligned  # fmt: skip
    if spf_aligned:
        return Check(
            name, Status.WARNING, where, (),
            f"{said} DMARC passes on SPF alone, and SPF breaks when mail is forwarded.",
            f"Have your provider sign with DKIM as {domain}, and name its selectors here.",
        ), False, True  # fmt: skip
    return Check(
        name, Status.PROBLEM, where, (),
        f"{said} Neither aligns: every message fails DMARC, and with a p=quarantine or "
        "p=reject policy it goes to spam or is refused.",
        f"Have your provider sign with DKIM as {domain} (publish its keys and name the "
        f"selectors here), or use a return path under {domain}.",
    ), False, False  # fmt: skip


def domain_checked(
    domain: str,
    *,
    dkim_selectors: Sequence[str],
    return_path: str = "",
) -> DomainReport:
    """`domain` checked in DNS, as mail From it with this return path and these selectors is
    judged. DNS failing makes checks `unknown`; this never raises for it."""
    asked = _Asker()
    spf_domain = return_path or domain
    spf = spf_checked(spf_domain, asked)
    if spf.fix and organizational_domain(spf_domain) != organizational_domain(domain):
        spf = replace(spf, fix=f"{spf_domain} is your email provider's: ask them. {spf.fix}")
    keys = [dkim_checked(domain, selector, asked) for selector in dkim_selectors]
    signing = [
        selector
        for selector, check in zip(dkim_selectors, keys, strict=True)
        if check.status in (Status.OK, Status.WARNING)
    ]
    dkim = tuple(keys) or (_no_selectors(domain),)
    dmarc, policy = dmarc_checked(domain, asked)
    alignment, dkim_aligned, spf_aligned = alignment_checked(
        domain, spf_domain=spf_domain, spf=spf, dkim=dkim, signing=signing, policy=policy
    )
    return DomainReport(
        domain=domain, spf=spf, dkim=dkim, dmarc=dmarc, alignment=alignment, policy=policy,
        dkim_aligned=dkim_aligned, spf_aligned=spf_aligned,
    )  # fmt: skip
