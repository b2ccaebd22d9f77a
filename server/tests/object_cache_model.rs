//! The object cache must never serve a stale or wrong byte.
//!
//! A model test: seeded random PUTs (inline and in extents), overwrites,
//! DELETEs, multipart uploads, compactions (some racing reads and a PUT),
//! cache drops and readers held across changes, on a dozen keys; every GET
//! (full and ranged, in pieces, through `ObjectReader::read`, and
//! `read_fixed` where a data ring is attached) and every HEAD is compared
//! with an in-memory model. The same sequences run with the cache off must
//! give the same answers. Then one deterministic test per invalidation
//! path: overwrite, delete, multipart completion, compaction, cache drop,
//! and parts admitted through `read_fixed`.

// A model run is one loop read top to bottom.
#![allow(clippy::too_many_lines)]

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use bytes::Bytes;
use percore_server::ring::pool::BufferPool;
use percore_server::ring::{DataRing, RingConfig};
use percore_server::store::mpu::PART_BYTES_MIN;
use percore_server::store::record::ObjectMeta;
use percore_server::store::{
    ObjectCacheStats, ObjectReader, Store, StoreConfig, StoreError, StoreStats,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{run, seeded_bytes};

const BUCKET: &str = "b";
const KEYS: usize = 12;

fn key_name(i: usize) -> String {
    format!("k{i:02}")
}

fn md5_hex(b: &[u8]) -> String {
    use md5::{Digest, Md5};
    hex::encode(Md5::digest(b))
}

/// The multipart ETag of parts with these ETags: MD5 of their MD5s, dash,
/// count.
fn multipart_etag(etags: &[String]) -> String {
    use md5::{Digest, Md5};
    let mut md5s = Vec::new();
    for e in etags {
        md5s.extend(hex::decode(e).unwrap());
    }
    format!("{}-{}", hex::encode(Md5::digest(&md5s)), etags.len())
}

/// What a key holds in the model.
#[derive(Clone, Debug)]
struct Version {
    data: Bytes,
    etag: String,
    content_type: String,
}

/// A store configuration of the model run.
#[derive(Clone, Copy, Debug)]
struct Setup {
    chunk_bytes: u64,
    segment_bytes_max: u64,
    cache_bytes: usize,
    direct_io: bool,
    /// A data ring attached (O_DIRECT only): reads try `read_fixed` first,
    /// as GETs do, which admits parts to the cache on a second miss.
    ring: bool,
    compaction_rate: u64,
}

impl Setup {
    /// Chunks of 64 KiB (large objects in several extents), 128 KiB (inline
    /// objects read whole but kept in the device read's buffer) and 512 KiB
    /// (inline objects over 256 KiB, read through the header cache); caches
    /// of 1 and 2 MiB (evictions) and 64 MiB; O_DIRECT or buffered files,
    /// with or without a data ring; compaction throttled or not.
    fn of(seed: u64) -> Setup {
        let chunk_bytes = [64 << 10, 64 << 10, 128 << 10, 512 << 10][(seed % 4) as usize];
        Setup {
            chunk_bytes,
            segment_bytes_max: (chunk_bytes * 4).max(768 << 10),
            cache_bytes: [1 << 20, 2 << 20, 64 << 20][(seed % 3) as usize],
            direct_io: seed.is_multiple_of(2),
            ring: seed.is_multiple_of(2) && seed % 3 != 1,
            compaction_rate: if seed.is_multiple_of(5) { 32 << 20 } else { 0 },
        }
    }

    fn config(&self, dir: &Path, cache: bool) -> StoreConfig {
        let mut cfg = StoreConfig::new(0, dir.to_path_buf());
        cfg.direct_io = self.direct_io;
        cfg.segment_bytes_max = self.segment_bytes_max;
        cfg.chunk_bytes = self.chunk_bytes;
        cfg.batch_bytes_max = 256 << 10;
        cfg.compaction_interval_ms = 0;
        cfg.compaction_garbage_ratio_min = 0.3;
        cfg.compaction_bytes_per_sec_max = self.compaction_rate;
        cfg.object_cache_bytes_max = if cache { self.cache_bytes } else { 0 };
        cfg
    }
}

/// Reads `len` bytes at `offset` in pieces of at most `piece` bytes;
/// with a ring, each piece by `read_fixed` where it applies (as GETs do).
async fn read_range(
    r: &mut ObjectReader,
    ring: Option<&DataRing>,
    offset: u64,
    len: u64,
    piece: u64,
) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        let at = offset + out.len() as u64;
        let want = piece.min(len - out.len() as u64);
        let fixed = match ring {
            Some(ring) => r.read_fixed(ring, at, want).await,
            None => None,
        };
        let n = match fixed {
            Some(res) => {
                let (buf, a, b) = res?;
                out.extend_from_slice(&buf.as_slice()[a..b]);
                b - a
            }
            None => {
                let got = r.read(at, want).await?;
                out.extend_from_slice(&got);
                got.len()
            }
        };
        assert!(n > 0, "empty read at {at} of {}", r.size_bytes());
        assert!(n as u64 <= want, "read returned more than asked");
    }
    Ok(out)
}

