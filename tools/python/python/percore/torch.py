"""PyTorch on percore: datasets, WebDataset tar shards and checkpoints.

- ``MapDataset``: map-style over a key list or a prefix. ``__getitems__``
  turns each DataLoader batch into one BatchGet per owner shard.
- ``ShardedSampler``: per-epoch seeded shuffle split exactly across
  distributed ranks (every index once per epoch; no padding, unlike
  ``DistributedSampler``).
- ``IterableDataset``: per-epoch seeded shuffle, split exactly across ranks
  and DataLoader workers, prefetching BatchGets on a background thread.
- ``WebDataset``: tar shards read by range: each shard's member table is
  read once (headers only), then samples (members grouped by basename) are
  fetched many ranges per request.
- ``CheckpointWriter`` / ``CheckpointReader``: ``torch.distributed.checkpoint``
  storage on percore; loading fetches every item of a file in one multi-range
  request, files in parallel.

Every dataset holds connection settings, not a connection: each DataLoader
worker (forked or spawned) opens its own client on first use.
"""

from __future__ import annotations

import io
import os
import queue
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset as _TorchIterable
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import Sampler, get_worker_info

from . import Client
from ._lazy import LazyClient as _ClientHolder

__all__ = [
    "MapDataset",
    "IterableDataset",
    "ShardedSampler",
    "WebDataset",
    "tar_members",
    "CheckpointWriter",
    "CheckpointReader",
]


def _resolve_keys(client: Client, bucket: str, keys, prefix) -> list[str]:
    if (keys is None) == (prefix is None):
        raise ValueError("give either keys or prefix")
    if keys is not None:
        return list(keys)
    return [e.key for e in client.list(bucket, prefix)]


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if not (0 <= rank < world_size):
        raise ValueError(f"rank {rank} is not in 0..{world_size}")
    return rank, world_size


def _identity(key: str, data: bytes) -> tuple[str, bytes]:
    return key, data


class MapDataset(_TorchDataset):
    """Samples by index: ``transform(key, bytes)`` (default ``(key, bytes)``).

    ``MapDataset(bucket, keys=None, prefix=None, *, client=None,
    endpoint=None, access_key=None, secret_key=None, transform=None)``;
    a prefix is listed once, here.
    """

    def __init__(self, bucket: str, keys: Sequence[str] | None = None,
                 prefix: str | None = None, *, client: Client | None = None,
                 endpoint=None, access_key=None, secret_key=None,
                 transform: Callable[[str, bytes], Any] | None = None):
        self.bucket = bucket
        self._holder = _ClientHolder(client, endpoint, access_key, secret_key)
        self.keys = _resolve_keys(self._holder.client, bucket, keys, prefix)
        self.transform = transform or _identity

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        key = self.keys[i]
        return self.transform(key, self._holder.client.get(self.bucket, key))

    def __getitems__(self, indices: Sequence[int]) -> list:
        """A DataLoader batch: one BatchGet per owner shard."""
        keys = [self.keys[i] for i in indices]
        blobs = self._holder.client.get_batch(self.bucket, keys)
        return [self.transform(k, b) for k, b in zip(keys, blobs)]


class ShardedSampler(Sampler[int]):
    """Indices ``0..n`` shuffled with ``seed + epoch`` (the same order on
    every rank), this rank taking every ``world_size``-th: each index once
    per epoch across all ranks. Call ``set_epoch`` before each epoch."""

    def __init__(self, n: int, *, rank: int | None = None, world_size: int | None = None,
                 shuffle: bool = True, seed: int = 0):
        self.n = n
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return iter(order[self.rank::self.world_size])

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world_size))


