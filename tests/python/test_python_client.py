"""The `percore` Python package (tools/python) against a real server.

Every Client method with 1 and 2 shards; errors as exceptions; get_into
into caller buffers; fork safety (a client used before the fork works in
the children); the GIL released while a call waits on the network.
"""

import hashlib
import multiprocessing
import os
import random
import signal
import threading
import time

import pytest

import percore
from conftest import Server, unique_bucket_name


@pytest.fixture(scope="module", params=[1, 2], ids=["shards1", "shards2"])
def srv(request):
    s = Server(shards=request.param, name=f"pyclient-s{request.param}")
    try:
        s.start()
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def client(srv):
    return percore.Client(srv.native_endpoint)


@pytest.fixture
def bkt(client, request):
    name = unique_bucket_name(request.node.originalname)
    client.create_bucket(name)
    return name


def test_put_get_stat_delete(srv, client, bkt):
    assert client.shard_count == srv.shards
    data = os.urandom(300_000)
    st = client.put(bkt, "a/one", data)
    assert st.size == len(data)
    assert st.etag == hashlib.md5(data).hexdigest()
    assert client.get(bkt, "a/one") == data
    # Every bytes-like input.
    client.put(bkt, "a/ba", bytearray(b"bytearray"))
    client.put(bkt, "a/mv", memoryview(b"xxmemoryviewxx")[2:-2])
    client.put(bkt, "a/empty", b"")
    assert client.get(bkt, "a/ba") == b"bytearray"
    assert client.get(bkt, "a/mv") == b"memoryview"
    assert client.get(bkt, "a/empty") == b""
    with pytest.raises(TypeError):
        client.put(bkt, "a/bad", 12345)
    # A non-contiguous view is refused, not silently gathered.
    with pytest.raises(TypeError):
        client.put(bkt, "a/bad", memoryview(bytearray(10))[::2])

    s = client.stat(bkt, "a/one")
    assert (s.size, s.etag) == (len(data), st.etag)
    assert s.owner_shard == client.owner(bkt, "a/one")
    assert client.delete(bkt, "a/one") is True
    assert client.delete(bkt, "a/one") is False
    with pytest.raises(percore.NoSuchKey) as ei:
        client.get(bkt, "a/one")
    assert ei.value.code == "NoSuchKey" and ei.value.status == 1
    assert isinstance(ei.value, percore.ServerError)
    assert isinstance(ei.value, percore.PercoreError)
    with pytest.raises(percore.NoSuchKey):
        client.stat(bkt, "a/one")
    assert client.misrouted == 0


def test_ranges(client, bkt):
    data = bytes(random.Random(7).getrandbits(8) for _ in range(200_000))
    client.put(bkt, "r", data)
    want = [(0, 1), (5, 4096), (199_990, 10), (100_000, 50_000), (5, 4096), (150_000, 100_000)]
    got = client.get_ranges(bkt, "r", want)
    assert got == [data[o:o + n] for o, n in want]   # the last one is cut at the end
    assert client.get_ranges(bkt, "r", []) == []
    with pytest.raises(percore.InvalidRange):
        client.get_ranges(bkt, "r", [(300_000, 10)])


def test_batch_in_request_order_across_shards(srv, client, bkt):
    objs = {f"s/{i:04d}": os.urandom(random.randrange(0, 5000)) for i in range(300)}
    for k, v in objs.items():
        client.put(bkt, k, v)
    keys = list(objs)
    random.Random(1).shuffle(keys)
    if srv.shards > 1:
        assert len({client.owner(bkt, k) for k in keys}) == srv.shards
    got = client.get_batch(bkt, keys)
    assert got == [objs[k] for k in keys]
    # Ranged items and whole objects mixed; duplicates allowed.
    big = keys[0]
    mixed = [keys[1], (big, [(0, 3), (1, 2)]), keys[1]]
    got = client.get_batch(bkt, mixed)
    assert got == [objs[keys[1]], [objs[big][0:3], objs[big][1:3]], objs[keys[1]]]
    # Missing keys: raise, or None in place.
    with pytest.raises(percore.NoSuchKey):
        client.get_batch(bkt, [keys[0], "nope"])
    got = client.get_batch(bkt, [keys[0], "nope", keys[2]], missing="none")
    assert got == [objs[keys[0]], None, objs[keys[2]]]
    assert client.get_batch(bkt, []) == []
    with pytest.raises(ValueError):
        client.get_batch(bkt, keys[:1], missing="skip")
    with pytest.raises(TypeError):
        client.get_batch(bkt, [42])