/// Where two byte strings first differ, for failure messages.
fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i} (expected {:#04x}, got {:#04x})",
            a[i], b[i]
        ),
        None => format!("lengths differ: expected {}, got {}", a.len(), b.len()),
    }
}

/// One model run: the store, the model, the log of answers and of ops.
struct Run {
    store: Store,
    ring: Option<Rc<DataRing>>,
    seed: u64,
    rng: StdRng,
    model: HashMap<String, Version>,
    /// crc32c of every answer (u64::MAX: not found), in order.
    answers: Vec<u64>,
    /// The ops done so far, for failure messages.
    history: Vec<String>,
    /// Payload generator counter.
    versions: u64,
    uploads: Vec<Upload>,
    held: Vec<Held>,
    big_uploads: u32,
    /// Whether a PUT may race a compaction (whose outcome then depends on
    /// timing: off when answers are compared between runs).
    racing: bool,
}

struct Upload {
    key: String,
    id: String,
    /// (number, bytes, ETag).
    parts: Vec<(u32, Bytes, String)>,
    content_type: String,
}

/// A reader opened earlier, with the version it must keep reading.
struct Held {
    key: String,
    reader: ObjectReader,
    want: Version,
    ops_left: u32,
}

impl Run {
    fn context(&self) -> String {
        let from = self.history.len().saturating_sub(25);
        format!(
            "seed {} ({:?}), op {}; last ops:\n  {}",
            self.seed,
            Setup::of(self.seed),
            self.history.len(),
            self.history[from..].join("\n  ")
        )
    }

    /// The ring for this read (half the reads, where there is one).
    fn ring(&mut self) -> Option<Rc<DataRing>> {
        if self.rng.gen_bool(0.5) {
            self.ring.clone()
        } else {
            None
        }
    }

    fn data(&mut self, len: usize) -> Bytes {
        self.versions += 1;
        seeded_bytes((self.seed << 32) | self.versions, len)
    }

    fn random_key(&mut self) -> String {
        key_name(self.rng.gen_range(0..KEYS))
    }

    /// A piece size for reads: small, about a part, or everything at once
    /// (which is what caches extents).
    fn piece(&mut self) -> u64 {
        match self.rng.gen_range(0..4) {
            0 => self.rng.gen_range(1..=16 << 10),
            1 => self.rng.gen_range(16 << 10..=200 << 10),
            _ => u64::MAX,
        }
    }

    /// GETs `key` (HEAD, full read, then 1 to 3 ranges on the same reader)
    /// and compares with the model.
    async fn check_key(&mut self, key: &str) {
        let want = self.model.get(key).cloned();
        let head = self.store.head(BUCKET, key);
        let opened = self.store.open_read(BUCKET, key).await;
        let (want, mut r) = match (want, opened) {
            (None, Err(StoreError::NotFound)) => {
                assert!(
                    head.is_none(),
                    "HEAD {key} found a deleted key; {}",
                    self.context()
                );
                self.answers.push(u64::MAX);
                return;
            }
            (Some(want), Ok(r)) => (want, r),
            (want, got) => panic!(
                "GET {key}: expected {:?}, got {:?}; {}",
                want.map(|w| w.data.len()),
                got.map(|r| r.size_bytes()),
                self.context()
            ),
        };
        let len = want.data.len() as u64;
        let head = head.unwrap_or_else(|| panic!("HEAD {key} missing; {}", self.context()));
        assert_eq!(
            (head.size_bytes, &*head.etag),
            (len, want.etag.as_str()),
            "HEAD {key}; {}",
            self.context()
        );
        assert_eq!(
            (
                r.size_bytes(),
                r.meta.etag.as_str(),
                r.meta.content_type.as_str()
            ),
            (len, want.etag.as_str(), want.content_type.as_str()),
            "GET {key} metadata; {}",
            self.context()
        );
        let (piece, ring) = (self.piece(), self.ring());
        let got = read_range(&mut r, ring.as_deref(), 0, len, piece).await;
        let got = got.unwrap_or_else(|e| panic!("GET {key}: {e}; {}", self.context()));
        if got[..] != want.data[..] {
            panic!(
                "GET {key} (pieces of {piece}) returned wrong bytes: {}; {}",
                first_difference(&want.data, &got),
                self.context()
            );
        }
        self.answers.push(u64::from(crc32c::crc32c(&got)));
        for _ in 0..self.rng.gen_range(1..=3) {
            self.check_range(key, &mut r, &want).await;
        }
    }

