"""What the dispatchers whose providers' libraries speak HTTP through requests share (FCM,
the ESPs of anymail, Twilio): an adapter that trusts a CA bundle of ours (the tests' local
fakes), and what a requests transport error says about whether the request reached the
provider."""

import ssl
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import MaxRetryError, NewConnectionError

from worker.delivery.base import AMBIGUOUS, PERMANENT, TRANSIENT, DispatchError, causes


class TrustingAdapter(HTTPAdapter):
    """An adapter that verifies servers against `ca_bundle` when one is given. Per request:
    requests lets REQUESTS_CA_BUNDLE, set on many hosts, override a session's own `verify`
    (psf/requests#3829)."""

    def __init__(self, *, ca_bundle: str | None, **kwargs: Any) -> None:
        self.ca_bundle = ca_bundle
        super().__init__(**kwargs)

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if self.ca_bundle:
            kwargs["verify"] = self.ca_bundle
        return super().send(request, *args, **kwargs)


def certificate_refused(err: BaseException) -> bool:
    """A certificate failing verification is refused in the handshake: nothing was sent. Other
    TLS failures may come after the request."""
    return any(isinstance(e, ssl.SSLCertVerificationError) for e in causes(err))


def requests_failure(provider: str, err: requests.RequestException) -> DispatchError:
    """A requests transport error: the provider has the request, or nothing was sent?"""
    if isinstance(err, requests.ConnectTimeout):
        return DispatchError(f"{provider}: connect timeout, nothing sent", kind=TRANSIENT)
    if isinstance(err, requests.exceptions.SSLError):
        if certificate_refused(err):
            return DispatchError(f"{provider}: certificate refused, nothing sent", kind=TRANSIENT)
        return DispatchError(f"{provider}: TLS failure, the request may be there", kind=AMBIGUOUS)
    if isinstance(err, requests.ConnectionError):
        reason = err.args[0] if err.args else None
        if isinstance(reason, MaxRetryError) and isinstance(reason.reason, NewConnectionError):
            # Refused, unreachable, or a name that does not resolve (NameResolutionError).
            return DispatchError(
                f"{provider} unreachable, nothing sent: {reason.reason}", kind=TRANSIENT
            )
        return DispatchError(
            f"{provider}: connection lost once the request was on its way: {reason}",
            kind=AMBIGUOUS,
        )
    if isinstance(
        err,
        (
            requests.exceptions.InvalidURL,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidSchema,
            requests.exceptions.InvalidHeader,
        ),
    ):
        return DispatchError(f"{provider}: the request cannot be made: {err}", kind=PERMANENT)
    # A read timeout, an answer cut off: the provider may have taken the request.
    return DispatchError(f"{provider}: no complete answer ({type(err).__name__})", kind=AMBIGUOUS)
