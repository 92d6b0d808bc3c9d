"""Provider rate limits: two worker processes sending through one provider's shared rate; and
what the one-click unsubscribe link adds to rendering a marketing email.

python -m bench providers [-- --rate 500 --seconds 10 --batch 200 --emails 50000]

Each process sends batches of `--batch` through `worker.throttle.paced` with the provider's
token bucket in Redis (database 14), as a worker's chunk run does, for `--seconds`; the sends'
times are gathered and the rate they kept is compared with the one set: over the whole run, and
in the busiest second (a provider counting per second sees that one).

The same email template is then rendered for `--emails` recipients as marketing (with its
signed `List-Unsubscribe` link) and as a receipt (without), alternated, and the difference per
email printed: the link's whole cost, since nothing else differs.
"""

import argparse
import multiprocessing
import time
from typing import Any

import redis

from bench.gate import alternated
from limits.reasons import Category
from worker.delivery.base import Recipient
from worker.delivery.rendering import Renderer
from worker.delivery.throttle import Throttle, bucket_key, paced, parse_rates

PROVIDER = "bench"


def _send_for(url: str, rate: float, seconds: float, batch: int, start_at: float, out: Any) -> None:
    client = redis.Redis.from_url(url)
    throttle = Throttle(PROVIDER, parse_rates(f"{PROVIDER}={rate}")[PROVIDER], client=client)
    times: list[float] = []

    def send(part: Any) -> list[None]:
        times.extend([time.time()] * len(part))
        return [None] * len(part)

    time.sleep(max(0.0, start_at - time.time()))  # both begin together
    while time.time() < start_at + seconds:
        paced(throttle, range(batch), send)
    out.put(times)


def busiest_second(times: list[float]) -> int:
    """The most sends in any one-second window."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench providers")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--emails", type=int, default=50_000)
    args = parser.parse_args(argv)
    _rate_kept(args)
    _unsubscribe_link_cost(args.emails)


def _unsubscribe_link_cost(emails: int) -> None:
    recipients = [
        Recipient(user_id=1_000_000 + n, address=f"u{n}@example.com", message_id=f"bench:{n}")
        for n in range(emails)
    ]

    def render_all(category: str) -> int:
        render = Renderer(channel="email", template="welcome", campaign="bench", category=category)
        for recipient in recipients:
            render(recipient)
        return emails

    # Five runs of each, alternated; a run is one pass over the recipients (it lasts far
    # longer than the 1 ms asked for).
    receipt, marketing, _ = alternated(
        lambda: render_all(Category.TRANSACTIONAL),
        lambda: render_all(Category.MARKETING),
        0.005,
        rounds=5,
    )
    per_marketing, per_receipt = 1e6 / marketing, 1e6 / receipt
    print(
        f"rendering an email ({emails:,} recipients, medians of 5 alternated runs): "
        f"{per_marketing:.1f} us as marketing with its one-click unsubscribe link, "
        f"{per_receipt:.1f} us as a receipt without"
    )
    print(f"  the link adds {per_marketing - per_receipt:.1f} us per marketing email")


def _rate_kept(args: argparse.Namespace) -> None:
    redis.Redis.from_url(args.redis_url).delete(bucket_key(PROVIDER))
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    start_at = time.time() + 1.0
    workers = [
        context.Process(
            target=_send_for,
            args=(args.redis_url, args.rate, args.seconds, args.batch, start_at, out),
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    gathered = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    times = sorted(t for each in gathered for t in each)
    spread = times[-1] - times[0]
    # The first second's burst is part of the run; the rate counts from the first send.
    overall = (len(times) - 1) / spread
    busiest = busiest_second(times)
    print(
        f"two worker processes, one provider at {args.rate:,.0f} sends/s, batches of "
        f"{args.batch} for {args.seconds:.0f} s: {len(times):,} sends "
        f"({', '.join(f'{len(each):,}' for each in gathered)})"
    )
    print(
        f"  kept {overall:,.1f} sends/s over the run: {overall / args.rate:.3f}x the rate   "
        f"(target within 5%)"
    )
    print(
        f"  busiest second: {busiest:,} sends: {busiest / args.rate:.3f}x the rate   "
        f"(target within 5%)"
    )