    /// Reads a random range of `r` (past the end too) and compares.
    async fn check_range(&mut self, key: &str, r: &mut ObjectReader, want: &Version) {
        let len = want.data.len() as u64;
        let offset = self.rng.gen_range(0..=len + 10);
        let span = match self.rng.gen_range(0..3) {
            0 => self.rng.gen_range(0..=100),
            1 => self.rng.gen_range(0..=len + 1),
            _ => len,
        };
        let (piece, ring) = (self.piece(), self.ring());
        let end = (offset + span).min(len);
        let got = if offset >= len {
            let past = r
                .read(offset, span.max(1))
                .await
                .unwrap_or_else(|e| panic!("GET {key} past the end: {e}; {}", self.context()));
            assert!(past.is_empty(), "read past the end returned bytes");
            Vec::new()
        } else {
            read_range(r, ring.as_deref(), offset, end - offset, piece)
                .await
                .unwrap_or_else(|e| panic!("GET {key} range: {e}; {}", self.context()))
        };
        let expected = &want.data[offset.min(len) as usize..end.max(offset.min(len)) as usize];
        if got[..] != expected[..] {
            panic!(
                "GET {key} range {offset}+{span} (pieces of {piece}, object {len} bytes) returned wrong bytes: {}; {}",
                first_difference(expected, &got),
                self.context()
            );
        }
        self.answers.push(u64::from(crc32c::crc32c(&got)));
    }

    /// Reads a random range of each held reader now and then; drops those
    /// whose time is up.
    async fn check_held(&mut self) {
        let mut held = std::mem::take(&mut self.held);
        for h in &mut held {
            if self.rng.gen_bool(0.4) {
                let (key, want) = (h.key.clone(), h.want.clone());
                self.check_range(&key, &mut h.reader, &want).await;
            }
            h.ops_left -= 1;
        }
        held.retain(|h| h.ops_left > 0);
        self.held = held;
    }

    async fn put(&mut self, key: &str, len: usize) {
        let data = self.data(len);
        let content_type = format!("t/{}", self.versions);
        let etag = format!("{:x}-{}", self.seed, self.versions);
        let meta = ObjectMeta {
            etag: etag.clone(),
            content_type: content_type.clone(),
            ..Default::default()
        };
        // Streamed in random pieces, so extents do not line up with writes.
        let mut w = self.store.put_stream(BUCKET, key, meta);
        let mut rest = data.clone();
        while !rest.is_empty() {
            let n = self.rng.gen_range(1..=rest.len().min(150 << 10));
            w.write(rest.split_to(n)).await.unwrap();
        }
        let info = w.finish().await.unwrap();
        assert_eq!(info.size_bytes, len as u64);
        self.model.insert(
            key.to_string(),
            Version {
                data,
                etag,
                content_type,
            },
        );
    }

    fn small_len(&mut self) -> usize {
        match self.rng.gen_range(0..10) {
            0 => 0,
            1..=3 => self.rng.gen_range(1..=200),
            4..=6 => self.rng.gen_range(200..=16 << 10),
            _ => self.rng.gen_range(16 << 10..=100 << 10),
        }
    }

    async fn mpu_start(&mut self) {
        let key = self.random_key();
        let content_type = format!("mpu/{}", self.versions);
        let meta = ObjectMeta {
            content_type: content_type.clone(),
            ..Default::default()
        };
        let id = self.store.mpu_create(BUCKET, &key, meta).await.unwrap();
        // At most one upload of a 5 MiB part per run (the minimum for all
        // parts but the last), in about half the runs.
        let big = self.big_uploads == 0 && self.rng.gen_bool(0.08);
        let sizes: Vec<usize> = if big {
            self.big_uploads += 1;
            vec![PART_BYTES_MIN as usize, self.rng.gen_range(1..=150 << 10)]
        } else {
            let len = match self.rng.gen_range(0..8) {
                0 => 0,
                1..=3 => self.rng.gen_range(1..=64 << 10),
                _ => self.rng.gen_range(64 << 10..=300 << 10),
            };
            vec![len]
        };
        let mut parts = Vec::new();
        let mut number = 0;
        for len in sizes {
            number += self.rng.gen_range(1..=3);
            let data = self.data(len);
            let etag = md5_hex(&data);
            let mut w = self
                .store
                .put_part_stream(BUCKET, &key, &id, number)
                .unwrap();
            let mut rest = data.clone();
            while !rest.is_empty() {
                let n = self.rng.gen_range(1..=rest.len().min(300 << 10));
                w.write(rest.split_to(n)).await.unwrap();
            }
            w.set_etag(etag.clone());
            w.finish().await.unwrap();
            parts.push((number, data, etag));
        }
        self.history.push(format!(
            "mpu start {key} {id} parts {:?}",
            parts.iter().map(|p| (p.0, p.1.len())).collect::<Vec<_>>()
        ));
        self.uploads.push(Upload {
            key,
            id,
            parts,
            content_type,
        });
    }

    async fn mpu_complete(&mut self, i: usize) -> String {
        let u = self.uploads.swap_remove(i);
        let list: Vec<(u32, String)> = u.parts.iter().map(|p| (p.0, p.2.clone())).collect();
        let etag = multipart_etag(&u.parts.iter().map(|p| p.2.clone()).collect::<Vec<_>>());
        self.history
            .push(format!("mpu complete {} {}", u.key, u.id));
        let info = self
            .store
            .mpu_complete(BUCKET, &u.key, &u.id, &list)
            .await
            .unwrap_or_else(|e| panic!("complete: {e}; {}", self.context()));
        let data: Vec<u8> = u.parts.iter().flat_map(|p| p.1.iter().copied()).collect();
        assert_eq!((info.size_bytes, &*info.etag), (data.len() as u64, &*etag));
        self.model.insert(
            u.key.clone(),
            Version {
                data: data.into(),
                etag,
                content_type: u.content_type,
            },
        );
        u.key
    }

