//! `percore._native`: the Python face of `percore-client` (PyO3).
//!
//! The Python package `percore` (tools/python/python/percore) re-exports
//! `Client` and the exceptions from here and adds the pure-Python layers
//! (PyTorch datasets, the fsspec filesystem, the S3 batch reader).
//!
//! - **The GIL is released during I/O**: every call runs its future on the
//!   client's tokio runtime inside `Python::detach`, so other Python threads
//!   (DataLoader prefetch threads, a training loop) keep running.
//! - **Fork-safe**: a session (runtime + connections) belongs to the process
//!   that opened it. A call in a forked child sees a different pid, leaks the
//!   parent's session (its runtime threads do not exist in the child, and its
//!   sockets are the parent's: closing them here would be harmless but
//!   dropping a runtime without its threads is not) and connects afresh. The
//!   session slot is only locked with the GIL held and never across I/O, so
//!   a fork (which holds the GIL) never copies it locked.
//! - **Errors** are Python exceptions: `ServerError` subclasses named after
//!   the server's status (`NoSuchKey`, `NoSuchBucket`, `Unauthenticated`,
//!   ...) with `.status` (the native status number) and `.code` (its name);
//!   `ConnectError`, `Timeout`, `ChecksumError` and `ProtocolError` for the
//!   client's own failures. All derive from `PercoreError`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use percore_client as pc;
use pyo3::exceptions::{PyBufferError, PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use pyo3::{ffi, PyTypeInfo};

pyo3::create_exception!(
    percore,
    PercoreError,
    PyException,
    "Base of every percore error."
);
pyo3::create_exception!(
    percore,
    ServerError,
    PercoreError,
    "The server refused the request: `.status` (number) and `.code` (name)."
);
pyo3::create_exception!(
    percore,
    ConnectError,
    PercoreError,
    "The server could not be reached (is `percore serve` running there?)."
);
pyo3::create_exception!(
    percore,
    Timeout,
    PercoreError,
    "No reply within the client's timeout."
);
pyo3::create_exception!(
    percore,
    ChecksumError,
    PercoreError,
    "Bytes received failed their CRC32C; they were discarded."
);
pyo3::create_exception!(
    percore,
    ProtocolError,
    PercoreError,
    "The server's reply broke the protocol, or the client was misused."
);

/// One `ServerError` subclass per status a caller may want to catch.
macro_rules! statuses {
    ($($name:ident),* $(,)?) => {
        $(pyo3::create_exception!(percore, $name, ServerError);)*

        fn status_type<'py>(py: Python<'py>, name: &str) -> Bound<'py, pyo3::types::PyType> {
            match name {
                $(stringify!($name) => $name::type_object(py),)*
                _ => ServerError::type_object(py),
            }
        }

        fn add_statuses(m: &Bound<'_, PyModule>) -> PyResult<()> {
            $(m.add(stringify!($name), m.py().get_type::<$name>())?;)*
            Ok(())
        }
    };
}

statuses!(
    NoSuchKey,
    NoSuchBucket,
    BucketExists,
    BucketNotEmpty,
    InvalidRange,
    InvalidRequest,
    Unauthenticated,
    ChecksumMismatch,
    TooLarge,
    Busy,
    NoSpace,
    Corrupt,
    Internal,
    ShuttingDown,
    PreconditionFailed,
    InvalidKey,
    InvalidBucketName,
    WrongNode,
);

fn to_py(py: Python<'_>, e: pc::Error) -> PyErr {
    let msg = e.to_string();
    match e {
        pc::Error::Server { status, message } => {
            let code = pc::Status(status).variant_name().unwrap_or("Unknown");
            let err = PyErr::from_type(status_type(py, code), (msg,));
            let v = err.value(py);
            // Attributes on a fresh exception instance cannot fail in
            // practice; if one did, the exception still says it all.
            let _ = v.setattr("status", status);
            let _ = v.setattr("code", code);
            let _ = v.setattr("server_message", message);
            err
        }
        pc::Error::Connect { .. } | pc::Error::Io(..) => ConnectError::new_err(msg),
        pc::Error::Timeout(_) => Timeout::new_err(msg),
        pc::Error::Checksum { .. } => ChecksumError::new_err(msg),
        pc::Error::Protocol(_) => ProtocolError::new_err(msg),
    }
}

