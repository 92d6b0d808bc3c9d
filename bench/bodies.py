"""Decoding the gate's request bodies (msgspec structs and the id checks), in one process.

python -m bench bodies
"""

import json
import time

from gatekeeper.lib.bodies import decode
from worker.api import gate_requests
from worker.bodies import GateCheckBody


def main(argv: list[str]) -> None:
    for size in (1_000, 10_000):
        body = json.dumps(
            {
                "channel": "email",
                "requests": [{"user_id": i * 7, "message_id": f"c1-{i}-x"} for i in range(size)],
            }
        ).encode()
        rounds = max(20, 200_000 // size)
        started = time.perf_counter()
        for _ in range(rounds):
            gate_requests(decode(body, GateCheckBody).requests)
        each = (time.perf_counter() - started) / rounds
        plain = time.perf_counter()
        for _ in range(rounds):
            json.loads(body)
        loads = (time.perf_counter() - plain) / rounds
        print(
            f"gate body of {size:,} requests ({len(body):,} bytes): decoded and checked in "
            f"{each * 1e3:.2f} ms; json.loads alone {loads * 1e3:.2f} ms ({each / loads:.2f}x)"
        )