    /// Sealed segments, oldest first.
    fn sealed(&self) -> Vec<u64> {
        self.store
            .segment_table()
            .into_iter()
            .filter(|s| s.3)
            .map(|s| s.0)
            .collect()
    }

    /// A compaction (every sealed segment, one random one, or rounds of
    /// `compact_once`) in a task of its own, while this task reads keys
    /// and perhaps overwrites one.
    async fn compact(&mut self) {
        let how = self.rng.gen_range(0..3);
        let pick: usize = self.rng.gen();
        let racing_put = (self.rng.gen_bool(0.3) && self.racing).then(|| {
            let key = self.rng.gen_range(0..KEYS);
            let len = if self.rng.gen_bool(0.5) {
                self.rng.gen_range(0..=16 << 10)
            } else {
                self.rng.gen_range(200 << 10..=300 << 10)
            };
            (key_name(key), len)
        });
        let reads: Vec<String> = (0..3).map(|_| self.random_key()).collect();
        let sealed = self.sealed();
        let victims: Vec<u64> = match how {
            0 => sealed.clone(),
            1 if !sealed.is_empty() => vec![sealed[pick % sealed.len()]],
            _ => Vec::new(),
        };
        self.history.push(format!(
            "compact {} {victims:?} (sealed {sealed:?}), racing put {racing_put:?}",
            ["all sealed", "one", "compact_once"][how]
        ));
        let store = self.store.clone();
        let job = glommio::spawn_local(async move {
            let mut results = Vec::new();
            if how == 2 {
                for _ in 0..8 {
                    match store.compact_once().await {
                        Ok(Some(_)) => results.push(Ok(())),
                        Ok(None) => break,
                        Err(e) => {
                            results.push(Err(e));
                            break;
                        }
                    }
                }
            } else {
                for v in victims {
                    results.push(store.compact_segment(v).await.map(|_| ()));
                }
            }
            results
        });
        for key in &reads {
            if racing_put.as_ref().is_some_and(|p| p.0 == *key) {
                continue;
            }
            self.check_key(key).await;
        }
        if let Some((key, len)) = &racing_put {
            let data = self.data(*len);
            let etag = format!("{:x}-{}", self.seed, self.versions);
            let meta = ObjectMeta {
                etag: etag.clone(),
                ..Default::default()
            };
            match self.store.put(BUCKET, key, meta, data.clone()).await {
                Ok(_) => {
                    self.model.insert(
                        key.clone(),
                        Version {
                            data,
                            etag,
                            content_type: String::new(),
                        },
                    );
                }
                // Its extent's segment compacted before the pin took hold.
                Err(StoreError::Invalid(e)) => {
                    self.history.push(format!("racing put {key} refused: {e}"));
                }
                Err(e) => panic!("racing put: {e}; {}", self.context()),
            }
        }
        for key in &reads {
            self.check_key(key).await;
        }
        for r in job.await {
            match r {
                Ok(()) => {}
                // Contended by the racing PUT: kept for a later round.
                Err(StoreError::Invalid(e)) if racing_put.is_some() => {
                    self.history.push(format!("compaction refused: {e}"));
                }
                Err(e) => panic!("compaction failed: {e}; {}", self.context()),
            }
        }
        if let Some((key, _)) = &racing_put {
            self.check_key(key).await;
        }
    }

    async fn sweep(&mut self) {
        for i in 0..KEYS {
            self.check_key(&key_name(i)).await;
        }
    }

    fn check_stats(&self, cache: bool) {
        let s = self.store.stats().object_cache;
        assert!(s.bytes <= s.bytes_max, "cache over budget: {s:?}");
        if !cache {
            assert_eq!((s.hits, s.inserts, s.entries), (0, 0, 0), "{s:?}");
        }
    }

