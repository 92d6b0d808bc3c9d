"""Where the logs could live: the same users' logs, byte for byte, in other containers.

python -m bench limiter -- --mix --designs

After the mix (bench/mix.py) the gate's Redis holds every user's log in a bucket hash of 256
users (limits/engine/log.py). Each design below stores those very logs in a Redis server of its
own and is measured there, so that only the container differs:

- `hash-256`: today's bucket hashes, copied as they are (checks the copy against the gate's own
  figure);
- `listpack-N`: hashes of N users (and their `expiry`), which Redis keeps as a listpack while
  every value is at most `hash-max-listpack-value` (64 bytes by default; measured with that and
  with 4096) and it has at most `hash-max-listpack-entries` fields (set to 1024 here: 128 by
  default), and as a hash table after; `listpack-256` is today's buckets kept as listpacks;
- `pack-N`: one string per N users: a header (format 1 byte, the TTL's end 6 bytes, flags 1 byte,
  users 1 byte), the users' fields (1 byte each), their logs' lengths (3 bytes each), then the logs
  back to back.

Printed per design: Redis bytes per user (INFO used_memory, the difference from the empty server)
and the CPU of its container alone: random batches of 1,000 users, each user's log read and one
21-byte entry appended, by a function doing only that (INFO commandstats, usec per user). A
design's whole decision is about the gate's CPU per decision plus its container's difference from
`hash-256`'s.
"""

import random
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from bench.limiter import used_memory
from bench.mix import function_usec
from bench.servers import RedisServer
from limits.engine import log

TTL_MS = 8 * 86_400_000
ENTRY = b"\x01" * 21
BATCHES = 200
DEFAULT_VALUE = 64  # Redis's hash-max-listpack-value
# (design, the server's hash-max-listpack-value while it is measured)
DESIGNS = (
    ("hash-256", DEFAULT_VALUE),
    ("listpack-32", DEFAULT_VALUE),
    ("listpack-16", 4096),
    ("listpack-32", 4096),
    ("listpack-64", 4096),
    ("listpack-256", 4096),
    ("pack-16", DEFAULT_VALUE),
    ("pack-32", DEFAULT_VALUE),
)

PROTOTYPE = """#!lua name=gk_designs
local function hash_append(keys, args)
  for i = 1, #keys do
    local field = args[i]
    local got = redis.call('HMGET', keys[i], field, 'expiry')
    redis.call('HSET', keys[i], field, (got[1] or '') .. args[#args])
  end
  return #keys
end

-- A pack: format, TTL end (6), flags, n, then n fields, n lengths (3 bytes), the logs.
local function pack_append(keys, args)
  local entry = args[#args]
  for i = 1, #keys do
    local raw = redis.call('GET', keys[i]) or '\\1\\0\\0\\0\\0\\0\\0\\0\\0'
    local n = string.byte(raw, 9)
    local at = string.find(raw, args[i], 10, true)
    local logs = 10 + 4 * n
    if at and at < 10 + n then
      local k = at - 9
      local start = logs
      for j = 1, k - 1 do
        start = start + struct.unpack('>I3', raw, 10 + n + 3 * (j - 1))
      end
      local length = struct.unpack('>I3', raw, 10 + n + 3 * (k - 1))
      local lengths = 10 + n + 3 * (k - 1)
      raw = string.sub(raw, 1, lengths - 1) .. struct.pack('>I3', length + #entry)
        .. string.sub(raw, lengths + 3, start + length - 1) .. entry
        .. string.sub(raw, start + length)
    else
      raw = string.sub(raw, 1, 8) .. string.char(n + 1) .. string.sub(raw, 10, 9 + n)
        .. args[i] .. string.sub(raw, 10 + n, logs - 1) .. struct.pack('>I3', #entry)
        .. string.sub(raw, logs) .. entry
    end
    redis.call('SET', keys[i], raw, 'KEEPTTL')
  end
  return #keys
end

redis.register_function('hash_append', hash_append)
redis.register_function('pack_append', pack_append)
"""


def gate_logs(client: redis.Redis, prefix: str) -> Iterator[tuple[int, bytes]]:
    """Every user's counted log in the gate's Redis: (user id, its bytes)."""
    for key in client.scan_iter(match=f"{prefix}{{b:*", count=1000):
        bucket = log.bucket_of(key)
        for field, raw in client.hgetall(key).items():
            if isinstance(field, bytes) and isinstance(raw, bytes) and len(field) == 1:
                yield (bucket << log.BUCKET_BITS) | field[0], raw