/// A runtime and its connections, owned by the process that made them.
struct Session {
    pid: u32,
    rt: tokio::runtime::Runtime,
    client: pc::Client,
}

/// A client of one percore server (any shard's native address).
///
/// `Client(endpoint=None, access_key=None, secret_key=None, *, timeout=30.0,
/// attempts=3, threads=2, shard_aware=True, busy_for=15.0)`; a request
/// answered Busy (a cluster moving a placement group) is tried again for up
/// to `busy_for` seconds; unset arguments come from
/// `PERCORE_ENDPOINT` (default `127.0.0.1:9100`), `PERCORE_ACCESS_KEY` and
/// `PERCORE_SECRET_KEY` (default: the server's loopback-only defaults).
#[pyclass(module = "percore._native", name = "Client", frozen)]
struct Client {
    cfg: pc::Config,
    threads: usize,
    /// The keys came from the environment: pickled as None, so that the
    /// process that unpickles reads its own environment.
    keys_from_env: bool,
    /// Locked only with the GIL held and never across I/O (see the module
    /// doc: a fork must not copy it locked).
    session: Mutex<Option<Arc<Session>>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        let slot = self.session.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slot.take() {
            if s.pid != std::process::id() {
                // Forked: the runtime's threads live in the parent only.
                std::mem::forget(s);
            }
        }
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

impl Client {
    /// This process's session, connecting (GIL released) if there is none.
    fn session(&self, py: Python<'_>) -> PyResult<Arc<Session>> {
        let pid = std::process::id();
        {
            let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(s) if s.pid == pid => return Ok(s.clone()),
                Some(_) => std::mem::forget(slot.take()),
                None => {}
            }
        }
        let cfg = self.cfg.clone();
        let threads = self.threads;
        let fresh = py.detach(move || -> Result<Session, Result<String, pc::Error>> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("percore-client")
                .enable_all()
                .build()
                .map_err(|e| Ok(format!("cannot start the client runtime: {e}")))?;
            let client = rt.block_on(pc::Client::connect(cfg)).map_err(Err)?;
            Ok(Session { pid, rt, client })
        });
        let fresh = match fresh {
            Ok(s) => s,
            Err(Ok(msg)) => return Err(PercoreError::new_err(msg)),
            Err(Err(e)) => return Err(to_py(py, e)),
        };
        let fresh = Arc::new(fresh);
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            // Another thread connected meanwhile: keep theirs (ours is
            // dropped after the lock, outside it).
            Some(s) if s.pid == pid => {
                let theirs = s.clone();
                drop(slot);
                py.detach(move || drop(fresh));
                Ok(theirs)
            }
            _ => {
                *slot = Some(fresh.clone());
                Ok(fresh)
            }
        }
    }
}

/// Waits for `fut` on `s`'s runtime with the GIL released.
fn wait<T: Send>(
    py: Python<'_>,
    s: &Session,
    fut: impl std::future::Future<Output = pc::Result<T>> + Send,
) -> PyResult<T> {
    py.detach(|| s.rt.block_on(fut)).map_err(|e| to_py(py, e))
}

/// What the caller asked for, item by item, mapped onto the items sent:
/// a zero-length range is answered here (empty), never sent (on the wire a
/// zero length means "to the end"); an item with more ranges than the
/// server takes per item (`ranges_max`, from its Hello) is sent as several
/// items of the same key.
enum Want {
    /// The whole object: this wire item.
    Whole(usize),
    /// Per requested range: None (empty) or (wire item, range within it).
    Ranges(Vec<Option<(usize, usize)>>),
}

#[derive(Default)]
struct Plan {
    wire: Vec<(String, Vec<pc::Range>)>,
    wants: Vec<Want>,
}

impl Plan {
    fn whole(&mut self, key: String) {
        self.wants.push(Want::Whole(self.wire.len()));
        self.wire.push((key, Vec::new()));
    }