    async fn op(&mut self, cache: bool) {
        let roll = self.rng.gen_range(0..100);
        let touched = match roll {
            0..=27 => {
                let key = self.random_key();
                let len = self.small_len();
                self.history.push(format!("put {key} {len}"));
                self.put(&key, len).await;
                Some(key)
            }
            28..=41 => {
                let key = self.random_key();
                let len = self.rng.gen_range(200 << 10..=300 << 10);
                self.history.push(format!("put {key} {len}"));
                self.put(&key, len).await;
                Some(key)
            }
            42..=51 => {
                let key = self.random_key();
                let existed = self.store.delete(BUCKET, &key).await.unwrap();
                self.history.push(format!("delete {key} -> {existed}"));
                assert_eq!(
                    existed,
                    self.model.remove(&key).is_some(),
                    "{}",
                    self.context()
                );
                Some(key)
            }
            52..=57 => {
                if self.uploads.len() < 2 {
                    self.mpu_start().await;
                }
                None
            }
            58..=63 => {
                if self.uploads.is_empty() {
                    None
                } else {
                    let i = self.rng.gen_range(0..self.uploads.len());
                    Some(self.mpu_complete(i).await)
                }
            }
            64..=65 => {
                if !self.uploads.is_empty() {
                    let i = self.rng.gen_range(0..self.uploads.len());
                    let u = self.uploads.swap_remove(i);
                    self.history.push(format!("mpu abort {} {}", u.key, u.id));
                    self.store.mpu_abort(BUCKET, &u.key, &u.id).await.unwrap();
                }
                None
            }
            66..=73 => {
                self.compact().await;
                None
            }
            74..=76 => {
                self.history.push("drop object cache".into());
                self.store.drop_object_cache();
                let s = self.store.stats().object_cache;
                assert_eq!((s.bytes, s.entries), (0, 0), "{s:?}");
                None
            }
            77..=80 => {
                let key = self.random_key();
                if self.held.len() < 3 {
                    if let Some(want) = self.model.get(&key).cloned() {
                        self.history.push(format!("hold a reader of {key}"));
                        let reader = self.store.open_read(BUCKET, &key).await.unwrap();
                        let ops_left = self.rng.gen_range(1..=30);
                        self.held.push(Held {
                            key,
                            reader,
                            want,
                            ops_left,
                        });
                    }
                }
                None
            }
            _ => {
                let key = self.random_key();
                self.history.push(format!("get {key}"));
                for _ in 0..self.rng.gen_range(1..=3) {
                    self.check_key(&key).await;
                }
                None
            }
        };
        if let Some(key) = touched {
            self.check_key(&key).await;
            self.check_key(&key).await;
        }
        for _ in 0..self.rng.gen_range(0..=2) {
            let key = self.random_key();
            self.check_key(&key).await;
        }
        self.check_held().await;
        self.check_stats(cache);
    }
}

/// Runs `ops` random ops of `seed`; returns the answers and the store's
/// counters.
fn model_run(seed: u64, ops: usize, cache: bool, racing: bool) -> (Vec<u64>, StoreStats, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    run(move || async move {
        let setup = Setup::of(seed);
        let (store, _) = Store::open(setup.config(&path, cache)).await.unwrap();
        let ring = setup.ring.then(|| {
            let pool = BufferPool::new((1 << 20) + 4096, 8).unwrap();
            let ring = DataRing::new(RingConfig::default(), Some(pool)).unwrap();
            store.attach_ring(ring.clone());
            ring
        });
        let mut r = Run {
            store,
            ring,
            racing,
            seed,
            rng: StdRng::seed_from_u64(seed),
            model: HashMap::new(),
            answers: Vec::new(),
            history: Vec::new(),
            versions: 0,
            uploads: Vec::new(),
            held: Vec::new(),
            big_uploads: 0,
        };
        for i in 0..ops {
            r.op(cache).await;
            if i % 50 == 49 {
                r.sweep().await;
            }
        }
        while !r.uploads.is_empty() {
            let key = r.mpu_complete(0).await;
            r.check_key(&key).await;
        }
        r.held.clear();
        // Everything compacted that can be, then every key read again.
        for v in r.sealed() {
            r.store.compact_segment(v).await.unwrap();
        }
        r.sweep().await;
        r.sweep().await;
        r.check_stats(cache);
        let stats = r.store.stats();
        r.store.shutdown().await;
        let count = |what: &str| r.history.iter().filter(|h| h.contains(what)).count();
        let summary = format!(
            "{} puts, {} deletes, {} uploads completed, {} compactions ({} refused, {} racing PUTs refused), {} readers held, {} cache drops",
            count("put k"),
            count("delete"),
            count("mpu complete"),
            count("compact "),
            count("compaction refused"),
            count("racing put k"),
            count("hold a reader"),
            count("drop object cache"),
        );
        tx.send((r.answers, stats, summary)).unwrap();
    });
    rx.recv().unwrap()
}

const SEEDS: u64 = 20;
const OPS: usize = 400;

#[test]
fn the_cache_never_serves_a_stale_or_wrong_byte() {
    let mut total = ObjectCacheStats::default();
    let (mut small_evictions, mut compacted, mut relocated_bytes) = (0, 0, 0);
    for seed in 0..SEEDS {
        let started = std::time::Instant::now();
        let (answers, stats, summary) = model_run(seed, OPS, true, true);
        let s = stats.object_cache;
        eprintln!(
            "seed {seed} ({:?}): {summary}; {} answers in {:?}; {} segments compacted; {s:?}",
            Setup::of(seed),
            answers.len(),
            started.elapsed(),
            stats.segments_compacted,
        );
        assert_eq!(stats.corrupt_reads, 0, "seed {seed}");
        total.hits += s.hits;
        total.inserts += s.inserts;
        total.invalidations += s.invalidations;
        total.declined += s.declined;
        if Setup::of(seed).cache_bytes <= 2 << 20 {
            small_evictions += s.evictions;
        }
        compacted += stats.segments_compacted;
        relocated_bytes += stats.compaction_bytes_copied;
    }
    // Not vacuous: the cache served reads, filled (also through
    // `read_fixed`'s admission), was invalidated and, when small, evicted;
    // compaction moved records.
    assert!(
        total.hits > 0 && total.inserts > 0 && total.invalidations > 0 && total.declined > 0,
        "{total:?}"
    );
    assert!(small_evictions > 0);
    assert!(compacted > 0 && relocated_bytes > 0);
}