class IterableDataset(_TorchIterable):
    """Streams ``transform(key, bytes)`` over a key list or prefix.

    Each epoch's order is a shuffle seeded with ``seed + epoch`` (call
    ``set_epoch``), identical on every rank and worker; the order is split
    exactly across ``world_size`` ranks × DataLoader workers (every sample
    once per epoch). Samples are fetched ``batch`` keys per BatchGet, with up
    to ``prefetch`` BatchGets in flight ahead of the consumer.

    When the sample count is not a multiple of ``world_size``, ranks get
    one sample more or less; DDP then needs ``torch.distributed.algorithms.Join``,
    or ``drop_last=True`` (each epoch drops the last ``n % world_size``
    samples of its shuffle). ``set_epoch`` reaches the workers when they are
    started per epoch (``persistent_workers=False``, DataLoader's default).
    """

    def __init__(self, bucket: str, keys: Sequence[str] | None = None,
                 prefix: str | None = None, *, client: Client | None = None,
                 endpoint=None, access_key=None, secret_key=None,
                 shuffle: bool = True, seed: int = 0, batch: int = 64, prefetch: int = 4,
                 rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False,
                 transform: Callable[[str, bytes], Any] | None = None):
        if batch < 1 or prefetch < 1:
            raise ValueError("batch and prefetch must be at least 1")
        self.bucket = bucket
        self._holder = _ClientHolder(client, endpoint, access_key, secret_key)
        self.keys = _resolve_keys(self._holder.client, bucket, keys, prefix)
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.batch, self.prefetch = batch, prefetch
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.drop_last = drop_last
        self.transform = transform or _identity

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _my_keys(self) -> list[str]:
        order = list(self.keys)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        if self.drop_last:
            order = order[:len(order) - len(order) % self.world_size]
        # Ranks first (so a rank's share does not depend on its worker
        # count), then this rank's share across its DataLoader workers.
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        return order[self.rank::self.world_size][worker::workers]

    def __len__(self) -> int:
        # Samples this rank yields per epoch (all its workers together).
        n = len(self.keys)
        if self.drop_last:
            n -= n % self.world_size
        return len(range(self.rank, n, self.world_size))

    def __iter__(self):
        keys = self._my_keys()
        batches = [keys[i:i + self.batch] for i in range(0, len(keys), self.batch)]
        client = self._holder.client
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            """Queues `item` unless the consumer has gone; False if gone."""
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def fetch():
            try:
                for b in batches:
                    if not put((b, client.get_batch(self.bucket, b), None)):
                        return
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
                put((None, None, e))
                return
            put((None, None, None))

        t = threading.Thread(target=fetch, name="percore-prefetch", daemon=True)
        t.start()
        try:
            while True:
                b, blobs, err = q.get()
                if err is not None:
                    raise err
                if b is None:
                    return
                for k, data in zip(b, blobs):
                    yield self.transform(k, data)
        finally:
            # The consumer stopped (or finished): the fetcher sees `stop`
            # within 0.1 s and exits; drop what it queued.
            stop.set()
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break


# -- WebDataset tar shards --------------------------------------------------

_BLOCK = 512


def _octal(field: bytes) -> int:
    """A numeric header field: octal digits, or GNU base-256 (high bit set).
    Refuses signs and anything else a hostile tar might put there."""
    if field and field[0] & 0x80:
        if field[0] != 0x80:
            raise ValueError("negative base-256 number in a tar header")
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not digits:
        return 0
    if not all(0x30 <= b <= 0x37 for b in digits):
        raise ValueError(f"bad number {field!r} in a tar header")
    return int(digits, 8)


#: Largest pax or GNU long-name record read from a tar header.
_META_BYTES_MAX = 1 << 20


def tar_members(client: Client, bucket: str, key: str,
                window: int = 1 << 20) -> list[tuple[str, int, int]]:
    """``(name, data offset, size)`` of each regular file in a tar object,
    reading only headers: one ranged read per ``window`` bytes of small
    members, one per header past a large member. ustar, GNU long names and
    pax ``path`` records are understood."""
    size = client.stat(bucket, key).size
    out: list[tuple[str, int, int]] = []
    buf, buf_at = b"", 0
    pos = 0
    long_name: str | None = None
    pax_size: int | None = None
    while pos + _BLOCK <= size:
        if not (buf_at <= pos and pos + _BLOCK <= buf_at + len(buf)):
            buf_at = pos
            buf = client.get_ranges(bucket, key, [(pos, min(window, size - pos))])[0]
        h = buf[pos - buf_at:pos - buf_at + _BLOCK]
        if h == bytes(_BLOCK):
            break
        if sum(h[:148]) + 8 * 32 + sum(h[156:]) != _octal(h[148:156]):
            raise ValueError(f"{key}: bad tar header checksum at offset {pos}")
        msize = _octal(h[124:136])
        kind = h[156:157]
        if pax_size is not None and kind not in (b"L", b"x"):
            msize, pax_size = pax_size, None
        data_at = pos + _BLOCK
        end = data_at + (msize + _BLOCK - 1) // _BLOCK * _BLOCK
        if end > size:
            raise ValueError(f"{key}: member at {pos} runs past the end of the object")
        if kind in (b"L", b"x"):
            if not 0 < msize <= _META_BYTES_MAX:
                raise ValueError(f"{key}: a {msize}-byte tar metadata record at {pos}")
            meta = client.get_ranges(bucket, key, [(data_at, msize)])[0]
            if kind == b"L":
                long_name = meta.split(b"\0", 1)[0].decode()
            else:
                for name, value in _pax_records(meta, key):
                    if name == "path":
                        long_name = value
                    elif name == "size":
                        if not value.isdigit():
                            raise ValueError(f"{key}: bad pax size {value!r}")
                        pax_size = int(value)
        elif kind in (b"0", b"\0", b"7"):
            name = h[0:100].rstrip(b"\0").decode()
            prefix = h[345:500].rstrip(b"\0").decode() if h[257:262] == b"ustar" else ""
            if prefix:
                name = f"{prefix}/{name}"
            out.append((long_name or name, data_at, msize))
            long_name = None
        else:
            long_name = None  # directories, links: skipped
        pos = end
    return out


