"""A DNS server on loopback for the tests (dnslib), serving a zone the test writes, over UDP and
TCP on one port; and a server that never answers. The project's settings are pointed at it, so
the real dnspython asks it as it would ask any name server; nothing asks the internet.

Like a server without EDNS, it answers over UDP in 512 bytes at most: a longer answer comes
truncated, and the resolver asks again over TCP (a 4096-bit DKIM key's record is longer).
"""

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pytest
from dnslib import CNAME, MX, QTYPE, RCODE, RR, TXT, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

UDP_MAX = 512  # bytes of a UDP answer; longer ones are truncated (the resolver asks over TCP)


class Zone(BaseResolver):
    """Records by (name, type); a name with records of other types only answers NOERROR with
    none, a name without any NXDOMAIN; CNAMEs are followed within the zone. `servfail` names
    answer SERVFAIL. `asked` counts the questions by protocol ("udp", "tcp")."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[RR]] = {}
        self.servfail: set[str] = set()
        self.asked = {"udp": 0, "tcp": 0}
        self.lock = threading.Lock()

    def _add(self, name: str, rtype: str, rdata: object) -> None:
        name = name.lower().rstrip(".")
        self.records.setdefault((name, rtype), []).append(
            RR(name + ".", getattr(QTYPE, rtype), rdata=rdata, ttl=60)
        )

    def txt(self, name: str, *texts: str) -> None:
        """One TXT record at `name` per text, each cut into strings of 255 bytes as DNS holds
        them (a reader joins them again)."""
        for text in texts:
            data = text.encode()
            self._add(name, "TXT", TXT([data[i : i + 255] for i in range(0, len(data), 255)]))

    def mx(self, name: str, preference: int, host: str) -> None:
        self._add(name, "MX", MX(host, preference))

    def cname(self, name: str, target: str) -> None:
        self._add(name, "CNAME", CNAME(target))

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        with self.lock:
            self.asked[handler.protocol] += 1
        reply = request.reply()
        name = str(request.q.qname).lower().rstrip(".")
        rtype = QTYPE[request.q.qtype]
        if name in self.servfail:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        for _ in range(8):  # a chain of CNAMEs, within the zone
            aliases = self.records.get((name, "CNAME"), [])
            if not aliases or rtype == "CNAME":
                break
            reply.add_answer(*aliases)
            name = str(aliases[0].rdata.label).lower().rstrip(".")
        answers = self.records.get((name, rtype), [])
        for record in answers:
            reply.add_answer(record)
        if not answers and not reply.rr and not any(n == name for n, _ in self.records):
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


class ShortUdpHandler(DNSHandler):
    def get_reply(self, data: bytes) -> bytes:
        """An answer longer than UDP_MAX over UDP comes truncated: the flag (TC) and the
        question, no records (dnslib's own truncation drops the question too, which a resolver
        refuses as not an answer to its question)."""
        packed: bytes = super().get_reply(data)
        if self.protocol != "udp" or len(packed) <= UDP_MAX:
            return packed
        truncated = DNSRecord.parse(data).reply()
        truncated.header.tc = 1
        return bytes(truncated.pack())


@dataclass
class DnsServer:
    zone: Zone
    port: int

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"


def _started(zone: Zone) -> tuple[DNSServer, DNSServer, int]:
    """UDP and TCP servers on one free port (another process may take the UDP server's port
    for TCP in between: then another port)."""
    quiet = DNSLogger(logf=lambda *_: None)
    for _ in range(20):
        udp = DNSServer(zone, address="127.0.0.1", port=0, logger=quiet, handler=ShortUdpHandler)
        port = udp.server.server_address[1]
        try:
            tcp = DNSServer(zone, address="127.0.0.1", port=port, tcp=True, logger=quiet)
        except OSError:
            udp.server.server_close()
            continue
        for server in (udp, tcp):
            # Stopping waits for the loop's next look at its flag: every 50 ms, not 0.5 s.
            loop = partial(server.server.serve_forever, poll_interval=0.05)
            threading.Thread(target=loop, daemon=True).start()
        return udp, tcp, port
    raise RuntimeError("no port free for both UDP and TCP on 127.0.0.1")


@pytest.fixture
def dns_server(settings) -> Iterator[DnsServer]:
    """A DNS server serving `dns_server.zone`, which the test fills; the settings name it as
    the only name server, with a timeout of 2 s."""
    zone = Zone()
    udp, tcp, port = _started(zone)
    settings.GATEKEEPER_DNS_NAMESERVERS = f"127.0.0.1:{port}"
    settings.GATEKEEPER_DNS_TIMEOUT_SECONDS = 2.0
    yield DnsServer(zone, port)
    for server in (udp, tcp):
        server.server.shutdown()
        server.server.server_close()


@pytest.fixture
def silent_dns(settings) -> Iterator[str]:
    """A name server that reads every question and answers none, named in the settings with a
    timeout of half a second."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)  # how soon the reader sees it should stop
    stop = threading.Event()

    def read_and_drop() -> None:
        while not stop.is_set():
            try:
                sock.recvfrom(4096)
            except OSError:  # nothing within the timeout
                continue

    reader = threading.Thread(target=read_and_drop, daemon=True)
    reader.start()
    nameserver = f"127.0.0.1:{sock.getsockname()[1]}"
    settings.GATEKEEPER_DNS_NAMESERVERS = nameserver
    settings.GATEKEEPER_DNS_TIMEOUT_SECONDS = 0.5
    yield nameserver
    stop.set()
    reader.join()
    sock.close()