#[test]
fn the_same_sequences_without_the_cache_give_the_same_answers() {
    for seed in [0, 1, 2, 3, 5, 6] {
        let (with, s, _) = model_run(seed, OPS / 2, true, false);
        assert!(s.object_cache.hits > 0, "seed {seed}: {:?}", s.object_cache);
        let (without, s, _) = model_run(seed, OPS / 2, false, false);
        assert_eq!(s.object_cache, ObjectCacheStats::default(), "seed {seed}");
        assert_eq!(
            with.len(),
            without.len(),
            "seed {seed}: answer counts differ"
        );
        if let Some(i) = (0..with.len()).find(|&i| with[i] != without[i]) {
            panic!("seed {seed}: answer {i} differs with the cache off");
        }
    }
}

// ---- one test per invalidation path ----

fn det_config(dir: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(0, dir.to_path_buf());
    cfg.segment_bytes_max = 512 << 10;
    cfg.chunk_bytes = 64 << 10;
    cfg.batch_bytes_max = 256 << 10;
    cfg.compaction_interval_ms = 0;
    cfg.compaction_bytes_per_sec_max = 0;
    cfg.object_cache_bytes_max = 64 << 20;
    cfg
}

fn meta(etag: &str) -> ObjectMeta {
    ObjectMeta {
        etag: etag.into(),
        ..Default::default()
    }
}

const INLINE: usize = 5000;
/// Four extents of 64 KiB and one of 6,784 bytes.
const EXTENTS: usize = 4 * (64 << 10) + 6784;

/// GETs `key` whole (each part in one read, so extents are cached too)
/// and checks bytes and ETag.
async fn get(store: &Store, key: &str, want: &Bytes, etag: &str) {
    let mut r = store.open_read(BUCKET, key).await.unwrap();
    assert_eq!(r.meta.etag, etag);
    assert_eq!(r.size_bytes(), want.len() as u64);
    let got = read_range(&mut r, None, 0, want.len() as u64, u64::MAX)
        .await
        .unwrap();
    assert!(got[..] == want[..], "{}", first_difference(want, &got));
    // A range in the middle, in small pieces.
    let (a, b) = (want.len() / 3, want.len() * 2 / 3);
    let got = read_range(&mut r, None, a as u64, (b - a) as u64, 3001)
        .await
        .unwrap();
    assert!(got[..] == want[a..b]);
}

/// GETs `key` three times; the third GET must be served by the cache
/// (small objects enter on their first read, larger payloads on their
/// second miss).
async fn get_cached(store: &Store, key: &str, want: &Bytes, etag: &str) {
    get(store, key, want, etag).await;
    get(store, key, want, etag).await;
    let before = store.stats().object_cache;
    get(store, key, want, etag).await;
    let after = store.stats().object_cache;
    assert!(
        after.hits > before.hits,
        "not served by the cache: {after:?}"
    );
    assert_eq!(
        after.misses, before.misses,
        "a miss on a cached key: {after:?}"
    );
}

fn not_found(r: Result<ObjectReader, StoreError>) {
    assert!(matches!(r, Err(StoreError::NotFound)), "expected NotFound");
}

/// Caches `key` holding `before`, replaces it by `after` with a PUT, and
/// GETs it: the new bytes, never the old, and the old entries dropped.
fn overwrite(before: usize, after: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        let (old, new) = (seeded_bytes(1, before), seeded_bytes(2, after));
        // A neighbour that stays cached and correct.
        let other = seeded_bytes(3, 700);
        store
            .put(BUCKET, "other", meta("o"), other.clone())
            .await
            .unwrap();
        store
            .put(BUCKET, "k", meta("old"), old.clone())
            .await
            .unwrap();
        get_cached(&store, "other", &other, "o").await;
        get_cached(&store, "k", &old, "old").await;
        let before = store.stats().object_cache;
        store
            .put(BUCKET, "k", meta("new"), new.clone())
            .await
            .unwrap();
        assert!(store.stats().object_cache.invalidations > before.invalidations);
        get_cached(&store, "k", &new, "new").await;
        get_cached(&store, "other", &other, "o").await;
        store.shutdown().await;
    });
}

#[test]
fn an_inline_object_overwritten_inline_reads_new_bytes() {
    overwrite(INLINE, INLINE);
}

#[test]
fn an_inline_object_overwritten_by_extents_reads_new_bytes() {
    overwrite(INLINE, EXTENTS);
}

#[test]
fn an_object_in_extents_overwritten_inline_reads_new_bytes() {
    overwrite(EXTENTS, INLINE);
}

#[test]
fn an_object_in_extents_overwritten_by_extents_reads_new_bytes() {
    overwrite(EXTENTS, EXTENTS + 1);
}

#[test]
fn an_inline_object_overwritten_by_one_of_the_same_size_reads_new_bytes() {
    // Same size and place-independent content: only the place tells them
    // apart.
    overwrite(64 << 10, 64 << 10);
}

