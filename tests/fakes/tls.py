"""A test certificate authority and a certificate for 127.0.0.1 and localhost, for the fakes.

Clients trust the CA through a setting the backend hands to its library (a CA bundle file),
never through the machine's trust store or a process-wide variable."""

import ssl
from pathlib import Path

import trustme


class LocalTLS:
    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        self.certificate = self.ca.issue_cert("127.0.0.1", "localhost")
        self.ca_bundle = directory / "test-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_bundle))

    def server_context(self, *, alpn: list[str] | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.certificate.configure_cert(context)
        if alpn:
            context.set_alpn_protocols(alpn)
        return context
