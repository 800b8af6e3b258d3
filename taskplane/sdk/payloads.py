"""The data converter every taskplane client and worker shares.

JSON through pydantic (so agents may take and return pydantic models, dataclasses,
datetimes...), plus a claim-check codec that keeps large payloads out of Temporal's
history: a payload above ``TASKPLANE_BLOB_THRESHOLD`` bytes (default 128 KiB) - the long
conversation of a coding agent, a big tool result - is written once, content-addressed,
to a blob directory and the history holds only its sha256. Temporal caps one payload
at 2 MB and a history at 50 MB; an agent's growing context would otherwise reach both.

The blob directory (``TASKPLANE_BLOB_DIR``, default ``<tmp>/taskplane-blobs``) must be
shared by the workers and clients of one deployment (a volume in Kubernetes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec

BLOB_ENCODING = b"taskplane/blob-sha256"
DEFAULT_THRESHOLD = 128 * 1024


def blob_dir() -> Path:
    return Path(os.environ.get("TASKPLANE_BLOB_DIR") or Path(tempfile.gettempdir()) / "taskplane-blobs")


class BlobCodec(PayloadCodec):
    """Claim check: big payloads go to a content-addressed file, the history keeps the hash."""

    def __init__(self, directory: Path | None = None, threshold: int | None = None) -> None:
        self.directory = directory or blob_dir()
        env = os.environ.get("TASKPLANE_BLOB_THRESHOLD")
        self.threshold = threshold if threshold is not None else int(env) if env else DEFAULT_THRESHOLD

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._encode_one(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decode_one(p) for p in payloads]

    def _encode_one(self, payload: Payload) -> Payload:
        if payload.ByteSize() <= self.threshold:
            return payload
        raw = payload.SerializeToString()
        digest = hashlib.sha256(raw).hexdigest()
        path = self.directory / digest[:2] / digest
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(raw)
            os.replace(tmp, path)
        return Payload(
            metadata={"encoding": BLOB_ENCODING, "size": str(len(raw)).encode()},
            data=digest.encode(),
        )

    def _decode_one(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != BLOB_ENCODING:
            return payload
        digest = payload.data.decode()
        path = self.directory / digest[:2] / digest
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise RuntimeError(
                f"large payload {digest[:12]}… is not in the blob directory {self.directory}; "
                "point TASKPLANE_BLOB_DIR of this process at the directory the workers use"
            ) from None
        out = Payload()
        out.ParseFromString(raw)
        return out


@lru_cache(maxsize=1)
def data_converter() -> DataConverter:
    """Pydantic JSON plus the claim-check codec (one instance per process)."""
    return dataclasses.replace(pydantic_data_converter, payload_codec=BlobCodec())