def _pax_records(data: bytes, key: str):
    """``"<len> <name>=<value>\\n"`` records; a malformed one is an error
    (never a loop: every record moves forward by at least 5 bytes)."""
    i = 0
    while i < len(data) and data[i] != 0:
        sp = data.find(b" ", i, i + 21)
        digits = data[i:sp] if sp > i else b""
        if not digits.isdigit():
            raise ValueError(f"{key}: malformed pax record at {i}")
        n = int(digits)
        if n < 5 or i + n > len(data) or data[i + n - 1] != 0x0A:
            raise ValueError(f"{key}: malformed pax record at {i}")
        k, eq, v = data[sp + 1:i + n - 1].partition(b"=")
        if not eq:
            raise ValueError(f"{key}: malformed pax record at {i}")
        yield k.decode("utf-8", "replace"), v.decode("utf-8", "replace")
        i += n


def _sample_key(name: str) -> tuple[str, str]:
    """WebDataset's grouping: ``dir/base.ext1.ext2`` -> (``dir/base``,
    ``ext1.ext2``)."""
    d, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{d}/{stem}" if d else stem), ext


class WebDataset(_TorchIterable):
    """Samples from WebDataset tar shards: dicts ``{"__key__": key,
    "__shard__": shard, ext: bytes, ...}`` (after ``transform``).

    Shards are split exactly across ranks and DataLoader workers; with
    ``shuffle`` the shard order and the sample order within each shard are
    shuffled with ``seed + epoch``. Samples are fetched ``batch`` per
    request (all their members' ranges in one Get).
    """

    def __init__(self, bucket: str, shards: Sequence[str] | None = None,
                 prefix: str | None = None, *, client: Client | None = None,
                 endpoint=None, access_key=None, secret_key=None,
                 shuffle: bool = False, seed: int = 0, batch: int = 32,
                 rank: int | None = None, world_size: int | None = None,
                 transform: Callable[[dict], Any] | None = None):
        self.bucket = bucket
        self._holder = _ClientHolder(client, endpoint, access_key, secret_key)
        self.shards = _resolve_keys(self._holder.client, bucket, shards, prefix)
        self.shuffle, self.seed, self.epoch, self.batch = shuffle, seed, 0, batch
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.transform = transform

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def samples_of(self, shard: str) -> list[tuple[str, list[tuple[str, int, int]]]]:
        """``(sample key, [(ext, offset, size), ...])`` in tar order."""
        groups: list[tuple[str, list]] = []
        for name, off, size in tar_members(self._holder.client, self.bucket, shard):
            key, ext = _sample_key(name)
            if groups and groups[-1][0] == key:
                groups[-1][1].append((ext, off, size))
            else:
                groups.append((key, [(ext, off, size)]))
        return groups

    def __iter__(self):
        rng = random.Random(self.seed + self.epoch)
        order = list(self.shards)
        if self.shuffle:
            rng.shuffle(order)
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        mine = order[self.rank::self.world_size][worker::workers]
        client = self._holder.client
        for shard in mine:
            samples = self.samples_of(shard)
            if self.shuffle:
                random.Random(f"{self.seed + self.epoch}/{shard}").shuffle(samples)
            for i in range(0, len(samples), self.batch):
                group = samples[i:i + self.batch]
                ranges = [(off, size) for _, members in group for _, off, size in members]
                nonempty = [r for r in ranges if r[1] > 0]
                blobs = iter(client.get_ranges(self.bucket, shard, nonempty) if nonempty else [])
                for key, members in group:
                    sample = {"__key__": key, "__shard__": shard}
                    for ext, _, size in members:
                        sample[ext] = next(blobs) if size > 0 else b""
                    yield self.transform(sample) if self.transform else sample


# -- torch.distributed.checkpoint ---------------------------------------------