#[test]
fn a_deleted_cached_object_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        for (key, len) in [("small", INLINE), ("large", EXTENTS)] {
            let data = seeded_bytes(len as u64, len);
            store
                .put(BUCKET, key, meta("e"), data.clone())
                .await
                .unwrap();
            get_cached(&store, key, &data, "e").await;
            let before = store.stats().object_cache;
            assert!(store.delete(BUCKET, key).await.unwrap());
            assert!(store.stats().object_cache.invalidations > before.invalidations);
            not_found(store.open_read(BUCKET, key).await);
            assert!(store.head(BUCKET, key).is_none());
            // And back again, with other bytes.
            let again = seeded_bytes(len as u64 + 1, len);
            store
                .put(BUCKET, key, meta("f"), again.clone())
                .await
                .unwrap();
            get_cached(&store, key, &again, "f").await;
        }
        store.shutdown().await;
    });
}

#[test]
fn a_multipart_completion_over_a_cached_key_reads_new_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        for (key, len) in [("small", INLINE), ("large", EXTENTS)] {
            let old = seeded_bytes(len as u64, len);
            store
                .put(BUCKET, key, meta("old"), old.clone())
                .await
                .unwrap();
            let id = store.mpu_create(BUCKET, key, meta("")).await.unwrap();
            // Parts uploaded while the old version is read from the cache.
            get_cached(&store, key, &old, "old").await;
            let p1 = seeded_bytes(10, PART_BYTES_MIN as usize);
            let p2 = seeded_bytes(11, 70_000);
            let mut etags = Vec::new();
            for (n, p) in [(1, &p1), (2, &p2)] {
                let mut w = store.put_part_stream(BUCKET, key, &id, n).unwrap();
                w.write(p.clone()).await.unwrap();
                w.set_etag(md5_hex(p));
                w.finish().await.unwrap();
                etags.push(md5_hex(p));
            }
            get_cached(&store, key, &old, "old").await;
            let before = store.stats().object_cache;
            let list = vec![(1, etags[0].clone()), (2, etags[1].clone())];
            let info = store.mpu_complete(BUCKET, key, &id, &list).await.unwrap();
            assert!(store.stats().object_cache.invalidations > before.invalidations);
            let whole: Bytes = [p1, p2].concat().into();
            assert_eq!(&*info.etag, multipart_etag(&etags));
            get_cached(&store, key, &whole, &info.etag).await;
        }
        store.shutdown().await;
    });
}

fn active(store: &Store) -> u64 {
    store.segment_table().last().unwrap().0
}

/// Writes filler objects until a new segment starts.
async fn roll(store: &Store) {
    let before = active(store);
    let mut i = 0;
    while active(store) == before {
        let key = format!("fill-{before}-{i}");
        store
            .put(BUCKET, &key, meta("f"), seeded_bytes(i, 30_000))
            .await
            .unwrap();
        i += 1;
    }
}

#[test]
fn compaction_moving_cached_objects_keeps_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        store
            .put(BUCKET, "first", meta("f"), seeded_bytes(9, 100))
            .await
            .unwrap();
        roll(&store).await;
        let victim = active(&store);
        let small = seeded_bytes(1, INLINE);
        let large = seeded_bytes(2, 3 * (64 << 10) + 10);
        let gone = seeded_bytes(3, 200_000);
        store
            .put(BUCKET, "small", meta("s"), small.clone())
            .await
            .unwrap();
        store
            .put(BUCKET, "large", meta("l"), large.clone())
            .await
            .unwrap();
        store
            .put(BUCKET, "gone", meta("g"), gone.clone())
            .await
            .unwrap();
        assert_eq!(active(&store), victim, "all three in one segment");
        roll(&store).await;
        get_cached(&store, "small", &small, "s").await;
        get_cached(&store, "large", &large, "l").await;
        get_cached(&store, "gone", &gone, "g").await;
        // Garbage in the victim; a reader of the old version held across.
        let mut held = store.open_read(BUCKET, "gone").await.unwrap();
        assert!(store.delete(BUCKET, "gone").await.unwrap());
        let before = store.stats().object_cache;
        let report = store.compact_segment(victim).await.unwrap();
        assert!(report.records_relocated > 0);
        let after = store.stats().object_cache;
        let file = path.join(format!("seg-{victim:016x}.pcs"));
        assert!(!file.exists(), "the victim's file is gone");
        assert!(
            store.segment_table().iter().all(|s| s.0 != victim),
            "the victim left the table"
        );
        // small (1 entry) and large (4 extents) were cached in the victim.
        assert!(
            after.invalidations >= before.invalidations + 5,
            "the victim's entries dropped: {before:?} -> {after:?}"
        );
        assert!(after.entries + 5 <= before.entries);
        get_cached(&store, "small", &small, "s").await;
        get_cached(&store, "large", &large, "l").await;
        not_found(store.open_read(BUCKET, "gone").await);
        let got = read_range(&mut held, None, 0, gone.len() as u64, 9000)
            .await
            .unwrap();
        assert!(got[..] == gone[..], "a held reader reads its own version");
        drop(held);
        // Once more, from the copies' segment.
        roll(&store).await;
        let table = store.segment_table();
        for (id, _, _, sealed) in table {
            if sealed {
                store.compact_segment(id).await.unwrap();
            }
        }
        get_cached(&store, "small", &small, "s").await;
        get_cached(&store, "large", &large, "l").await;
        store.shutdown().await;
        drop(store);
        // And after a restart (a cold cache).
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        get_cached(&store, "small", &small, "s").await;
        get_cached(&store, "large", &large, "l").await;
        store.shutdown().await;
    });
}

