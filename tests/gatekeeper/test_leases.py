"""The kit of leases (gatekeeper/lib/leases.py): a row's lease on the real database and a
Redis key's on the real Redis (one node, then a cluster). Taken by one holder at a time,
renewed and given back by that holder only; a holder whose lease ran out changes nothing of the
next holder's. Leases run out by the `now` given to a row's, and by PEXPIRE on Redis."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.db.models import F, Q
from redis.cluster import RedisCluster

from gatekeeper.lib.leases import RedisLease, RowLease, writers_locked
from limits.models.people import SuppressionLock
from limits.models.privacy import Erasure

NOW = datetime(2027, 3, 1, 12, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture
def row() -> Erasure:
    return Erasure.objects.create(via="command", count=3)


def lease_of(row: Erasure, *, field: str = "lease_until") -> RowLease:
    return RowLease(Erasure.objects.filter(pk=row.pk), MINUTE, field=field)


def held_until(row: Erasure, field: str = "lease_until") -> Any:
    return Erasure.objects.values_list(field, flat=True).get(pk=row.pk)


@pytest.mark.django_db
def test_a_row_is_taken_by_one_holder_renewed_and_given_back(row) -> None:
    first, second = lease_of(row), lease_of(row)
    assert first.take(NOW)
    assert held_until(row) == first.until == NOW + MINUTE
    assert not second.take(NOW) and second.until is None
    assert not second.take(NOW + MINUTE - timedelta(microseconds=1))  # still live
    assert first.renew(NOW + MINUTE / 2)
    assert held_until(row) == first.until == NOW + MINUTE * 3 / 2
    assert not second.take(NOW + MINUTE)  # renewed: live past its first end
    assert first.give_back()
    assert held_until(row) is None and first.until is None
    assert second.take(NOW + MINUTE)  # free at once, not when the lease would have run out
    assert held_until(row) == NOW + MINUTE * 2


@pytest.mark.django_db
def test_a_row_holder_whose_lease_ran_out_cannot_renew_or_give_back_the_next_ones(row) -> None:
    late, next_ = lease_of(row), lease_of(row)
    assert late.take(NOW)
    assert next_.take(NOW + MINUTE + timedelta(seconds=1))  # the first ran out: taken over
    assert not late.renew(NOW + MINUTE + timedelta(seconds=2))
    assert held_until(row) == next_.until == NOW + MINUTE * 2 + timedelta(seconds=1)
    assert not late.give_back()
    assert held_until(row) == next_.until  # the next holder's lease stands
    assert next_.renew(NOW + MINUTE * 2) and held_until(row) == NOW + MINUTE * 3
    assert next_.give_back() and held_until(row) is None


@pytest.mark.django_db
def test_a_row_lease_writes_other_fields_with_it_and_keeps_to_its_condition(row) -> None:
    lease = lease_of(row)
    running = Q(status=Erasure.Status.RUNNING)
    assert not lease.take(NOW, where=running)  # queued: not taken, nothing written
    assert held_until(row) is None
    assert lease.take(NOW, where=~running, status=Erasure.Status.RUNNING, count=F("count") + 1)
    row.refresh_from_db()
    assert (row.status, row.count, row.lease_until) == ("running", 4, NOW + MINUTE)
    assert lease.renew(NOW, where=running, passes=1)
    assert not lease.renew(NOW, where=~running, passes=2)  # held, but not as `where` says
    assert not lease.give_back(where=~running)  # nor given back
    row.refresh_from_db()
    assert (row.passes, row.lease_until) == (1, NOW + MINUTE)
    assert lease.give_back(status=Erasure.Status.DONE)
    row.refresh_from_db()
    assert (row.status, row.lease_until) == ("done", None)


@pytest.mark.django_db
def test_a_row_lease_in_a_field_of_another_name(row) -> None:
    first, second = lease_of(row, field="next_at"), lease_of(row, field="next_at")
    assert first.take(NOW) and not second.take(NOW)
    assert held_until(row, "next_at") == NOW + MINUTE and held_until(row) is None
    assert second.take(NOW + MINUTE * 2) and not first.renew(NOW + MINUTE * 2)


@pytest.mark.django_db
def test_a_row_lease_refuses_what_makes_no_sense(row) -> None:
    with pytest.raises(ValueError, match="more than 0"):
        RowLease(Erasure.objects.filter(pk=row.pk), timedelta(0))
    lease = lease_of(row)
    with pytest.raises(RuntimeError, match="not held"):
        lease.renew(NOW)  # never taken
    assert lease.take(NOW) and lease.give_back()
    with pytest.raises(RuntimeError, match="not held"):
        lease.give_back()  # given back already


# --- Redis ------------------------------------------------------------------------------------

KEY = "leasetest:{one}"


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def client(request: pytest.FixtureRequest, redis_client: redis.Redis) -> Iterator[Any]:
    """One Redis node, then a Redis Cluster."""
    if request.param == "single":
        yield redis_client
        return
    cluster: RedisCluster = request.getfixturevalue("cluster_client")
    cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield cluster


def test_a_key_is_taken_by_one_holder_renewed_and_released(client) -> None:
    first = RedisLease(KEY, 60, client=client)
    second = RedisLease(KEY, 60, client=client)
    assert first.token != second.token  # random, each holder its own
    assert first.take() and not second.take()
    assert client.get(KEY) == first.token.encode()
    assert 59_000 < client.pttl(KEY) <= 60_000
    client.pexpire(KEY, 5_000)  # most of it gone by
    assert first.renew() and 59_000 < client.pttl(KEY) <= 60_000  # its full length again
    assert not second.renew() and not second.release()  # not the holder: nothing changes
    assert client.get(KEY) == first.token.encode()
    assert first.release() and client.get(KEY) is None
    assert not first.renew()  # released: nothing to renew, and nothing taken
    assert client.get(KEY) is None
    assert second.take() and client.get(KEY) == second.token.encode()


def test_a_key_holder_whose_lease_ran_out_cannot_renew_or_release_the_next_ones(client) -> None:
    late = RedisLease(KEY, 60, client=client)
    next_ = RedisLease(KEY, 60, client=client)
    assert late.take()
    client.pexpire(KEY, 0)  # the lease ran out (0 ms: the key is gone now)
    assert next_.take()
    assert not late.renew()
    assert not late.release()
    assert client.get(KEY) == next_.token.encode()  # the next holder's lease stands
    assert 59_000 < client.pttl(KEY) <= 60_000  # untouched, not renewed by the late one
    assert next_.release() and client.get(KEY) is None


def test_hold_takes_a_free_key_and_renews_the_holders_only(client) -> None:
    leader = RedisLease(KEY, 15, client=client, token="host:1:a")
    other = RedisLease(KEY, 15, client=client, token="host:2:b")
    assert leader.hold() and not other.hold()
    client.pexpire(KEY, 1_000)
    assert leader.hold() and 14_000 < client.pttl(KEY) <= 15_000
    client.pexpire(KEY, 0)  # the leader stalled past its lease
    assert other.hold() and not leader.hold()
    assert client.get(KEY) == b"host:2:b"


def test_leases_of_keys_on_every_node_of_a_cluster(client) -> None:
    keys = [f"leasetest:{n}" for n in range(12)]  # slots all over a cluster
    held = [RedisLease(key, 30, client=client) for key in keys]
    assert all(lease.take() for lease in held)
    assert not any(RedisLease(key, 30, client=client).take() for key in keys)
    assert all(lease.renew() for lease in held) and all(lease.release() for lease in held)
    assert not any(client.exists(key) for key in keys)


def test_a_taker_that_waits_gives_up_when_the_holder_keeps_it(redis_client) -> None:
    holder = RedisLease(KEY, 60, client=redis_client)
    assert holder.take()
    assert not RedisLease(KEY, 60, client=redis_client).take(wait=0.25)
    assert redis_client.get(KEY) == holder.token.encode()


def test_a_redis_lease_refuses_what_makes_no_sense(redis_client) -> None:
    with pytest.raises(ValueError, match="more than 0"):
        RedisLease(KEY, 0, client=redis_client)
    with pytest.raises(redis.ResponseError, match="unknown operation"):
        RedisLease(KEY, 60, client=redis_client)._call("steal")


@pytest.mark.django_db(transaction=True)
def test_a_writers_lock_is_made_the_first_time_and_taken_in_the_callers_transaction() -> None:
    from django.db import transaction

    SuppressionLock.objects.all().delete()
    with transaction.atomic():
        writers_locked(SuppressionLock)
        assert SuppressionLock.objects.filter(pk=1).exists()  # made, and held until the commit
    with transaction.atomic():
        writers_locked(SuppressionLock)  # taken again, not made twice
    assert list(SuppressionLock.objects.values_list("pk", flat=True)) == [1]