    fn ranges(&mut self, key: String, ranges: &[(u64, u64)], ranges_max: usize) {
        let mut slots = Vec::with_capacity(ranges.len());
        let mut current: Option<usize> = None;
        for &(offset, length) in ranges {
            if length == 0 {
                slots.push(None);
                continue;
            }
            let w = match current {
                Some(w) if self.wire[w].1.len() < ranges_max => w,
                _ => {
                    self.wire.push((key.clone(), Vec::new()));
                    self.wire.len() - 1
                }
            };
            current = Some(w);
            slots.push(Some((w, self.wire[w].1.len())));
            self.wire[w].1.push(pc::Range { offset, length });
        }
        self.wants.push(Want::Ranges(slots));
    }
}

type WireResults = Vec<Option<pc::Result<pc::Object>>>;

/// Ranges per item the server takes (its Hello; 0, from a server that
/// does not say, is the protocol's limit), never above the protocol's.
fn ranges_max(c: &pc::Client) -> usize {
    match c.hello().ranges_max {
        0 => RANGES_MAX,
        n => (n as usize).min(RANGES_MAX),
    }
}

/// The native protocol's ranges per item (`percore_protocol::native::RANGES_MAX`).
const RANGES_MAX: usize = 1024;

/// One requested item's answer from the wire results: `Ok(None)` for a
/// missing key when `keep_missing`.
fn answer<'py>(
    py: Python<'py>,
    want: &Want,
    results: &mut WireResults,
    keep_missing: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let missing_or = |e: pc::Error| -> PyResult<Option<Bound<'py, PyAny>>> {
        if keep_missing && e.status() == Some(pc::Status::NoSuchKey) {
            Ok(None)
        } else {
            Err(to_py(py, e))
        }
    };
    match want {
        Want::Whole(w) => match results[*w].take() {
            Some(Ok(obj)) => {
                let data = obj
                    .ranges
                    .into_iter()
                    .next()
                    .map(|r| r.1)
                    .unwrap_or_default();
                Ok(Some(PyBytes::new(py, &data).into_any()))
            }
            Some(Err(e)) => missing_or(e),
            None => Err(ProtocolError::new_err("an item was answered twice")),
        },
        Want::Ranges(slots) => {
            for (w, _) in slots.iter().flatten() {
                if matches!(results[*w], Some(Err(_))) {
                    if let Some(Err(e)) = results[*w].take() {
                        return missing_or(e);
                    }
                }
            }
            // An item split over several wire items is read in several
            // opens: all must have read the same version.
            let mut etag: Option<&str> = None;
            for (w, _) in slots.iter().flatten() {
                if let Some(Ok(obj)) = &results[*w] {
                    match etag {
                        Some(e) if e != obj.etag => {
                            return Err(ProtocolError::new_err(
                                "the object changed while its ranges were read (more ranges than one request takes); read again",
                            ))
                        }
                        _ => etag = Some(&obj.etag),
                    }
                }
            }
            let parts = PyList::empty(py);
            for slot in slots {
                match slot {
                    None => parts.append(PyBytes::new(py, b""))?,
                    Some((w, i)) => match results[*w]
                        .as_ref()
                        .map(|r| r.as_ref().map(|o| o.ranges.get(*i)))
                    {
                        Some(Ok(Some((_, b)))) => parts.append(PyBytes::new(py, b))?,
                        _ => {
                            return Err(ProtocolError::new_err(
                                "the server did not answer every range",
                            ))
                        }
                    },
                }
            }
            Ok(Some(parts.into_any()))
        }
    }
}

/// A C-contiguous buffer exported by a Python object (bytes, bytearray,
/// memoryview, numpy array, ...), held until dropped with the GIL.
struct Exported {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the exported memory stays valid and in place while the export is
// held (the exporter may not free or resize it: a bytearray refuses to
// resize, numpy refuses to reallocate); only its pointer and length cross
// threads, and the export is released with the GIL held (`release`).
unsafe impl Send for Exported {}

impl Exported {
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Exported> {
        // SAFETY: Py_buffer is plain data; PyObject_GetBuffer fills it in
        // or fails (and then it is never read or released).
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let flags = if writable {
            ffi::PyBUF_WRITABLE | ffi::PyBUF_C_CONTIGUOUS
        } else {
            ffi::PyBUF_C_CONTIGUOUS
        };
        // SAFETY: obj is a live object (we hold the GIL through `obj`) and
        // `view` points at writable memory of the right type.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            let err = PyErr::take(obj.py())
                .unwrap_or_else(|| PyBufferError::new_err("cannot export a buffer"));
            let what = if writable {
                "a writable, C-contiguous buffer (bytearray, memoryview, numpy array; for a torch tensor pass tensor.numpy())"
            } else {
                "a bytes-like object (bytes, bytearray, memoryview, numpy array)"
            };
            let e = PyTypeError::new_err(format!("expected {what}"));
            e.set_cause(obj.py(), Some(err));
            return Err(e);
        }
        Ok(Exported { view })
    }

    fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }

    fn ptr(&self) -> *mut u8 {
        self.view.buf.cast::<u8>()
    }
}

impl Drop for Exported {
    /// Releases the export (with the GIL: `attach` is a counter bump when
    /// the caller holds it, as every caller here does).
    fn drop(&mut self) {
        Python::attach(|_py| {
            // SAFETY: the view was filled by a successful PyObject_GetBuffer
            // and is released exactly once, here, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// A numpy uint8 view of a torch tensor's own memory (any dtype; pinned
/// or not), or a TypeError saying why there is none.
fn tensor_bytes<'py>(py: Python<'py>, t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let t = t.call_method0("detach")?;
    let device: String = t.getattr("device")?.getattr("type")?.extract()?;
    if device != "cpu" {
        return Err(PyTypeError::new_err(format!(
            "a torch tensor on {device} cannot be read into: use a CPU tensor (pinned for a fast copy to the GPU)"
        )));
    }
    if !t.call_method0("is_contiguous")?.extract::<bool>()? {
        return Err(PyTypeError::new_err(
            "a torch tensor must be contiguous to be read into",
        ));
    }
    let uint8 = py.import("torch")?.getattr("uint8")?;
    t.call_method0("flatten")?
        .call_method1("view", (uint8,))?
        .call_method0("numpy")
}

/// Where `get_into` writes: a raw pointer into an exported buffer.
struct Target {
    /// The buffer's address (an integer: the pointer crosses threads).
    ptr: usize,
    cap: usize,
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (endpoint=None, access_key=None, secret_key=None, timeout=30.0, attempts=3, threads=2, shard_aware=true, busy_for=15.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoint: Option<String>,
        access_key: Option<String>,
        secret_key: Option<String>,
        timeout: f64,
        attempts: u32,
        threads: usize,
        shard_aware: bool,
        busy_for: f64,
    ) -> PyResult<Client> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ));
        }
        if !(busy_for.is_finite() && (0.0..=3600.0).contains(&busy_for)) {
            return Err(PyValueError::new_err("busy_for must be 0..=3600 seconds"));
        }
        if threads == 0 || threads > 256 {
            return Err(PyValueError::new_err("threads must be 1..=256"));
        }
        let keys_from_env = access_key.is_none() && secret_key.is_none();
        let mut cfg = pc::Config::new(
            endpoint.unwrap_or_else(|| env_or("PERCORE_ENDPOINT", "127.0.0.1:9100")),
            access_key.unwrap_or_else(|| env_or("PERCORE_ACCESS_KEY", "percore")),
            secret_key.unwrap_or_else(|| env_or("PERCORE_SECRET_KEY", "percore-secret")),
        );
        cfg.timeout = Duration::from_secs_f64(timeout);
        cfg.attempts = attempts.max(1);
        cfg.shard_aware = shard_aware;
        cfg.busy_for = Duration::from_secs_f64(busy_for);
        let c = Client {
            cfg,
            threads,
            keys_from_env,
            session: Mutex::new(None),
        };
        // Connect now, so a wrong endpoint or key fails here.
        c.session(py)?;
        Ok(c)
    }

    #[getter]
    fn endpoint(&self) -> &str {
        &self.cfg.endpoint
    }

    /// Pickles as its settings, never its connections; unpickling
    /// connects. Keys given to the constructor travel in the pickle (a
    /// spawned DataLoader worker needs them: keep such pickles private);
    /// keys from the environment do not (the other process reads its own).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let key = |k: &str| (!self.keys_from_env).then(|| k.to_string());
        let args = (
            self.cfg.endpoint.clone(),
            key(&self.cfg.access_key),
            key(&self.cfg.secret_key),
            self.cfg.timeout.as_secs_f64(),
            self.cfg.attempts,
            self.threads,
            self.cfg.shard_aware,
            self.cfg.busy_for.as_secs_f64(),
        );
        Ok((py.get_type::<Client>(), args)
            .into_pyobject(py)?
            .into_any())
    }

    /// The server's shard count (from its Hello).
    #[getter]
    fn shard_count(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.session(py)?.client.shard_count())
    }

    /// The shard that owns `key` (the server's routing function).
    fn owner(&self, py: Python<'_>, bucket: &str, key: &str) -> PyResult<usize> {
        Ok(self.session(py)?.client.owner(bucket, key))
    }

    /// On a cluster: the name of the node that serves `key` (its placement
    /// group's primary in the client's map); None on a single node.
    fn owner_node(&self, py: Python<'_>, bucket: &str, key: &str) -> PyResult<Option<String>> {
        Ok(self.session(py)?.client.owner_node(bucket, key))
    }

    /// On a cluster: the epoch of the map the client routes by; None on a
    /// single node.
    #[getter]
    fn cluster_epoch(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        Ok(self.session(py)?.client.cluster_map().map(|m| m.epoch))
    }

    /// Cluster maps fetched again after a node answered WrongNode.
    #[getter]
    fn map_refreshes(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self
            .session(py)?
            .client
            .map_refreshes
            .load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Requests answered by a shard other than the one this client routed
    /// to (should stay 0).
    #[getter]
    fn misrouted(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self
            .session(py)?
            .client
            .misrouted
            .load(std::sync::atomic::Ordering::Relaxed))
    }

    fn create_bucket(&self, py: Python<'_>, bucket: &str) -> PyResult<()> {
        let s = self.session(py)?;
        wait(py, &s, s.client.create_bucket(bucket))
    }

    /// Bucket names.
    fn list_buckets(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let s = self.session(py)?;
        let v = wait(py, &s, s.client.list_buckets())?;
        Ok(v.into_iter().map(|b| b.name).collect())
    }

    /// Stores `data` (any bytes-like object) as `key`; returns its `Stat`.
    #[pyo3(signature = (bucket, key, data, content_type=""))]
    fn put(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        data: &Bound<'_, PyAny>,
        content_type: &str,
    ) -> PyResult<Stat> {
        let bytes = if let Ok(b) = data.cast::<PyBytes>() {
            Bytes::copy_from_slice(b.as_bytes())
        } else {
            let ex = Exported::get(data, false)?;
            let (ptr, len) = (ex.ptr() as usize, ex.len());
            // Copied with the GIL released; the export pins the memory.
            let b = py.detach(move || {
                // SAFETY: ptr/len describe the exported, pinned buffer.
                Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
            });
            drop(ex);
            b
        };
        let s = self.session(py)?;
        let st = wait(py, &s, s.client.put_with(bucket, key, bytes, content_type))?;
        Ok(Stat::from(st))
    }

    /// The whole object.
    fn get<'py>(&self, py: Python<'py>, bucket: &str, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let s = self.session(py)?;
        let mut obj = wait(py, &s, s.client.get(bucket, key, &[]))?;
        let data = obj.ranges.pop().map(|r| r.1).unwrap_or_default();
        Ok(PyBytes::new(py, &data))
    }

    /// Several byte ranges `[(offset, length), ...]` of one object in one
    /// request; a range past the end is cut at the end.
    fn get_ranges<'py>(
        &self,
        py: Python<'py>,
        bucket: &str,
        key: &str,
        ranges: Vec<(u64, u64)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if ranges.is_empty() {
            return Ok(PyList::empty(py).into_any());
        }
        let s = self.session(py)?;
        let max = ranges_max(&s.client);
        let mut plan = Plan::default();
        plan.ranges(key.to_string(), &ranges, max);
        let mut results: WireResults = match plan.wire.len() {
            // Only zero-length ranges: nothing to read.
            0 => Vec::new(),
            // One item: a plain Get; its error stays a client error for
            // `answer` to map.
            1 => {
                let r = &plan.wire[0].1;
                vec![Some(
                    py.detach(|| s.rt.block_on(s.client.get(bucket, key, r))),
                )]
            }
            _ => wait(py, &s, s.client.get_batch(bucket, &plan.wire))?
                .into_iter()
                .map(Some)
                .collect(),
        };
        let got = answer(py, &plan.wants[0], &mut results, false)?;
        got.ok_or_else(|| ProtocolError::new_err("no answer"))
    }

    /// Many objects in one BatchGet per owner shard, all shards at once.
    /// `keys` holds names (the whole object comes back as `bytes`) or
    /// `(name, [(offset, length), ...])` pairs (a list of `bytes`). In
    /// request order. A missing key raises `NoSuchKey` (`missing="raise"`)
    /// or comes back as `None` (`missing="none"`).
    #[pyo3(signature = (bucket, keys, *, missing="raise"))]
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        bucket: &str,
        keys: &Bound<'py, PyAny>,
        missing: &str,
    ) -> PyResult<Bound<'py, PyList>> {
        let keep_missing = match missing {
            "raise" => false,
            "none" => true,
            _ => return Err(PyValueError::new_err("missing must be 'raise' or 'none'")),
        };
        let s = self.session(py)?;
        let max = ranges_max(&s.client);
        let mut plan = Plan::default();
        for k in keys.try_iter()? {
            let k = k?;
            if let Ok(name) = k.cast::<PyString>() {
                plan.whole(name.to_str()?.to_string());
            } else {
                let (name, rs): (String, Vec<(u64, u64)>) = k.extract().map_err(|_| {
                    PyTypeError::new_err(
                        "each key is a str or a (str, [(offset, length), ...]) pair",
                    )
                })?;
                if rs.is_empty() {
                    return Err(PyValueError::new_err(format!(
                        "key {name:?}: an empty range list (pass the name alone for the whole object)"
                    )));
                }
                plan.ranges(name, &rs, max);
            }
        }
        let mut results: WireResults = if plan.wire.is_empty() {
            Vec::new()
        } else {
            wait(py, &s, s.client.get_batch(bucket, &plan.wire))?
                .into_iter()
                .map(Some)
                .collect()
        };
        let out = PyList::empty(py);
        for want in &plan.wants {
            match answer(py, want, &mut results, keep_missing)? {
                Some(v) => out.append(v)?,
                None => out.append(py.None())?,
            }
        }
        Ok(out)
    }

    /// Reads the object (or `length` bytes from `offset`) into `buffer`, a
    /// writable C-contiguous buffer (bytearray, numpy array, a CPU torch
    /// tensor, pinned or not), with no copy beyond the socket read.
    /// Returns the number of bytes written; `ValueError` if it does not fit.
    #[pyo3(signature = (bucket, key, buffer, offset=0, length=None))]
    fn get_into(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        buffer: &Bound<'_, PyAny>,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<usize> {
        let ex = match Exported::get(buffer, true) {
            Ok(ex) => ex,
            // A torch tensor has no buffer protocol; on the CPU (pinned or
            // not) its `.numpy()` shares its memory, and the export keeps
            // that array alive until it is released.
            Err(e) if buffer.hasattr("data_ptr")? && buffer.hasattr("numpy")? => {
                drop(e);
                Exported::get(&tensor_bytes(py, buffer)?, true)?
            }
            Err(e) => return Err(e),
        };
        if length == Some(0) {
            // On the wire a zero length means "to the end": nothing to read.
            return Ok(0);
        }
        let target = Target {
            ptr: ex.ptr() as usize,
            cap: ex.len(),
        };
        let range = match length {
            Some(length) => Some(pc::Range { offset, length }),
            None if offset > 0 => Some(pc::Range {
                offset,
                length: u64::MAX - offset,
            }),
            None => None,
        };
        let mut too_small = None;
        let s = self.session(py)?;
        let r = {
            let target = &target;
            let too_small = &mut too_small;
            let start = offset;
            let mut written = 0usize;
            let c = &s.client;
            wait(py, &s, async move {
                let obj = c
                    .get_stream(bucket, key, range, |at, data| {
                        let pos = (at - start) as usize;
                        let end = pos.saturating_add(data.len());
                        if end > target.cap {
                            *too_small = Some(end);
                            return Err(std::io::Error::other("buffer too small"));
                        }
                        // SAFETY: pos..end lies inside the exported buffer
                        // (checked above), which stays pinned until
                        // `release` below; chunks never overlap.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                data.as_ptr(),
                                (target.ptr as *mut u8).add(pos),
                                data.len(),
                            );
                        }
                        written = written.max(end);
                        Ok(())
                    })
                    .await?;
                Ok((obj, written))
            })
        };
        drop(ex);
        match (r, too_small) {
            (_, Some(end)) => Err(PyValueError::new_err(format!(
                "the buffer holds {} bytes; the object needs at least {end}",
                target.cap
            ))),
            (Ok((_, written)), None) => Ok(written),
            (Err(e), None) => Err(e),
        }
    }

    /// Metadata of `key`.
    fn stat(&self, py: Python<'_>, bucket: &str, key: &str) -> PyResult<Stat> {
        let s = self.session(py)?;
        Ok(Stat::from(wait(py, &s, s.client.stat(bucket, key))?))
    }

    /// Deletes `key`; returns whether it existed.
    fn delete(&self, py: Python<'_>, bucket: &str, key: &str) -> PyResult<bool> {
        let s = self.session(py)?;
        wait(py, &s, s.client.delete(bucket, key))
    }

    /// Every key under `prefix` (all pages), in key order; with a
    /// `delimiter`, common prefixes come back as entries with `is_prefix`.
    #[pyo3(signature = (bucket, prefix="", *, delimiter="", start_after="", limit=None))]
    fn list(
        &self,
        py: Python<'_>,
        bucket: &str,
        prefix: &str,
        delimiter: &str,
        start_after: &str,
        limit: Option<usize>,
    ) -> PyResult<Vec<Entry>> {
        let limit = limit.unwrap_or(usize::MAX);
        let s = self.session(py)?;
        let c = &s.client;
        let entries = wait(py, &s, async move {
            let mut out = Vec::new();
            let mut after = start_after.to_string();
            while out.len() < limit {
                let want = (limit - out.len()).min(1000) as u32;
                let page = c.list(bucket, prefix, &after, delimiter, want).await?;
                let next = page.next_start_after.clone();
                out.extend(page.entries);
                if !page.truncated || next.is_empty() || next == after {
                    break;
                }
                after = next;
            }
            out.truncate(limit);
            Ok(out)
        })?;
        Ok(entries.into_iter().map(Entry::from).collect())
    }

    fn __repr__(&self) -> String {
        format!("percore.Client({:?})", self.cfg.endpoint)
    }
}

