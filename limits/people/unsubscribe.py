"""One-click unsubscribe (RFC 8058): the link every marketing email carries, and its page.

Each marketing email names a link of its own in `List-Unsubscribe`, with
`List-Unsubscribe-Post: List-Unsubscribe=One-Click`: a mailbox provider's "unsubscribe" button
POSTs to it, and the user is on the suppression list for that channel at once (the gate
refuses their next marketing send). The link carries the user id and channel, signed with
SECRET_KEY (salted for this use; SECRET_KEY_FALLBACKS keep old links working after a key
rotation), so it needs no login and no stored token, and cannot be forged for another user.

A GET (a person clicking the link in the body, or a scanner fetching it) only shows a page with
a button: scanners follow links, and RFC 8058 forbids unsubscribing on a GET.
"""

import functools
import hashlib
import hmac

from django.conf import settings
from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from limits.channels import noun, scopes
from limits.models.people import Suppression
from limits.people.preference_page import preferences_token
from limits.people.suppression import suppress

_SALT = "gatekeeper.unsubscribe"
ONE_CLICK = "List-Unsubscribe=One-Click"


def _signer() -> signing.Signer:
    return signing.Signer(salt=_SALT)


@functools.lru_cache(maxsize=4)
def _signing_key(secret: str) -> bytes:
    """The HMAC key `signing.Signer(salt=_SALT)` derives from `secret` (Django's salted_hmac,
    SHA-256), derived once per secret instead of once per link."""
    return hashlib.sha256(f"{_SALT}signer{secret}".encode()).digest()


def unsubscribe_token(*, user_id: int, channel: str) -> str:
    """`signing.Signer(salt=_SALT).sign(...)` to the byte (a test holds the two equal; links
    are read back by the Signer, which also tries SECRET_KEY_FALLBACKS), made with one HMAC
    call: every marketing email signs a link, and the Signer derived its key again for each."""
    value = f"{user_id}-{channel}"
    mac = hmac.digest(_signing_key(settings.SECRET_KEY), value.encode(), "sha256")
    return f"{value}:{signing.b64_encode(mac).decode()}"


def token_reader(token: str) -> tuple[int, str] | None:
    """(user id, channel) of a token this gatekeeper signed, or None."""
    try:
        value = _signer().unsign(token)
    except signing.BadSignature:
        return None
    user_text, _, channel = value.partition("-")
    if not user_text.isdigit() or channel not in scopes():
        return None
    return int(user_text), channel


@functools.cache
def _around_token() -> tuple[str, str]:
    """The link's path before and after its token, reversed once: every marketing email has
    a link, and `reverse` cost three times the signing."""
    before, _, after = reverse("unsubscribe", args=["TOKEN"]).partition("TOKEN")
    return before, after


def unsubscribe_url(*, user_id: int, channel: str) -> str:
    before, after = _around_token()
    token = unsubscribe_token(user_id=user_id, channel=channel)
    return f"{settings.GATEKEEPER_PUBLIC_URL.rstrip('/')}{before}{token}{after}"


def unsubscribe_headers(*, user_id: int, channel: str) -> dict[str, str]:
    """The headers of a marketing message that make its unsubscribe one click (RFC 8058)."""
    return {
        "List-Unsubscribe": f"<{unsubscribe_url(user_id=user_id, channel=channel)}>",
        "List-Unsubscribe-Post": ONE_CLICK,
    }


@csrf_exempt  # mailbox providers POST without a form of ours; the signed link is the secret
@require_http_methods(["GET", "POST"])
def unsubscribe_view(request: HttpRequest, token: str) -> HttpResponse:
    found = token_reader(token)
    if found is None:
        return render(request, "limits/unsubscribe.html", {"state": "invalid"}, status=400)
    user_id, channel = found
    context = {
        "channel": channel,
        "what": noun(channel, 2),
        # Fewer rather than none: the person's own page, where they choose topics and pauses.
        "choices": reverse("preferences", args=[preferences_token(user_id)]),
    }
    if request.method == "GET":
        return render(request, "limits/unsubscribe.html", {**context, "state": "ask"})
    suppress(
        channel=channel,
        user_ids=[user_id],
        reason=Suppression.Reason.UNSUBSCRIBED,
        source="link",
        note="one-click" if request.POST.get("List-Unsubscribe") == "One-Click" else "page",
    )
    return render(request, "limits/unsubscribe.html", {**context, "state": "done"})
