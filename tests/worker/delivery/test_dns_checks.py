"""A sending domain checked in DNS: SPF, DKIM per selector, DMARC and their alignment, read by
the real dnspython from a DNS server on loopback that serves the zone each test writes
(tests/support/dns.py); a server that never answers; the fields' one rule, the write path and
the admin's pages."""

import time

import pytest
from django.core.checks import run_checks
from django.urls import reverse

from limits.models.policy import SettingChange
from worker.delivery.dns import DnsUnavailable, mx_hosts, nameservers_parsed, txt_records
from worker.delivery.dns_checks import (
    SendingDomainFields,
    Status,
    domain_checked,
    organizational_domain,
    sending_domain_problems,
)
from worker.delivery.sending_domains import (
    SendingDomainInvalid,
    sending_domain_change,
    sending_domain_create,
    sending_domain_delete,
)
from worker.models import SendingDomain

DOMAIN = "news.example.com"
KEY = "MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDwIRP/UC3SBsEmGqZ9ZJW3/DkMoGeLnQg1fWn7/zYt"
SPF = "v=spf1 include:_spf.esp-mail.net ~all"
DMARC = "v=DMARC1; p=quarantine; rua=mailto:dmarc@example.com"


def well_set(zone, domain: str = DOMAIN) -> None:
    """Everything right: one SPF ending ~all, keys for s1 and s2, DMARC quarantine."""
    zone.txt(domain, SPF, "google-site-verification=abc")
    zone.txt(f"s1._domainkey.{domain}", f"v=DKIM1; k=rsa; p={KEY}")
    zone.txt(f"s2._domainkey.{domain}", f"v=DKIM1; k=rsa; p={KEY}")
    zone.txt(f"_dmarc.{domain}", DMARC)


def checked(return_path: str = "", selectors=("s1", "s2")):
    return domain_checked(DOMAIN, dkim_selectors=list(selectors), return_path=return_path)


def test_a_domain_set_up_right_is_ok_everywhere_and_aligned(dns_server):
    well_set(dns_server.zone)
    report = checked()
    assert [(c.name, c.status) for c in report.checks] == [
        ("SPF", Status.OK), ("DKIM s1", Status.OK), ("DKIM s2", Status.OK),
        ("DMARC", Status.OK), ("Alignment", Status.OK),
    ]  # fmt: skip
    assert report.status == Status.OK and report.dkim_aligned and report.spf_aligned
    assert report.spf.found == (SPF,)  # the site verification record is not SPF
    assert report.policy is not None and report.policy.p == "quarantine"
    assert report.policy.rua == ("mailto:dmarc@example.com",)
    assert "DMARC passes on either" in report.alignment.words
    assert all(c.fix == "" for c in report.checks)