/// Metadata of a stored object.
#[pyclass(module = "percore._native", frozen, get_all)]
struct Stat {
    size: u64,
    etag: String,
    mtime_ms: u64,
    content_type: String,
    crc32c: u32,
    owner_shard: i32,
}

impl From<pc::Stat> for Stat {
    fn from(s: pc::Stat) -> Stat {
        Stat {
            size: s.size,
            etag: s.etag,
            mtime_ms: s.mtime_ms,
            content_type: s.content_type,
            crc32c: s.crc32c,
            owner_shard: s.owner_shard,
        }
    }
}

#[pymethods]
impl Stat {
    fn __repr__(&self) -> String {
        format!(
            "Stat(size={}, etag={:?}, mtime_ms={}, content_type={:?}, crc32c={:#010x})",
            self.size, self.etag, self.mtime_ms, self.content_type, self.crc32c
        )
    }
}

/// One listed key (or, with a delimiter, a common prefix).
#[pyclass(module = "percore._native", frozen, get_all)]
struct Entry {
    key: String,
    size: u64,
    etag: String,
    mtime_ms: u64,
    is_prefix: bool,
}

impl From<pc::ListEntry> for Entry {
    fn from(e: pc::ListEntry) -> Entry {
        Entry {
            key: e.key,
            size: e.size,
            etag: e.etag,
            mtime_ms: e.mtime_ms,
            is_prefix: e.is_prefix,
        }
    }
}

#[pymethods]
impl Entry {
    fn __repr__(&self) -> String {
        if self.is_prefix {
            format!("Entry(prefix={:?})", self.key)
        } else {
            format!("Entry(key={:?}, size={})", self.key, self.size)
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Stat>()?;
    m.add_class::<Entry>()?;
    let py = m.py();
    m.add("PercoreError", py.get_type::<PercoreError>())?;
    m.add("ServerError", py.get_type::<ServerError>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("ChecksumError", py.get_type::<ChecksumError>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    add_statuses(m)?;
    Ok(())
}