def test_get_into(client, bkt):
    data = os.urandom(3 * 1024 * 1024 + 17)   # several chunks
    client.put(bkt, "big", data)
    buf = bytearray(len(data) + 100)
    assert client.get_into(bkt, "big", buf) == len(data)
    assert bytes(buf[:len(data)]) == data and buf[len(data):] == bytes(100)
    # A window of the object into a slice of a larger buffer.
    view = memoryview(buf)[10:1010]
    assert client.get_into(bkt, "big", view, offset=2_000_000, length=1000) == 1000
    assert bytes(buf[10:1010]) == data[2_000_000:2_001_000]
    # From an offset to the end.
    tail = bytearray(17)
    assert client.get_into(bkt, "big", tail, offset=len(data) - 17) == 17
    assert bytes(tail) == data[-17:]
    with pytest.raises(ValueError, match="buffer holds 1000 bytes"):
        client.get_into(bkt, "big", bytearray(1000))
    with pytest.raises(TypeError):
        client.get_into(bkt, "big", b"read-only bytes")
    with pytest.raises(percore.NoSuchKey):
        client.get_into(bkt, "nope", bytearray(10))


def test_zero_lengths_and_many_ranges(client, bkt):
    """A zero length is empty (on the wire it would mean "to the end"); more
    ranges than the server takes per item are split, answers in order."""
    data = os.urandom(64 * 1024)
    client.put(bkt, "z", data)
    assert client.get_ranges(bkt, "z", [(10, 0), (0, 3), (5, 0)]) == [b"", data[:3], b""]
    assert client.get_ranges(bkt, "z", [(7, 0)]) == [b""]
    buf = bytearray(b"untouched")
    assert client.get_into(bkt, "z", buf, offset=100, length=0) == 0
    assert buf == b"untouched"
    with pytest.raises(percore.InvalidRange):   # at the end: unsatisfiable, as for a GET
        client.get_into(bkt, "z", bytearray(10), offset=len(data))
    many = [(i * 20, 7) for i in range(3000)]                         # > 1024 per item
    got = client.get_ranges(bkt, "z", many)
    assert got == [data[o:o + n] for o, n in many]
    got = client.get_batch(bkt, ["z", ("z", many), ("z", [(1, 0)])])
    assert got == [data, [data[o:o + n] for o, n in many], [b""]]
    with pytest.raises(percore.NoSuchKey):
        client.get_batch(bkt, [("nope", many)])
    assert client.get_batch(bkt, [("nope", many)], missing="none") == [None]


def test_pickled_client_keeps_its_settings(srv, bkt, client):
    """A client pickles as its settings, keys included (spawned workers)."""
    import pickle

    c = percore.Client(srv.native_endpoint, "percore", "percore-secret", timeout=7.5,
                       busy_for=2.5)
    for bad in (-1.0, float("nan"), 1e9):
        with pytest.raises(ValueError, match="busy_for"):
            percore.Client(srv.native_endpoint, "percore", "percore-secret", busy_for=bad)
    c.put(bkt, "p", b"pickled")
    c2 = pickle.loads(pickle.dumps(c))
    assert c2.get(bkt, "p") == b"pickled" and c2.endpoint == c.endpoint
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(_spawned_get, (c, bkt, "p")) == b"pickled"


def _spawned_get(c, bucket, key):
    return c.get(bucket, key)