try:
    from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader as _FsspecReader
    from torch.distributed.checkpoint.fsspec_filesystem import FsspecWriter as _FsspecWriter
except ImportError:  # torch < 2.6 names the module with an underscore
    from torch.distributed.checkpoint._fsspec_filesystem import (  # type: ignore
        FsspecReader as _FsspecReader,
        FsspecWriter as _FsspecWriter,
    )


def _fs_options(endpoint, access_key, secret_key) -> dict:
    return {k: v for k, v in (("endpoint", endpoint), ("access_key", access_key),
                              ("secret_key", secret_key)) if v is not None}


class CheckpointWriter(_FsspecWriter):
    """``dcp.save(state_dict, storage_writer=CheckpointWriter("percore://b/ckpt/step-100"))``.

    One object per rank (``single_file_per_rank``) plus ``.metadata``. A
    percore PUT is durable when it returns, so ``sync_files`` (an fsync of
    a local file) is off; ``thread_count`` PUTs run in parallel.
    """

    def __init__(self, path: str, *, endpoint=None, access_key=None, secret_key=None,
                 thread_count: int = 4, **kwargs):
        kwargs.setdefault("sync_files", False)
        super().__init__(path, thread_count=thread_count,
                         **kwargs, **_fs_options(endpoint, access_key, secret_key))


class _Prefetched(io.BufferedIOBase):
    """A read-only file of which some ranges are already in memory; reads
    elsewhere go to the server."""

    def __init__(self, fs, path: str, pieces: dict[int, bytes]):
        self._fs, self._path = fs, path
        self._pieces = sorted(pieces.items())
        self._pos = 0
        self._len: int | None = None

    def _size(self) -> int:
        if self._len is None:
            self._len = self._fs.size(self._path)
        return self._len

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, pos, whence=io.SEEK_SET):
        if whence == io.SEEK_SET:
            self._pos = pos
        elif whence == io.SEEK_CUR:
            self._pos += pos
        else:
            self._pos = self._size() + pos
        return self._pos

    def read(self, n=-1):
        if n is None or n < 0:
            n = max(self._size() - self._pos, 0)
        out = bytearray()
        while n > 0:
            chunk = None
            for at, data in self._pieces:
                if at <= self._pos < at + len(data):
                    chunk = data[self._pos - at:self._pos - at + n]
                    break
            if chunk is None:
                end = min(self._pos + n, self._size())
                if end <= self._pos:
                    break
                chunk = self._fs.cat_file(self._path, self._pos, end)
                if not chunk:
                    break
            out += chunk
            self._pos += len(chunk)
            n -= len(chunk)
        return bytes(out)

    read1 = read

    def readinto(self, b):
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class CheckpointReader(_FsspecReader):
    """``dcp.load(state_dict, storage_reader=CheckpointReader("percore://b/ckpt/step-100"))``.

    Before the planner reads, every byte range the plan needs is fetched:
    one multi-range Get per file, ``thread_count`` files at a time.
    """

    def __init__(self, path: str, *, endpoint=None, access_key=None, secret_key=None,
                 thread_count: int = 8, **kwargs):
        super().__init__(path, **kwargs, **_fs_options(endpoint, access_key, secret_key))
        self.thread_count = thread_count

    def read_data(self, plan, planner):
        from contextlib import contextmanager

        per_file: dict[str, list[tuple[int, int]]] = {}
        for item in plan.items:
            md = self.storage_data[item.storage_index]
            per_file.setdefault(md.relative_path, []).append((md.offset, md.length))
        fsspec_fs = self.fs.fs
        paths = {rel: str(self.fs.concat_path(self.path, rel)) for rel in per_file}

        def fetch(rel):
            ranges = sorted(set(per_file[rel]))
            data = fsspec_fs.cat_ranges([paths[rel]] * len(ranges),
                                        [o for o, _ in ranges], [o + n for o, n in ranges],
                                        on_error="raise")
            return paths[rel], dict(zip((o for o, _ in ranges), data))

        with ThreadPoolExecutor(max(1, min(self.thread_count, len(per_file) or 1))) as ex:
            fetched = dict(ex.map(fetch, per_file))

        outer = self.fs
        original = outer.create_stream

        @contextmanager
        def create_stream(path, mode):
            p = str(path)
            if mode == "rb" and p in fetched:
                yield _Prefetched(fsspec_fs, p, fetched[p])
            else:
                with original(path, mode) as s:
                    yield s

        outer.create_stream = create_stream
        try:
            return super().read_data(plan, planner)
        finally:
            del outer.create_stream
