"""fsspec filesystem for percore: ``percore://bucket/key``.

Registered as fsspec's ``percore`` protocol (an entry point of the package),
so ``fsspec.open("percore://data/x.parquet")``, ``pandas.read_parquet``,
``pyarrow.parquet`` (through ``pyarrow.fs.PyFileSystem(FSSpecHandler(fs))``
or fsspec file objects), Hugging Face ``datasets`` and DuckDB's fsspec
registration read from percore over the native protocol.

- Files opened for reading are random-access: every read that misses the
  read-ahead buffer is one ranged Get (``Client.get_ranges``), so reading a
  Parquet file's footer and two column chunks reads those bytes, not the file.
- ``cat_ranges`` sends all ranges of one file in one multi-range request.
- Files opened for writing are buffered and stored with one PUT on close
  (an object appears whole or not at all; a PUT is durable when it returns).
- Keys are flat: "directories" are common prefixes under "/".

Connection settings: ``PercoreFileSystem(endpoint=..., access_key=...,
secret_key=...)``, or ``storage_options`` with the same names, or the
``PERCORE_*`` environment variables.
"""

from __future__ import annotations

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from . import Client, InvalidRange, NoSuchBucket, NoSuchKey
from ._lazy import LazyClient

_DIR = "directory"
_FILE = "file"