def pack_key(user: int, size: int) -> str:
    return f"p:{{b:{user >> 8}}}{(user & 0xFF) // size}"


def packed(logs: list[tuple[int, bytes]]) -> bytes:
    header = struct.pack(">B6sBB", 1, (2**40).to_bytes(6, "big"), 0, len(logs))
    fields = bytes(user & 0xFF for user, _ in logs)
    lengths = b"".join(len(raw).to_bytes(3, "big") for _, raw in logs)
    return header + fields + lengths + b"".join(raw for _, raw in logs)


class Batched:
    """Commands sent in pipelines of 10,000."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.pipe = client.pipeline(transaction=False)

    def __getattr__(self, name: str) -> Any:
        def queued(*args: Any, **kwargs: Any) -> None:
            getattr(self.pipe, name)(*args, **kwargs)
            if len(self.pipe) >= 10_000:
                self.flush()

        return queued

    def flush(self) -> None:
        self.pipe.execute()


def store(client: redis.Redis, design: str, logs: list[tuple[int, bytes]]) -> None:
    pipe = Batched(client)
    if design == "hash-256":
        for user, raw in logs:
            pipe.hset(log.bucket_key("h:", user), log.bucket_field(user), raw)
        for bucket in {user >> 8 for user, _ in logs}:
            key = log.bucket_key("h:", bucket << 8)
            pipe.hset(key, log.EXPIRY_FIELD, str(2**40).encode() + b" " * 64)
            pipe.pexpire(key, TTL_MS)
    elif design.startswith("listpack-"):
        size = int(design.partition("-")[2])
        key_of = (
            (lambda user: log.bucket_key("h:", user))
            if size == 256
            else (lambda user: pack_key(user, size))
        )
        for user, raw in logs:
            pipe.hset(key_of(user), log.bucket_field(user), raw)
        for key in {key_of(user) for user, _ in logs}:
            pipe.hset(key, log.EXPIRY_FIELD, str(2**40).encode())
            pipe.pexpire(key, TTL_MS)
    else:
        size = int(design.partition("-")[2])
        groups: dict[str, list[tuple[int, bytes]]] = {}
        for user, raw in logs:
            groups.setdefault(pack_key(user, size), []).append((user, raw))
        for key, members in groups.items():
            pipe.set(key, packed(members), px=TTL_MS)
    pipe.flush()


def container_usec(client: redis.Redis, design: str, users: int) -> float:
    """Usec per user of reading a log and appending one entry, random batches of 1,000."""
    rng = random.Random(8)
    function = "pack_append" if design.startswith("pack-") else "hash_append"
    size = 256 if design == "hash-256" else int(design.partition("-")[2])
    usec0 = function_usec(client)
    for _ in range(BATCHES):
        chosen = rng.sample(range(1, users + 1), 1_000)
        if size == 256:  # today's buckets, as hash tables (hash-256) or listpacks
            keys = [log.bucket_key("h:", u) for u in chosen]
        else:
            keys = [pack_key(u, size) for u in chosen]
        fields = [log.bucket_field(u) for u in chosen]
        client.fcall(function, len(keys), *keys, *fields, ENTRY)
    return (function_usec(client) - usec0) / (BATCHES * 1_000)


def run(gate: redis.Redis, prefix: str, users: int) -> None:
    logs = sorted(gate_logs(gate, prefix))
    print(f"Containers for the same {len(logs):,} logs (bench/designs.py):")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        client = redis.Redis.from_url(server.url)
        try:
            baseline = None
            for design, value in DESIGNS:
                client.flushall()
                client.config_set("hash-max-listpack-value", value)
                client.config_set("hash-max-listpack-entries", 1024)
                client.function_load(PROTOTYPE, replace=True)
                client.config_resetstat()
                memory0 = used_memory(client)
                store(client, design, logs)
                per_user = (used_memory(client) - memory0) / users
                usec = container_usec(client, design, users)
                baseline = usec if baseline is None else baseline
                config = "" if value == DEFAULT_VALUE else f" (hash-max-listpack-value {value})"
                print(
                    f"  {design}{config}: {per_user:.1f} bytes per user; its container "
                    f"{usec:.2f} us per user ({usec - baseline:+.2f} us against hash-256)"
                )
        finally:
            server.stop()
