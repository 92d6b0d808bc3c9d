"""The snapshot store: the one module that talks to S3 or the local directory.

Layout (DESIGN.md), under the store's prefix:

    snapshots/<version>/<segment-slug>.roaring
    snapshots/<version>/manifest.json
    CURRENT                                    the live version; written last

Both stores offer the same small interface, and one test suite runs against both (the S3 one
against a real S3 API over HTTP).
"""

import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

CURRENT = "CURRENT"
MANIFEST = "manifest.json"


KEY_MAX = 1024  # S3's own limit on a key, in bytes


def key_problem(key: Any) -> str | None:
    """Why `key` cannot name an object of the store (a caller's key, such as a campaign file's),
    or None. Keys are relative to the store's root (under its prefix): no leading slash, no `.`
    or `..` parts, no backslash or control characters."""
    words = (
        f"A key in the store, relative to its root (such as campaigns/2026-11-25/blast.csv.gz), "
        f"of at most {KEY_MAX} bytes, without . or .. parts"
    )
    if not isinstance(key, str) or not key or len(key.encode("utf-8", "replace")) > KEY_MAX:
        return f"{words}."
    parts = key.split("/")
    if key.startswith("/") or any(part in ("", ".", "..") for part in parts):
        return f"{words}; '{key[:80]}' is not one."
    if "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        return f"{words}; '{key[:80]!r}' holds a backslash or a control character."
    return None


class StoreError(Exception):
    """The store could not be reached or refused the operation."""


class NotFound(StoreError):
    pass


def snapshot_key(version: str, name: str) -> str:
    """The one place that knows where a snapshot's objects live."""
    return f"snapshots/{version}/{name}"


def bitmap_name(slug: str) -> str:
    return f"{slug}.roaring"


class SnapshotStore(ABC):
    url: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; NotFound if there is none."""

    @abstractmethod
    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        """(bytes, etag) when the object differs from `etag`, None when it is unchanged."""

    @abstractmethod
    def open(self, key: str) -> tuple[Any, int]:
        """(a readable binary stream of the object, its size in bytes), for objects too large
        to hold in memory (a campaign's recipients file). Raises NotFound, StoreError."""

    @abstractmethod
    def list_versions(self) -> list[str]:
        """Every version directory, oldest first (complete or not)."""

    @abstractmethod
    def delete_version(self, version: str) -> None: ...


class LocalStore(SnapshotStore):
    """A directory with the same layout, for a laptop or a shared volume."""

    def __init__(self, directory: str | Path) -> None:
        self.root = Path(directory)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write beside it, then rename: a reader sees the old object or the new, never half.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"Could not write {path}: {exc}") from exc

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"{self._path(key)} does not exist") from exc
        except OSError as exc:
            raise StoreError(f"Could not read {self._path(key)}: {exc}") from exc

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        data = self.get(key)
        tag = hashlib.md5(data, usedforsecurity=False).hexdigest()
        return None if tag == etag else (data, tag)

    def open(self, key: str) -> tuple[Any, int]:
        path = self._path(key)
        try:
            handle = path.open("rb")
            return handle, os.fstat(handle.fileno()).st_size
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(f"{path} does not exist") from exc
        except OSError as exc:
            raise StoreError(f"Could not read {path}: {exc}") from exc

    def list_versions(self) -> list[str]:
        directory = self.root / "snapshots"
        try:
            if not directory.is_dir():
                return []
            return sorted(p.name for p in directory.iterdir() if p.is_dir())
        except OSError as exc:
            raise StoreError(f"Could not list {directory}: {exc}") from exc

    def delete_version(self, version: str) -> None:
        directory = self.root / "snapshots" / version
        for child in directory.glob("*"):
            child.unlink()
        directory.rmdir()


class S3Store(SnapshotStore):
    """Any S3 API (AWS, MinIO, a test server) through boto3."""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}"
        self.client = client if client is not None else s3_client()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, name: str, key: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, name)(Bucket=self.bucket, Key=self._key(key), **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{self.url}/{key} does not exist") from exc
            if code in ("304", "NotModified"):
                return None
            raise StoreError(f"S3 {name} of {self.url}/{key} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"S3 {name} of {self.url}/{key} failed: {exc}") from exc

    def put(self, key: str, data: bytes) -> None:
        self._call("put_object", key, Body=data)

    def get(self, key: str) -> bytes:
        return bytes(self._call("get_object", key)["Body"].read())

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str] | None:
        # A conditional GET: an unchanged object costs a 304 and no body.
        extra = {"IfNoneMatch": etag} if etag else {}
        response = self._call("get_object", key, **extra)
        if response is None:
            return None
        return bytes(response["Body"].read()), str(response["ETag"])

    def open(self, key: str) -> tuple[Any, int]:
        response = self._call("get_object", key)
        return _Streamed(response["Body"], f"{self.url}/{key}"), int(response["ContentLength"])

    def list_versions(self) -> list[str]:
        prefix = self._key("snapshots/")
        versions: set[str] = set()
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    versions.add(common["Prefix"][len(prefix) :].strip("/"))
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"Could not list {self.url}: {exc}") from exc
        return sorted(versions)

    def delete_version(self, version: str) -> None:
        prefix = self._key(snapshot_key(version, ""))
        response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        objects = [{"Key": item["Key"]} for item in response.get("Contents", [])]
        if objects:
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects})


class _Streamed:
    """An S3 object's body read in pieces; a broken connection is a StoreError, as any store
    failure is."""

    def __init__(self, body: Any, where: str) -> None:
        self.body, self.where = body, where

    def read(self, n: int = -1) -> bytes:
        try:
            return bytes(self.body.read(None if n is None or n < 0 else n))
        except (BotoCoreError, OSError) as exc:
            raise StoreError(f"Reading {self.where} failed: {exc}") from exc

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.body.close()


def s3_client() -> Any:
    return boto3.client(
        "s3",
        endpoint_url=settings.GATEKEEPER_S3_ENDPOINT_URL,
        region_name=settings.GATEKEEPER_S3_REGION,
        aws_access_key_id=settings.GATEKEEPER_S3_ACCESS_KEY_ID,
        aws_secret_access_key=settings.GATEKEEPER_S3_SECRET_ACCESS_KEY,
        # Short timeouts and few retries: a process starting while S3 is down falls back to its
        # cached snapshot quickly instead of hanging.
        config=Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 2}),
    )


def store_from_url(url: str) -> SnapshotStore:
    if url.startswith("s3://"):
        parsed = urlparse(url)
        return S3Store(parsed.netloc, parsed.path)
    return LocalStore(url)


def store_from_settings() -> SnapshotStore:
    return store_from_url(settings.GATEKEEPER_STORE_URL)