def test_no_spf_record_is_a_problem_saying_what_to_add(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((DOMAIN, "TXT"))
    report = checked()
    assert report.spf.status == Status.PROBLEM and report.spf.found == ()
    assert f"Add one TXT record at {DOMAIN}" in report.spf.fix
    # SPF cannot pass, so it does not align; DKIM still carries DMARC.
    assert not report.spf_aligned and report.alignment.status == Status.OK


def test_two_spf_records_are_a_problem(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.txt(DOMAIN, "v=spf1 include:mailgun.org -all")
    report = checked()
    assert report.spf.status == Status.PROBLEM and len(report.spf.found) == 2
    assert "has 2 SPF records" in report.spf.words and "Merge them" in report.spf.fix


@pytest.mark.parametrize("ending", ["+all", "all"])
def test_an_spf_record_letting_anyone_send_is_a_problem(dns_server, ending):
    dns_server.zone.txt(DOMAIN, f"v=spf1 include:_spf.esp-mail.net {ending}")
    report = checked()
    assert report.spf.status == Status.PROBLEM
    assert "every server in the world" in report.spf.words and "~all" in report.spf.fix


@pytest.mark.parametrize(
    "record, said",
    [("v=spf1 include:_spf.esp-mail.net ?all", '"?all"'), ("v=spf1 ip4:192.0.2.1", 'no "all"')],
)
def test_a_neutral_or_missing_ending_is_a_warning(dns_server, record, said):
    dns_server.zone.txt(DOMAIN, record)
    report = checked()
    assert report.spf.status == Status.WARNING and said in report.spf.words


def test_an_spf_record_past_the_lookup_limit_is_a_problem(dns_server):
    includes = " ".join(f"include:s{n}.example.net" for n in range(11))
    dns_server.zone.txt(DOMAIN, f"v=spf1 {includes} -all")
    report = checked()
    assert report.spf.status == Status.PROBLEM and "makes 11 DNS lookups" in report.spf.words


def test_a_dmarc_record_without_a_valid_policy_is_a_problem(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((f"_dmarc.{DOMAIN}", "TXT"))
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", "v=DMARC1; p=block; rua=mailto:d@example.com")
    report = checked()
    assert report.dmarc.status == Status.PROBLEM and "no valid policy" in report.dmarc.words


def test_a_missing_dkim_key_is_a_problem_for_that_selector_alone(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((f"s2._domainkey.{DOMAIN}", "TXT"))
    report = checked()
    s1, s2 = report.dkim
    assert s1.status == Status.OK and s2.status == Status.PROBLEM
    assert s2.where == f"s2._domainkey.{DOMAIN}" and "No DKIM key" in s2.words
    assert "Publish the record your email provider gives for selector 's2'" in s2.fix
    assert report.dkim_aligned
    assert f"signs as {DOMAIN}, where the key of s1 is published" in report.alignment.words


def test_a_revoked_dkim_key_is_a_problem(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((f"s1._domainkey.{DOMAIN}", "TXT"))
    dns_server.zone.txt(f"s1._domainkey.{DOMAIN}", "v=DKIM1; k=rsa; p=")
    report = checked()
    assert report.dkim[0].status == Status.PROBLEM and "revoked" in report.dkim[0].words
    assert report.dkim[1].status == Status.OK


def test_a_selector_published_as_a_cname_to_the_providers_key_is_found(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.cname(f"k1._domainkey.{DOMAIN}", "dkim.esp-mail.net")
    dns_server.zone.txt("dkim.esp-mail.net", f"v=DKIM1; p={KEY}")
    (k1,) = checked(selectors=["k1"]).dkim
    assert k1.status == Status.OK and k1.found == (f"v=DKIM1; p={KEY}",)


def test_a_4096_bit_key_too_long_for_udp_is_read_over_tcp(dns_server):
    well_set(dns_server.zone)
    long_key = "MIICIjANBgkqhkiG9w0BAQEFAAOCAg8AMIICCgKCAgEA" + "x" * 686 + "IDAQAB"
    dns_server.zone.txt(f"big._domainkey.{DOMAIN}", f"v=DKIM1; k=rsa; p={long_key}")
    (big,) = checked(selectors=["big"]).dkim
    assert big.status == Status.OK and long_key in big.found[0]
    assert dns_server.zone.asked["tcp"] >= 1


def test_no_selectors_named_is_a_warning_saying_what_to_ask_for(dns_server):
    well_set(dns_server.zone)
    report = checked(selectors=())
    (dkim,) = report.dkim
    assert dkim.status == Status.WARNING and "Ask your email provider which selectors" in dkim.fix
    assert not report.dkim_aligned and report.alignment.status == Status.WARNING


def test_dmarc_missing_at_the_domain_is_read_at_its_organizational_domain(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((f"_dmarc.{DOMAIN}", "TXT"))
    dns_server.zone.txt(
        "_dmarc.example.com", "v=DMARC1; p=none; sp=reject; rua=mailto:d@example.com"
    )
    report = checked()
    assert report.dmarc.status == Status.OK and report.dmarc.where == "_dmarc.example.com"
    assert "organizational domain example.com covers news.example.com" in report.dmarc.words
    assert "rejected" in report.dmarc.words  # its sp=, not its p=, governs a subdomain


def test_no_dmarc_record_is_a_problem_naming_the_mailbox_providers_rule(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((f"_dmarc.{DOMAIN}", "TXT"))
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", "v=spf1 -all")  # not DMARC
    report = checked()
    assert report.dmarc.status == Status.PROBLEM and report.policy is None
    assert "Gmail and Yahoo require one" in report.dmarc.words
    assert f"Add a TXT record at _dmarc.{DOMAIN}" in report.dmarc.fix
    assert report.status == Status.PROBLEM


def test_a_monitoring_only_policy_is_a_warning_saying_to_move_to_quarantine(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((f"_dmarc.{DOMAIN}", "TXT"))
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", "v=DMARC1; p=none; rua=mailto:d@example.com")
    report = checked()
    assert report.dmarc.status == Status.WARNING and "only report" in report.dmarc.words
    assert "move to p=quarantine" in report.dmarc.fix


def test_a_return_path_on_another_organization_leaves_dmarc_to_dkim(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.txt("bounces.esp-mail.net", "v=spf1 include:_spf.esp-mail.net -all")
    report = checked(return_path="bounces.esp-mail.net")
    assert report.spf.status == Status.OK and report.spf.where == "bounces.esp-mail.net"
    assert report.dkim_aligned and not report.spf_aligned
    assert report.alignment.status == Status.OK
    words = report.alignment.words
    assert "SPF does not align" in words and "another organizational domain (esp-mail.net)" in words
    assert "DMARC passes on DKIM alone" in words
    assert "bounces.news.example.com" in report.alignment.fix


def test_a_return_path_under_the_domain_aligns_unless_dmarc_asks_for_strict(dns_server):
    well_set(dns_server.zone)
    dns_server.zone.txt("bounces.example.com", "v=spf1 include:_spf.esp-mail.net -all")
    assert checked(return_path="bounces.example.com").spf_aligned
    dns_server.zone.records.pop((f"_dmarc.{DOMAIN}", "TXT"))
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", "v=DMARC1; p=reject; aspf=s")
    report = checked(return_path="bounces.example.com")
    assert not report.spf_aligned and "aspf=s" in report.alignment.words


def test_neither_aligned_is_a_problem(dns_server):
    dns_server.zone.txt("bounces.esp-mail.net", "v=spf1 include:_spf.esp-mail.net ?all")
    dns_server.zone.txt(f"_dmarc.{DOMAIN}", DMARC)
    report = checked(return_path="bounces.esp-mail.net")
    assert report.alignment.status == Status.PROBLEM
    assert "every message fails DMARC" in report.alignment.words
    # The return path's record is the provider's to mend.
    assert report.spf.fix.startswith("bounces.esp-mail.net is your email provider's: ask them.")


def test_a_server_that_never_answers_makes_every_check_unknown_within_the_timeout(silent_dns):
    started = time.monotonic()
    report = checked(selectors=("s1", "s2", "s3"))
    took = time.monotonic() - started
    assert {c.status for c in report.checks} == {Status.UNKNOWN}
    assert report.spf.words.startswith("Could not check: no answer about news.example.com (TXT)")
    # One question waited the timeout (0.5 s); the other five were not asked.
    assert took < 1.4, took


def test_a_question_that_times_out_raises_dns_unavailable_saying_so(silent_dns):
    with pytest.raises(DnsUnavailable, match=r"within 0\.5 s") as timed_out:
        txt_records(DOMAIN)
    assert timed_out.value.timed_out


def test_a_servfail_raises_dns_unavailable_naming_it(dns_server):
    dns_server.zone.servfail.add("broken.example.com")
    with pytest.raises(DnsUnavailable, match="SERVFAIL") as failed:
        txt_records("broken.example.com")
    assert not failed.value.timed_out


def test_mx_hosts_come_by_preference_lowercase_without_the_dot(dns_server):
    dns_server.zone.mx("example.org", 20, "Backup.Mail.example.org.")
    dns_server.zone.mx("example.org", 10, "mx2.example.org")
    dns_server.zone.mx("example.org", 10, "mx1.example.org")
    dns_server.zone.mx("nomail.example.org", 0, ".")
    dns_server.zone.txt("txt-only.example.org", "hello")
    assert mx_hosts("example.org") == [
        "mx1.example.org", "mx2.example.org", "backup.mail.example.org",
    ]  # fmt: skip
    assert mx_hosts("missing.example.org") == []  # NXDOMAIN
    assert mx_hosts("txt-only.example.org") == []  # the name, no MX
    assert mx_hosts("nomail.example.org") == []  # "takes no mail" (RFC 7505)
    assert txt_records("missing.example.org") == []


@pytest.mark.parametrize(
    "name, organization",
    [
        ("news.example.com", "example.com"),
        ("example.com", "example.com"),
        ("mail.shop.example.co.uk", "example.co.uk"),
        ("bounces.example.com.au", "example.com.au"),
        ("a.b.example.co.jp", "example.co.jp"),
        ("example.uk", "example.uk"),
    ],
)
def test_the_organizational_domain_is_two_labels_or_three_under_a_public_second_level(
    name, organization
):
    assert organizational_domain(name) == organization


def test_the_nameservers_setting_reads_ports_and_names_a_bad_entry(settings):
    assert nameservers_parsed("10.0.0.2, 10.0.0.3:5353,[2001:db8::53]:53,2001:db8::1") == (
        ("10.0.0.2", 53), ("10.0.0.3", 5353), ("2001:db8::53", 53), ("2001:db8::1", 53),
    )  # fmt: skip
    assert nameservers_parsed("") == ()
    settings.GATEKEEPER_DNS_NAMESERVERS = "10.0.0.2,dns.example.com"
    (error,) = [m for m in run_checks() if m.id == "worker.E004"]
    assert "'dns.example.com' is not an IP address" in error.msg
    with pytest.raises(DnsUnavailable, match=r"'dns\.example\.com' is not an IP address"):
        txt_records(DOMAIN)


# --- the fields' rule and the write path --------------------------------------------------------


@pytest.mark.parametrize(
    "fields, field, said",
    [
        (SendingDomainFields("news example.com"), "domain", "has a space in it"),
        (SendingDomainFields("localhost"), "domain", "is one label"),
        (SendingDomainFields("News.Example.com"), "domain", "lowercase"),
        (SendingDomainFields("a" * 64 + ".com"), "domain", "is not a DNS label"),
        (SendingDomainFields(DOMAIN, ("s1.x",)), "dkim_selectors", "'s1.x' is not a selector"),
        (
            SendingDomainFields(DOMAIN, tuple(f"s{n}" for n in range(11))),
            "dkim_selectors",
            "At most 10; these are 11",
        ),
        (SendingDomainFields(DOMAIN, ("s1", "s1")), "dkim_selectors", "each selector once"),
        (SendingDomainFields(DOMAIN, return_path="bounces"), "return_path", "is one label"),
    ],
)
def test_bad_fields_are_named_and_nothing_is_stored(db, fields, field, said):
    problems = sending_domain_problems(fields)
    assert list(problems) == [field] and said in problems[field][0]
    with pytest.raises(SendingDomainInvalid) as refused:
        sending_domain_create(fields=fields)
    assert refused.value.field_errors() == problems
    assert not SendingDomain.objects.exists() and not SettingChange.objects.exists()


def test_every_change_goes_through_the_one_write_path_in_words(db, django_user_model):
    ops = django_user_model.objects.create_user("ops")
    row = sending_domain_create(
        fields=SendingDomainFields(DOMAIN, ("s1",), "bounces.example.com"), by=ops
    )
    with pytest.raises(SendingDomainInvalid, match="a sending domain already"):
        sending_domain_create(fields=SendingDomainFields(DOMAIN))
    sending_domain_change(row, fields=SendingDomainFields(DOMAIN, ("s1", "s2")), by=ops)
    sending_domain_delete(row, by=ops)
    history = SettingChange.objects.filter(kind=SettingChange.Kind.SENDING_DOMAIN).order_by("id")
    assert [(c.action, c.words) for c in history] == [
        ("created", f"Created: {DOMAIN}, DKIM selectors s1, return path bounces.example.com."),
        ("changed", "DKIM selectors: s1 → s1, s2; return path: bounces.example.com → none"),
        ("deleted", f"Deleted: {DOMAIN} is no longer checked."),
    ]
    assert {c.by_id for c in history} == {ops.pk} and not SendingDomain.objects.exists()


# --- the admin ------------------------------------------------------------------------------------


def test_the_admin_lists_adds_and_checks_a_sending_domain(db, admin_client, dns_server):
    well_set(dns_server.zone)
    dns_server.zone.records.pop((f"_dmarc.{DOMAIN}", "TXT"))
    add = reverse("admin:worker_sendingdomain_add")
    refused = admin_client.post(
        add, {"domain": "news example.com", "dkim_selectors": "s1.x", "return_path": ""}
    )
    page = refused.content.decode()
    assert refused.status_code == 200
    assert "has a space in it" in page and "&#x27;s1.x&#x27; is not a selector" in page
    assert not SendingDomain.objects.exists() and not SettingChange.objects.exists()

    added = admin_client.post(add, {"domain": DOMAIN, "dkim_selectors": "s1, s2"})
    assert added.status_code == 302
    row = SendingDomain.objects.get()
    assert row.dkim_selectors == ["s1", "s2"] and row.return_path == ""
    (change,) = SettingChange.objects.filter(kind=SettingChange.Kind.SENDING_DOMAIN)
    assert change.action == "created" and change.by is not None and change.via == "admin"

    listed = admin_client.get(reverse("admin:worker_sendingdomain_changelist")).content.decode()
    dns_url = reverse("admin:worker_sendingdomain_dns", args=[row.pk])
    assert DOMAIN in listed and f'href="{dns_url}"' in listed
    change_page = admin_client.get(reverse("admin:worker_sendingdomain_change", args=[row.pk]))
    assert f'href="{dns_url}"' in change_page.content.decode()
    assert 'value="s1, s2"' in change_page.content.decode()
    assert "kind__exact=sending_domain&amp;object_id=" in change_page.content.decode()

    changed = admin_client.post(
        reverse("admin:worker_sendingdomain_change", args=[row.pk]),
        {"domain": DOMAIN, "dkim_selectors": "s1 s2 s3", "return_path": "bounces.example.com"},
    )
    assert changed.status_code == 302
    row.refresh_from_db()
    assert row.dkim_selectors == ["s1", "s2", "s3"] and row.return_path == "bounces.example.com"
    assert SettingChange.objects.filter(action="changed", via="admin").get().words == (
        "DKIM selectors: s1, s2 → s1, s2, s3; return path: none → bounces.example.com"
    )
    dns_server.zone.txt("bounces.example.com", SPF)
    dns_server.zone.txt(f"s3._domainkey.{DOMAIN}", f"v=DKIM1; p={KEY}")

    checks = admin_client.get(dns_url)
    text = checks.content.decode()
    assert checks.status_code == 200
    assert '<th scope="col">What to fix</th>' in text and "Problem" in text
    assert "Gmail and Yahoo require one" in text and "v=spf1 include:_spf.esp-mail.net" in text
    assert "5 OK, 1 problem" in text


def test_the_check_page_says_could_not_check_when_dns_does_not_answer(db, admin_client, silent_dns):
    row = sending_domain_create(fields=SendingDomainFields(DOMAIN, ("s1",)))
    page = admin_client.get(reverse("admin:worker_sendingdomain_dns", args=[row.pk]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "Could not check: no answer about news.example.com (TXT) within 0.5 s" in text
    assert "4 could not be checked" in text


def test_deleting_in_the_admin_is_recorded(db, admin_client):
    row = sending_domain_create(fields=SendingDomainFields(DOMAIN))
    deleted = admin_client.post(
        reverse("admin:worker_sendingdomain_delete", args=[row.pk]), {"post": "yes"}
    )
    assert deleted.status_code == 302 and not SendingDomain.objects.exists()
    assert SettingChange.objects.filter(
        kind=SettingChange.Kind.SENDING_DOMAIN, action="deleted", via="admin"
    ).exists()
