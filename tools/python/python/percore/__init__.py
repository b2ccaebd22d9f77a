"""percore: Python client of percore's native protocol.

    import percore
    c = percore.Client("127.0.0.1:9100")          # or PERCORE_ENDPOINT
    c.create_bucket("data")
    c.put("data", "a", b"hello world")
    c.get("data", "a")                             # b"hello world"
    c.get_ranges("data", "a", [(0, 5), (6, 5)])    # [b"hello", b"world"]
    c.get_batch("data", ["a", "b"])                # one BatchGet per owner shard

Layers on top of `Client`:
- `percore.torch`: map-style and iterable PyTorch datasets, WebDataset tar
  shards, and `torch.distributed.checkpoint` storage.
- `percore.fs`: an fsspec filesystem (`percore://bucket/key`).
- `percore.s3batch`: percore's S3 batch GET, for hosts that only reach the
  S3 endpoint.

Every call releases the GIL while it waits on the network, and a client used
before a fork works in the child (it reconnects there).
"""

from ._native import (  # noqa: F401
    BucketExists,
    BucketNotEmpty,
    Busy,
    ChecksumError,
    ChecksumMismatch,
    Client,
    ConnectError,
    Corrupt,
    Entry,
    Internal,
    InvalidBucketName,
    InvalidKey,
    InvalidRange,
    InvalidRequest,
    NoSpace,
    NoSuchBucket,
    NoSuchKey,
    PercoreError,
    PreconditionFailed,
    ProtocolError,
    ServerError,
    ShuttingDown,
    Stat,
    Timeout,
    TooLarge,
    Unauthenticated,
    WrongNode,
)

__all__ = [
    "Client",
    "Stat",
    "Entry",
    "PercoreError",
    "ServerError",
    "ConnectError",
    "Timeout",
    "ChecksumError",
    "ProtocolError",
    "NoSuchKey",
    "NoSuchBucket",
    "BucketExists",
    "BucketNotEmpty",
    "InvalidRange",
    "InvalidRequest",
    "Unauthenticated",
    "ChecksumMismatch",
    "TooLarge",
    "Busy",
    "NoSpace",
    "Corrupt",
    "Internal",
    "ShuttingDown",
    "PreconditionFailed",
    "InvalidKey",
    "InvalidBucketName",
    "WrongNode",
]