#[test]
fn a_reader_opened_before_an_overwrite_reads_its_own_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        for (old_len, new_len) in [(INLINE, EXTENTS), (EXTENTS, INLINE), (EXTENTS, EXTENTS)] {
            let old = seeded_bytes(old_len as u64, old_len);
            let new = seeded_bytes(new_len as u64 + 7, new_len);
            store
                .put(BUCKET, "k", meta("old"), old.clone())
                .await
                .unwrap();
            get_cached(&store, "k", &old, "old").await;
            let mut held = store.open_read(BUCKET, "k").await.unwrap();
            store
                .put(BUCKET, "k", meta("new"), new.clone())
                .await
                .unwrap();
            get_cached(&store, "k", &new, "new").await;
            let got = read_range(&mut held, None, 0, old.len() as u64, u64::MAX)
                .await
                .unwrap();
            assert!(got[..] == old[..], "{}", first_difference(&old, &got));
            get_cached(&store, "k", &new, "new").await;
        }
        store.shutdown().await;
    });
}

#[test]
fn dropping_the_cache_empties_it_and_reads_stay_right() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        let small = seeded_bytes(1, INLINE);
        let large = seeded_bytes(2, EXTENTS);
        store
            .put(BUCKET, "small", meta("s"), small.clone())
            .await
            .unwrap();
        store
            .put(BUCKET, "large", meta("l"), large.clone())
            .await
            .unwrap();
        get_cached(&store, "small", &small, "s").await;
        get_cached(&store, "large", &large, "l").await;
        let before = store.stats().object_cache;
        assert!(before.entries >= 6, "{before:?}");
        store.drop_object_cache();
        let after = store.stats().object_cache;
        assert_eq!((after.entries, after.bytes), (0, 0));
        assert_eq!(after.invalidations, before.invalidations + before.entries);
        get(&store, "small", &small, "s").await;
        assert!(store.stats().object_cache.misses > after.misses);
        get_cached(&store, "small", &small, "s").await;
        get_cached(&store, "large", &large, "l").await;
        store.shutdown().await;
    });
}

#[test]
fn parts_admitted_through_read_fixed_are_invalidated_like_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (store, _) = Store::open(det_config(&path)).await.unwrap();
        let pool = BufferPool::new((1 << 20) + 4096, 4).unwrap();
        let ring = DataRing::new(RingConfig::default(), Some(pool)).unwrap();
        store.attach_ring(ring.clone());
        let old = seeded_bytes(1, EXTENTS);
        store
            .put(BUCKET, "k", meta("old"), old.clone())
            .await
            .unwrap();
        let get_fixed = |want: Bytes| {
            let store = store.clone();
            let ring = ring.clone();
            async move {
                let mut r = store.open_read(BUCKET, "k").await.unwrap();
                let got = read_range(&mut r, Some(&ring), 0, want.len() as u64, u64::MAX)
                    .await
                    .unwrap();
                assert!(got[..] == want[..], "{}", first_difference(&want, &got));
                store.stats().object_cache
            }
        };
        // Five extents: declined on a first miss, copied in on the second,
        // served from memory on the third.
        let s = get_fixed(old.clone()).await;
        assert_eq!((s.declined, s.inserts, s.hits), (5, 0, 0), "{s:?}");
        let s = get_fixed(old.clone()).await;
        assert_eq!((s.declined, s.inserts, s.hits), (5, 5, 0), "{s:?}");
        let s = get_fixed(old.clone()).await;
        assert_eq!((s.inserts, s.hits), (5, 5), "{s:?}");
        assert!(ring.stats().reads_fixed > 0);
        // Overwritten: the new bytes, the old entries dropped.
        let new = seeded_bytes(2, EXTENTS);
        store
            .put(BUCKET, "k", meta("new"), new.clone())
            .await
            .unwrap();
        assert_eq!(
            store.stats().object_cache.invalidations,
            s.invalidations + 5
        );
        for _ in 0..3 {
            get_fixed(new.clone()).await;
        }
        // Compacted: the same bytes from the copies.
        roll(&store).await;
        let before = store.stats().object_cache;
        for (id, _, _, sealed) in store.segment_table() {
            if sealed {
                store.compact_segment(id).await.unwrap();
            }
        }
        let after = store.stats().object_cache;
        assert!(
            after.invalidations >= before.invalidations + 5,
            "{before:?} -> {after:?}"
        );
        for _ in 0..3 {
            get_fixed(new.clone()).await;
        }
        get_cached(&store, "k", &new, "new").await;
        store.shutdown().await;
    });
}