def test_get_into_numpy(client, bkt):
    np = pytest.importorskip("numpy")
    data = os.urandom(4096 * 3)
    client.put(bkt, "np", data)
    arr = np.zeros(len(data), dtype=np.uint8)
    assert client.get_into(bkt, "np", arr) == len(data)
    assert arr.tobytes() == data
    # Any dtype: the bytes land as they are.
    f = np.zeros(len(data) // 4, dtype=np.float32)
    client.get_into(bkt, "np", f)
    assert f.tobytes() == data


def test_list_and_buckets(client, bkt):
    keys = sorted(f"l/{i:05d}" for i in range(1500))   # more than one page
    for k in keys:
        client.put(bkt, k, b"x")
    client.put(bkt, "m/1", b"yy")
    got = client.list(bkt, "l/")
    assert [e.key for e in got] == keys
    assert all(e.size == 1 and not e.is_prefix for e in got)
    assert [e.key for e in client.list(bkt, "l/", start_after="l/01490")] == keys[1491:]
    assert [e.key for e in client.list(bkt, "l/", limit=3)] == keys[:3]
    top = client.list(bkt, delimiter="/")
    assert [(e.key, e.is_prefix) for e in top] == [("l/", True), ("m/", True)]
    assert bkt in client.list_buckets()
    with pytest.raises(percore.NoSuchBucket):
        client.list(unique_bucket_name("missing"))
    with pytest.raises(percore.BucketExists):
        client.create_bucket(bkt)
    with pytest.raises(percore.InvalidBucketName):
        client.create_bucket("No_Such")


def test_bad_credentials_and_endpoints(srv):
    with pytest.raises(percore.Unauthenticated):
        percore.Client(srv.native_endpoint, "percore", "wrong-secret")
    with pytest.raises(percore.ConnectError):
        percore.Client("127.0.0.1:1")
    with pytest.raises(percore.ProtocolError):
        percore.Client("not-an-endpoint")
    with pytest.raises(ValueError):
        percore.Client(srv.native_endpoint, timeout=0)


def test_environment_variables(srv, monkeypatch):
    monkeypatch.setenv("PERCORE_ENDPOINT", srv.native_endpoint)
    monkeypatch.setenv("PERCORE_ACCESS_KEY", "percore")
    monkeypatch.setenv("PERCORE_SECRET_KEY", "percore-secret")
    c = percore.Client()
    assert c.endpoint == srv.native_endpoint
    monkeypatch.setenv("PERCORE_SECRET_KEY", "wrong")
    with pytest.raises(percore.Unauthenticated):
        percore.Client()


_FORK_CLIENT = None


def _worker_reads(args):
    bucket, keys = args
    got = [_FORK_CLIENT.get(bucket, k) for k in keys]
    got += _FORK_CLIENT.get_batch(bucket, keys)
    return [hashlib.md5(b).hexdigest() for b in got], os.getpid()


def test_fork_safety(srv, bkt):
    """A client used in the parent, then in forked workers (as DataLoader
    workers are): each child reconnects on its own; the parent's client
    keeps working."""
    global _FORK_CLIENT
    c = percore.Client(srv.native_endpoint)
    objs = {f"f/{i}": os.urandom(1000 + i) for i in range(40)}
    for k, v in objs.items():
        c.put(bkt, k, v)
    assert c.get(bkt, "f/0") == objs["f/0"]   # the session exists before the fork
    _FORK_CLIENT = c
    keys = list(objs)
    chunks = [keys[i::4] for i in range(4)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        results = pool.map(_worker_reads, [(bkt, ch) for ch in chunks])
    pids = {pid for _, pid in results}
    assert os.getpid() not in pids
    for ch, (md5s, _) in zip(chunks, results):
        want = [hashlib.md5(objs[k]).hexdigest() for k in ch]
        assert md5s == want + want
    # A forked child while another parent thread is mid-call.
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            c.get_batch(bkt, keys)

    t = threading.Thread(target=busy)
    t.start()
    try:
        pid = os.fork()
        if pid == 0:
            ok = 1
            try:
                ok = 0 if c.get_batch(bkt, keys) == [objs[k] for k in keys] else 3
            finally:
                os._exit(ok)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        t.join()
    assert c.get(bkt, "f/1") == objs["f/1"]


def _wait_all_threads_stopped(pid: int) -> None:
    """SIGSTOP reaches each thread of the process on its own; wait until
    every one is in state T."""
    deadline = time.monotonic() + 10
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                continue
        if states and all(s in "Tt" for s in states):
            return
        assert time.monotonic() < deadline, f"server threads not stopped: {states}"
        time.sleep(0.01)


def test_gil_released_during_io(srv, bkt):
    """A call waiting on the network does not hold the GIL: with the server
    stopped (SIGSTOP), a thread blocks in `stat` while this thread keeps
    running Python and then lets the server go (SIGCONT). Were the GIL held,
    this thread could not send SIGCONT and the call would time out."""
    c = percore.Client(srv.native_endpoint, timeout=20.0, attempts=1)
    c.put(bkt, "g", b"gil")
    result = {}
    entered = threading.Event()

    def call():
        entered.set()
        try:
            result["stat"] = c.stat(bkt, "g")
        except Exception as e:  # noqa: BLE001 - reported below
            result["error"] = e

    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        _wait_all_threads_stopped(srv.proc.pid)
        t = threading.Thread(target=call)
        t.start()
        assert entered.wait(5)
        # The thread is inside stat (the server cannot answer); Python here
        # still runs.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            pass
        assert t.is_alive(), f"stat returned with the server stopped: {result}"
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    t.join(30)
    assert not t.is_alive()
    assert "error" not in result, result
    assert result["stat"].size == 3
