"""Twilio's incoming message webhook: a reply of STOP puts its sender on the sms suppression
list, START takes them off again.

Configure it in Twilio's console as the number's (or the Messaging Service's) "A message comes
in" webhook, HTTP POST, at GATEKEEPER_PUBLIC_URL + /twilio/inbound/.

Security: every request must carry X-Twilio-Signature, Twilio's HMAC-SHA1 keyed with the
account's Auth Token (GATEKEEPER_TWILIO_AUTH_TOKEN) over the URL it called and the posted
parameters, checked with twilio-python's RequestValidator; a missing or wrong one is a 403 and
nothing is read. The URL is GATEKEEPER_PUBLIC_URL and the request's path, not what this server
saw: behind a proxy that ends TLS (or rewrites the host) the scheme, host and port Django sees
are not the ones Twilio signed, and the Host header is the caller's to choose. Without an Auth
Token every request is refused: nothing could tell Twilio's posts from anyone's.

What a reply means:
- an opt-out: `OptOutType` STOP (Twilio's Advanced Opt-Out, which also knows a service's own
  keywords), or a body that is, whole, trimmed and in any case, one of Twilio's standard
  opt-out keywords (OPT_OUT_KEYWORDS). Every user that number was texted for
  (worker/delivery/sms_numbers.py) goes on the sms suppression list, reason `unsubscribed`,
  source STOP_SOURCE. Twilio itself stops our sends to the number as well (21610).
- an opt-in: `OptOutType` START, or START, YES, UNSTOP. Those users come off the sms list only
  when their entry came from a STOP (this webhook) or from Twilio refusing a send with 21610
  (OPTED_OUT_SOURCE): never an entry a marketer made by hand, an import, or a link.
- anything else (HELP, a chat): nothing.
A number nobody was texted at is answered and logged; nobody is suppressed. Twilio posts a
webhook again when it gets no answer: a second STOP or START changes nothing.

The answer is 200 with empty TwiML: Twilio sends nothing more of ours (its own opt-out
confirmation is Twilio's).
"""

import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from twilio.request_validator import RequestValidator

from limits.channels import SMS, channels
from limits.models.people import Suppression
from limits.people.suppression import suppress, unsuppress
from worker.delivery.base import opted_out_source
from worker.delivery.sms_numbers import sms_users_of
from worker.delivery.twilio import PROVIDER

logger = logging.getLogger(__name__)

# Twilio's standard opt-out and opt-in keywords
# (www.twilio.com/docs/messaging/tutorials/advanced-opt-out).
OPT_OUT_KEYWORDS = frozenset(
    {"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT"}
)
OPT_IN_KEYWORDS = frozenset({"START", "YES", "UNSTOP"})
STOP, START = "STOP", "START"
# Where an sms suppression came from: a STOP reply here, or Twilio refusing a send with 21610
# (the chunk run's source for a provider's opted-out answer, worker/chunks.py).
STOP_SOURCE = f"{PROVIDER}:stop"
OPTED_OUT_SOURCE = opted_out_source(PROVIDER)
EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?><Response/>'


def reply_kind(params: dict[str, str]) -> str | None:
    """STOP, START or None: what a reply asks, by Twilio's OptOutType when it says, else by
    the body."""
    said = params.get("OptOutType", "").strip().upper()
    if said:
        return said if said in (STOP, START) else None
    word = params.get("Body", "").strip().upper()
    if word in OPT_OUT_KEYWORDS:
        return STOP
    if word in OPT_IN_KEYWORDS:
        return START
    return None


def signed_by_twilio(request: HttpRequest) -> bool:
    """Whether the request carries Twilio's signature for the public URL it was sent to."""
    token = settings.GATEKEEPER_TWILIO_AUTH_TOKEN
    signature = request.headers.get("X-Twilio-Signature", "")
    if not token or not signature:
        return False
    url = f"{settings.GATEKEEPER_PUBLIC_URL.rstrip('/')}{request.get_full_path()}"
    return bool(RequestValidator(token).validate(url, request.POST, signature))


@csrf_exempt  # Twilio posts without a form of ours; its signature is the proof
@require_POST
def twilio_inbound_view(request: HttpRequest) -> HttpResponse:
    if not signed_by_twilio(request):
        logger.warning("Twilio inbound webhook: a post without a valid signature refused")
        return HttpResponseForbidden("Not signed by Twilio.")
    params = {name: request.POST.get(name, "") for name in ("From", "Body", "OptOutType")}
    kind = reply_kind(params)
    if kind is not None:
        sms_reply(number=params["From"], kind=kind, sid=request.POST.get("MessageSid", ""))
    return HttpResponse(EMPTY_TWIML, content_type="text/xml")


def sms_reply(*, number: str, kind: str, sid: str) -> None:
    """Suppress (STOP) or lift (START) the users `number` was texted for."""
    if SMS not in channels():
        logger.warning("Twilio inbound %s from a number, but %s is not a channel here", kind, SMS)
        return
    users = sms_users_of(number)
    if not users:
        logger.info("Twilio inbound %s (%s) from a number nobody was texted at", kind, sid)
        return
    if kind == STOP:
        added = suppress(
            channel=SMS,
            user_ids=users,
            reason=Suppression.Reason.UNSUBSCRIBED,
            source=STOP_SOURCE,
            note=f"replied STOP ({sid})",
        )
        logger.info(
            "Twilio STOP (%s): %d users suppressed, %d already", sid, added, len(users) - added
        )
        return
    # Only what a STOP or Twilio's opted-out answer put there: a marketer's entry stays.
    removed = unsuppress(
        channel=SMS,
        user_ids=users,
        source=f"{PROVIDER}:start",
        only_from=(STOP_SOURCE, OPTED_OUT_SOURCE),
    )
    logger.info(
        "Twilio START (%s): %d users taken off the list, %d left as they were",
        sid,
        removed,
        len(users) - removed,
    )
