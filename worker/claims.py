"""Send claims: what keeps "delivered at least once" (Celery) from becoming "sent twice".

Right before a send goes to its provider, the run claims `<prefix>sent:{<channel>:<message id>}`
in Redis with SET NX: `sending:<job>:<run>`. A message id names one send per channel, as in the
limiter (the campaign "spring" may send `spring:42` by email and by push). Right after the provider answers, the claim becomes
`sent:<job>` (it went out) or is deleted (it did not, and may be tried again), in the same
round trip as the next batch's claims. A run that finds
a claim already there knows, without asking anyone:

- `sent:<this job>`: an earlier run of this chunk sent it and died before counting it: count it
  as sent now, do not send it again;
- `sent:<another job>` or `sending:<another job>:...`: another job sent (or is sending) this
  message id: a duplicate, not sent, and nothing to warn about;
- `sending:<job>:<another run>`: a run died (or lost its lease) during this very send, which may
  or may not have reached the provider: ambiguous, unless the provider deduplicates by the
  message id, in which case the send is taken over and made again with the same key.

Claims from before job and run ids were written (`sending`, `sent`) read as a dead run's and as
this job's. Claims live CLAIM_TTL, longer than the weekly window the limiter remembers a message
id for. The hash tag puts each claim in its message id's slot, so claims work on a cluster.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

from django.conf import settings

from gatekeeper.lib.redis_client import get_redis, pipelined

CLAIM_TTL = 8 * 86400
SENDING, SENT = "sending", "sent"


@dataclass(frozen=True, slots=True)
class Claim:
    state: str  # SENDING or SENT
    job: int | None  # None: written before claims named their job
    run: str | None  # the run that is sending; None for SENT and for old claims


def claim_key(channel: str, message_id: str) -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}sent:{{{channel}:{message_id}}}"


def _parse(reply: Any) -> Claim | None:
    if reply is None:
        return None
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    state, _, rest = text.partition(":")
    job_text, _, run = rest.partition(":")
    job = int(job_text) if job_text.isascii() and job_text.isdigit() else None
    return Claim(state=state, job=job, run=run or None)


def claims_read(channel: str, message_ids: Sequence[str]) -> list[Claim | None]:
    """The claims of `message_ids`, in one round trip (raises redis errors)."""
    return [_parse(reply) for reply in _run([("GET", claim_key(channel, m)) for m in message_ids])]


def _run(commands: list[tuple[Any, ...]]) -> list[Any]:
    """Replies to `commands` (GET, SET with GET, SET, DEL), in one round trip per node, packed
    by hand (gatekeeper.lib.redis_client.pipelined)."""
    return pipelined(get_redis(), commands)


class RunClaims:
    """The claims one run of a chunk takes and settles; each method is one round trip."""

    def __init__(self, *, channel: str, job_id: int, run: str) -> None:
        self.channel, self.job_id, self.run = channel, job_id, run
        self.sending = f"{SENDING}:{job_id}:{run}"

    def take(self, message_ids: Sequence[str]) -> list[Claim | None]:
        """Claim each id for sending; per id None (claimed now) or the claim found there.

        A claim of this very run is found only when the commands were sent again after a
        connection broke (the first sending took it): it is this run's, claimed now."""
        return self._found(_run(self._taking(message_ids)))

    def _taking(self, message_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        return [
            ("SET", claim_key(self.channel, m), self.sending, "NX", "EX", CLAIM_TTL, "GET")
            for m in message_ids
        ]

    def _found(self, replies: list[Any]) -> list[Claim | None]:
        mine = self.sending.encode()
        return [None if reply == mine else _parse(reply) for reply in replies]

    def take_over(self, message_ids: Sequence[str]) -> None:
        """Claim ids a dead run left `sending`, to send them again with the same key (only for
        providers that deduplicate by it)."""
        self._write([(message_id, self.sending) for message_id in message_ids], [])

    @overload
    def settle(self, *, sent: Sequence[str], unsent: Sequence[str]) -> None: ...

    @overload
    def settle(
        self, *, sent: Sequence[str], unsent: Sequence[str], take: Sequence[str]
    ) -> list[Claim | None]: ...

    def settle(
        self, *, sent: Sequence[str], unsent: Sequence[str], take: Sequence[str] | None = None
    ) -> list[Claim | None] | None:
        """Mark `sent` as gone out (by this job) and drop the claims of `unsent`; with `take`,
        claim those in the same round trip, after (as `take` answers)."""
        commands = self._writing([(m, f"{SENT}:{self.job_id}") for m in sent], unsent)
        if take is None:
            _run(commands)
            return None
        replies = _run(commands + self._taking(take))
        return self._found(replies[len(commands) :])

    def _write(self, values: list[tuple[str, str]], deleted: Sequence[str]) -> None:
        _run(self._writing(values, deleted))

    def _writing(
        self, values: list[tuple[str, str]], deleted: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = [
            ("SET", claim_key(self.channel, m), value, "EX", CLAIM_TTL) for m, value in values
        ]
        commands.extend(("DEL", claim_key(self.channel, m)) for m in deleted)
        return commands