class PercoreFileSystem(AbstractFileSystem):
    protocol = "percore"
    root_marker = ""
    # A 4 MiB read-ahead keeps sequential scans to few requests while a
    # random read costs at most one 4 MiB range.
    default_block_size = 4 * 1024 * 1024

    def __init__(self, endpoint=None, access_key=None, secret_key=None, client=None,
                 **kwargs):
        super().__init__(**kwargs)
        self._holder = LazyClient(client, endpoint, access_key, secret_key)

    @property
    def client(self) -> Client:
        return self._holder.client

    # -- paths ------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("percore://"):
            path = path[len("percore://"):]
        elif path.startswith("percore:"):
            path = path[len("percore:"):]
        return path.lstrip("/").rstrip("/")

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    def _entry(self, bucket: str, e) -> dict:
        name = f"{bucket}/{e.key}"
        if e.is_prefix:
            return {"name": name.rstrip("/"), "size": 0, "type": _DIR}
        return {"name": name, "size": e.size, "type": _FILE, "ETag": e.etag,
                "mtime_ms": e.mtime_ms}

    # -- listing and metadata ----------------------------------------------
    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        if not path:
            out = [{"name": b, "size": 0, "type": _DIR} for b in self.client.list_buckets()]
        else:
            bucket, key = self._split(path)
            prefix = f"{key}/" if key else ""
            try:
                entries = self.client.list(bucket, prefix, delimiter="/")
            except NoSuchBucket:
                raise FileNotFoundError(path) from None
            out = [self._entry(bucket, e) for e in entries]
            if not out and key:
                # A file lists as itself.
                out = [self.info(path)]
        return out if detail else [o["name"] for o in out]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        if not key:
            if bucket in self.client.list_buckets():
                return {"name": bucket, "size": 0, "type": _DIR}
            raise FileNotFoundError(path)
        try:
            st = self.client.stat(bucket, key)
            return {"name": path, "size": st.size, "type": _FILE, "ETag": st.etag,
                    "mtime_ms": st.mtime_ms, "ContentType": st.content_type}
        except NoSuchKey:
            pass
        except NoSuchBucket:
            raise FileNotFoundError(path) from None
        if self.client.list(bucket, key.rstrip("/") + "/", limit=1):
            return {"name": path, "size": 0, "type": _DIR}
        raise FileNotFoundError(path)

    def modified(self, path):
        import datetime

        ms = self.info(path).get("mtime_ms")
        if ms is None:
            raise IsADirectoryError(path)
        return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)

    def created(self, path):
        return self.modified(path)

    # -- reading ------------------------------------------------------------
    @staticmethod
    def _clamp(start, end, size: int) -> tuple[int, int]:
        """fsspec's slice semantics: None for the ends, negatives from the
        end, everything clamped to the object."""
        start = 0 if start is None else (size + start if start < 0 else start)
        end = size if end is None else (size + end if end < 0 else end)
        start = min(max(start, 0), size)
        return start, min(max(end, start), size)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        try:
            if start is None and end is None:
                return self.client.get(bucket, key)
            if start is None or start < 0 or end is None or end < 0:
                size = self.client.stat(bucket, key).size   # only to resolve the bounds
                start, end = self._clamp(start, end, size)
            if end <= start:
                return b""
            # The server cuts a range at the end; one starting past it is
            # InvalidRange, which fsspec expects as empty.
            return self.client.get_ranges(bucket, key, [(start, end - start)])[0]
        except InvalidRange:
            return b""
        except (NoSuchKey, NoSuchBucket):
            raise FileNotFoundError(path) from None

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        """All ranges of a file in one multi-range request."""
        paths = self._strip_protocol(paths)
        out = [None] * len(paths)
        by_file: dict[str, list[int]] = {}
        for i, p in enumerate(paths):
            by_file.setdefault(p, []).append(i)
        for p, idx in by_file.items():
            bucket, key = self._split(p)
            try:
                plain = all(starts[i] is not None and starts[i] >= 0 and ends[i] is not None
                            and ends[i] >= 0 for i in idx)
                try:
                    if not plain:
                        raise InvalidRange("bounds to resolve")
                    want = [(starts[i], max(ends[i] - starts[i], 0)) for i in idx]
                    nonempty = [(i, r) for i, r in zip(idx, want) if r[1] > 0]
                    got = self.client.get_ranges(bucket, key, [r for _, r in nonempty])
                except InvalidRange:
                    # None or negative bounds, or a range starting past the
                    # end: resolve them against the size (one Stat).
                    size = self.client.stat(bucket, key).size
                    want = []
                    for i in idx:
                        s, e = self._clamp(starts[i], ends[i], size)
                        want.append((s, e - s))
                    nonempty = [(i, r) for i, r in zip(idx, want) if r[1] > 0]
                    got = self.client.get_ranges(bucket, key, [r for _, r in nonempty])
                for i in idx:
                    out[i] = b""
                for (i, _), data in zip(nonempty, got):
                    out[i] = data
            except Exception as e:  # noqa: BLE001 - fsspec's on_error contract
                err = FileNotFoundError(p) if isinstance(e, (NoSuchKey, NoSuchBucket)) else e
                if on_error == "raise":
                    raise err from e
                for i in idx:
                    out[i] = err
        return out

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        if "a" in mode or "+" in mode:
            raise ValueError("percore objects are written whole: open with 'rb' or 'wb'")
        return PercoreFile(self, path, mode,
                           block_size=block_size or self.default_block_size,
                           autocommit=autocommit, cache_options=cache_options, **kwargs)

    # -- writing --------------------------------------------------------------
    def pipe_file(self, path, value, **kwargs):
        bucket, key = self._split(self._strip_protocol(path))
        self.client.put(bucket, key, value)

    def mkdir(self, path, create_parents=True, **kwargs):
        bucket, key = self._split(self._strip_protocol(path))
        if not key:
            self.client.create_bucket(bucket)
        # Keys are flat: a "directory" exists when a key under it does.

    def makedirs(self, path, exist_ok=False):
        bucket, _ = self._split(self._strip_protocol(path))
        if bucket not in self.client.list_buckets():
            self.client.create_bucket(bucket)
        elif not exist_ok and self._strip_protocol(path) == bucket:
            raise FileExistsError(path)

    def rmdir(self, path):
        pass  # prefixes vanish with their last key

    def rm(self, path, recursive=False, maxdepth=None):
        """Deletes files; with ``recursive``, every key under a prefix.
        Prefixes ("directories") and buckets themselves are not objects."""
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        for p in reversed(paths):
            bucket, key = self._split(self._strip_protocol(p))
            if not key:
                continue
            try:
                if self.info(p)["type"] == _DIR:
                    continue
            except FileNotFoundError:
                if not recursive:
                    raise
                continue
            self.rm_file(p)
        self.invalidate_cache()

    def rm_file(self, path):
        bucket, key = self._split(self._strip_protocol(path))
        if not self.client.delete(bucket, key):
            raise FileNotFoundError(path)

    def _rm(self, path):
        self.rm_file(path)

    def cp_file(self, path1, path2, **kwargs):
        data = self.cat_file(path1)
        self.pipe_file(path2, data)


class PercoreFile(AbstractBufferedFile):
    """A percore object: ranged reads with read-ahead, or one PUT on close."""

    def __init__(self, fs, path, mode="rb", **kwargs):
        super().__init__(fs, path, mode, **kwargs)
        self.bucket, self.key = PercoreFileSystem._split(
            PercoreFileSystem._strip_protocol(path))

    def _fetch_range(self, start, end):
        if end <= start:
            return b""
        try:
            return self.fs.client.get_ranges(self.bucket, self.key, [(start, end - start)])[0]
        except (NoSuchKey, NoSuchBucket):
            raise FileNotFoundError(self.path) from None

    def _initiate_upload(self):
        self._parts = []

    def _upload_chunk(self, final=False):
        self._parts.append(self.buffer.getvalue())
        if final:
            data = b"".join(self._parts)
            self._parts = []
            self.fs.client.put(self.bucket, self.key, data)
        return True
