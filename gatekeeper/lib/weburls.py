"""What a URL Gatekeeper posts to must be (webhook endpoints): the one rule, as a pattern the
API's schema states and the server applies alike."""

import re

_PORT = r"(?::(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?"
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
# http or https, a host (a name, an IPv4 address, or an IPv6 one in brackets), a port from 0
# to 65535, then a path, query or fragment of printable ASCII (non-ASCII percent-encoded).
HTTP_URL = rf"^https?://{_HOST}{_PORT}(?:[/?#][!-~]*)?$"
HTTP_URL_WORDS = (
    "an http or https URL: a host (a name, an IPv4 address, or an IPv6 address in brackets), "
    "a port of 0 to 65535 if any, then a path of printable ASCII (non-ASCII percent-encoded)"
)
URL_MAX = 2000
_URL = re.compile(HTTP_URL.removesuffix("$") + r"\Z")


def http_url_problem(value: str) -> str | None:
    """What is wrong with a URL to post to, if anything."""
    if len(value) > URL_MAX:
        return f"At most {URL_MAX} characters."
    if not _URL.match(value):
        return f"{value[:100]!r} is not {HTTP_URL_WORDS}."
    return None
