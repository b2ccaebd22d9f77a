//! Multipart uploads.
//!
//! An upload and its parts are ordinary keyed records of the bucket, in a
//! namespace that S3 keys cannot reach (they start with NUL, which the front
//! doors reject in keys):
//!
//! ```text
//! upload  "\0u/" key "\0" upload_id                  Object record, no payload; its
//!                                                     metadata is the final object's
//! part    "\0p/" key "\0" upload_id "\0" NNNNN       Object record whose bytes are
//!                                                     extents (never inline)
//! ```
//!
//! The owner shard of `key` holds all of them, so completing an upload is
//! local: one `Object` record for `key` listing the chosen parts' extents in
//! order (no byte is copied), then tombstones for every part and for the
//! upload. A crash between the two leaves the completed object *and* the
//! upload (both acknowledged states are intact; the client may abort it).
//! Part records left without their upload (a part finished while its upload
//! was aborted, or a crash half-way through the tombstones) are swept at
//! start-up. Extents are live while any index entry references them, so an
//! extent shared by a part and the completed object survives compaction.
//!
//! Retried completions: SDKs send CompleteMultipartUpload again after a
//! timeout, and the retry must answer as the first did (200, same ETag)
//! while the key's current version is still the one that completion wrote.
//! Each shard remembers its last [`COMPLETED_UPLOADS_REMEMBERED_COUNT_MAX`]
//! completions (upload, digest of the part list, seq of the object written):
//! a retry with the same part list is answered from the key's current
//! version if its seq is that one; a different part list, or a key written
//! since, answers NoSuchUpload (as S3 does). Not persisted: after a restart
//! (or once forgotten) a retry is recognised from the index instead, while
//! the upload's tombstone is still indexed (until compaction drops it): the
//! tombstone is newer than the key's current version (completion writes the
//! object, then ends the upload; anything written to the key afterwards is
//! newer) and the listed parts' ETags give the current version's ETag. That
//! fallback cannot check part numbers (the ETag covers the parts' ETags in
//! order only), so a retry listing the same parts under other numbers is
//! answered 200 there; the object then holds exactly the bytes it lists.
//! A completion under way makes a concurrent Complete or Abort of the same
//! upload wait for it, then answer from its outcome.
//!
//! Deleted buckets: DeleteBucket drops the bucket's uploads and parts on
//! every shard once its own record is durable (the commit point; see
//! `Shard::bucket_delete`). Should that be cut short (crash, I/O error),
//! every shard drops the multipart state of buckets that do not exist at
//! start-up, and again when a bucket of that name is created, before it
//! becomes visible: a new bucket never sees an old one's uploads.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use bytes::Bytes;
use futures::channel::oneshot;
use md5::{Digest, Md5};
use thiserror::Error;

use super::checksum::{Algorithm, ChecksumType, UploadChecksum};
use super::record::{self, Body, ExtentRef, Header, Kind, ObjectMeta};
use super::versions::{version_key, Pick};
use super::{now_ms, Entry, ObjectInfo, PutWriter, Result, State, Store, StoreError};

pub const PART_NUMBER_MAX: u32 = 10_000;
/// Every part but the last must be at least this large.
pub const PART_BYTES_MIN: u64 = 5 << 20;
const UPLOAD_PREFIX: &str = "\0u/";
const PART_PREFIX: &str = "\0p/";
/// Upload ids are 32 lower-case hex digits.
const UPLOAD_ID_LEN: usize = 32;
/// Completed uploads each shard remembers for retried completions, oldest
/// forgotten first. An entry holds its bucket and upload key (shared by the
/// map and the queue), a 16-byte digest and a seq: about 1.2 KiB with a
/// 1 KiB key, so at most about 5 MiB per shard, and under 1 MiB with keys
/// of about 50 bytes.
pub const COMPLETED_UPLOADS_REMEMBERED_COUNT_MAX: usize = 4096;

/// An upload within the store: (bucket, upload index key).
type UploadRef = (String, String);

/// Per-store multipart state that is not in the index.
#[derive(Default)]
pub(super) struct MpuState {
    /// Uploads whose completion is under way, with the requests waiting for
    /// it to end.
    completing: RefCell<HashMap<UploadRef, Vec<oneshot::Sender<()>>>>,
    completed: RefCell<CompletedUploads>,
}

/// The last completions of this shard (see the module documentation).
#[derive(Default)]
struct CompletedUploads {
    by_upload: HashMap<Rc<(String, String)>, Completed>,
    /// Oldest first.
    order: VecDeque<Rc<(String, String)>>,
}

#[derive(Clone, Copy)]
struct Completed {
    parts_digest: [u8; 16],
    /// Seq of the object record the completion wrote.
    seq: u64,
}

impl CompletedUploads {
    fn remember(&mut self, bucket: &str, upload: &str, done: Completed) {
        let id = Rc::new((bucket.to_string(), upload.to_string()));
        if self.by_upload.insert(id.clone(), done).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > COMPLETED_UPLOADS_REMEMBERED_COUNT_MAX {
            if let Some(old) = self.order.pop_front() {
                self.by_upload.remove(&old);
            }
        }
    }

    fn get(&self, bucket: &str, upload: &str) -> Option<Completed> {
        self.by_upload
            .get(&(bucket.to_string(), upload.to_string()))
            .copied()
    }

    fn forget_bucket(&mut self, bucket: &str) {
        self.order.retain(|id| id.0 != bucket);
        self.by_upload.retain(|id, _| id.0 != bucket);
    }
}

/// Ends a completion's "under way" mark and wakes its waiters (also when
/// the completion fails or its future is dropped).
struct CompletingGuard<'a> {
    store: &'a Store,
    id: (String, String),
}

impl Drop for CompletingGuard<'_> {
    fn drop(&mut self) {
        let waiters = self
            .store
            .inner
            .mpu
            .completing
            .borrow_mut()
            .remove(&self.id);
        for w in waiters.into_iter().flatten() {
            let _ = w.send(());
        }
    }
}

/// Identifies a completion's part list (numbers and ETags, in order).
fn parts_digest(parts: &[(u32, String)]) -> [u8; 16] {
    let mut h = Md5::new();
    for (number, etag) in parts {
        h.update(number.to_be_bytes());
        h.update(etag.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

/// The ETag S3 gives the concatenation of parts with these ETags, or None
/// if one is not an MD5 in hex.
fn multipart_etag(parts: &[(u32, String)]) -> Option<String> {
    let mut md5s = Vec::with_capacity(16 * parts.len());
    for (_, etag) in parts {
        let digest = hex::decode(etag).ok().filter(|d| d.len() == 16)?;
        md5s.extend_from_slice(&digest);
    }
    Some(format!(
        "{}-{}",
        hex::encode(Md5::digest(&md5s)),
        parts.len()
    ))
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum UploadError {
    #[error("the specified multipart upload does not exist")]
    NoSuchUpload,
    #[error("part {0} was not uploaded or its ETag does not match")]
    InvalidPart(u32),
    #[error("the list of parts was not in ascending order")]
    InvalidPartOrder,
    #[error("part {0} is smaller than the 5 MiB minimum for all parts but the last")]
    EntityTooSmall(u32),
    #[error("the completed object would need {0} extents, more than one record can list")]
    TooManyExtents(usize),
    #[error("a completion must list at least one part")]
    NoParts,
    #[error("{0}")]
    ChecksumChoice(String),
    #[error("the upload was created with the {chosen} checksum algorithm, not {sent}")]
    ChecksumAlgorithm {
        chosen: &'static str,
        sent: &'static str,
    },
    #[error("the upload was created with the {chosen} checksum type, not {sent}")]
    ChecksumType {
        chosen: &'static str,
        sent: &'static str,
    },
    #[error("part {0} was uploaded without the upload's checksum; upload it again")]
    PartChecksumMissing(u32),
    #[error("the checksum listed for part {0} is not the part's")]
    PartChecksum(u32),
    #[error("the {0} checksum you specified did not match the calculated checksum")]
    ObjectChecksum(&'static str),
    #[error("x-amz-mp-object-size is {sent}, but the parts hold {actual} bytes")]
    ObjectSize { sent: u64, actual: u64 },
}

/// What a CompleteMultipartUpload asks to be checked beyond its parts'
/// ETags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompletionChecks {
    /// For each listed part, in order, the checksums the client lists for
    /// it (may be shorter than the part list). Each is checked against the
    /// part's stored checksum of its algorithm, if the part has one.
    pub part_checksums: Vec<Vec<(Algorithm, String)>>,
    /// The whole object's checksum (x-amz-checksum-*); a COMPOSITE value
    /// may carry its `-N`.
    pub object: Option<(Algorithm, String)>,
    /// x-amz-checksum-type.
    pub kind: Option<ChecksumType>,
    /// x-amz-mp-object-size.
    pub size_bytes: Option<u64>,
}

/// A completed upload.
#[derive(Debug, Clone)]
pub struct CompletedObject {
    pub info: ObjectInfo,
    /// The version written (None: the null version).
    pub version: Option<u64>,
    /// The object's checksum, when the upload chose an algorithm.
    pub checksum: Option<(Algorithm, String)>,
}

/// Part records a completion or a listing reads at once.
const READS_IN_FLIGHT_MAX: usize = 32;

/// Refuses a completion whose `x-amz-mp-object-size` is not the parts'.
fn check_size(checks: &CompletionChecks, actual: u64) -> Result<()> {
    match checks.size_bytes {
        Some(sent) if sent != actual => Err(UploadError::ObjectSize { sent, actual }.into()),
        _ => Ok(()),
    }
}

/// The checksum a completion names for an upload created without one: the
/// algorithm of its `x-amz-checksum-*` header, with the type named or
/// implied by the value (`-N`: COMPOSITE). It is verified and kept if every
/// part carries a checksum of that algorithm.
fn named_checksum(checks: &CompletionChecks) -> Result<Option<UploadChecksum>> {
    let Some((algorithm, value)) = &checks.object else {
        return match checks.kind {
            None => Ok(None),
            Some(_) => Err(UploadError::ChecksumChoice(
                "x-amz-checksum-type needs an x-amz-checksum-* header with the object's checksum, or an upload created with x-amz-checksum-algorithm".into(),
            )
            .into()),
        };
    };
    let kind = checks
        .kind
        .unwrap_or(if value.contains('-') || !algorithm.is_crc() {
            ChecksumType::Composite
        } else {
            ChecksumType::FullObject
        });
    UploadChecksum::new(*algorithm, Some(kind))
        .map(Some)
        .map_err(|e| UploadError::ChecksumChoice(e).into())
}

/// Whether `key` belongs to the reserved (multipart) namespace.
pub fn is_internal_key(key: &str) -> bool {
    key.starts_with('\0')
}

/// Stored header of a completed multipart object: its part sizes, as runs
/// `size*count` joined by commas (`5242880*19,1000`), for GET/HEAD with
/// `partNumber`. Never sent to clients (`is_reserved_header`).
pub const PARTS_HEADER: &str = "x-percore-parts";
/// Longest `PARTS_HEADER` stored (a header value is at most 64 KiB); parts
/// of sizes too varied to fit are not recorded.
const PARTS_HEADER_BYTES_MAX: usize = 16 * 1024;

/// Whether a stored header is percore's own, not the object's.
pub fn is_reserved_header(name: &str) -> bool {
    name.starts_with("x-percore-")
}

/// `PARTS_HEADER`'s value for parts of these sizes.
pub fn encode_part_sizes(sizes: &[u64]) -> String {
    let mut runs: Vec<(u64, u32)> = Vec::new();
    for &s in sizes {
        match runs.last_mut() {
            Some((size, n)) if *size == s => *n += 1,
            _ => runs.push((s, 1)),
        }
    }
    let runs: Vec<String> = runs.iter().map(|(s, n)| format!("{s}*{n}")).collect();
    runs.join(",")
}

/// Part `number` (from 1) of an object with `PARTS_HEADER` `value`:
/// (offset, length, parts count); None if there is no such part or the
/// value is not one percore wrote.
pub fn part_range(value: &str, number: u32) -> Option<(u64, u64, u32)> {
    let mut offset = 0u64;
    let mut count = 0u32;
    let mut found = None;
    for run in value.split(',') {
        let (size, n) = run.split_once('*')?;
        let (size, n): (u64, u32) = (size.parse().ok()?, n.parse().ok()?);
        if found.is_none() && number > count && number <= count.checked_add(n)? {
            let at = offset.checked_add(size.checked_mul(u64::from(number - count - 1))?)?;
            found = Some((at, size));
        }
        offset = offset.checked_add(size.checked_mul(u64::from(n))?)?;
        count = count.checked_add(n)?;
    }
    found.map(|(at, len)| (at, len, count))
}

pub fn valid_upload_id(id: &str) -> bool {
    id.len() == UPLOAD_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn upload_key(key: &str, upload_id: &str) -> String {
    format!("{UPLOAD_PREFIX}{key}\0{upload_id}")
}

fn parts_prefix(key: &str, upload_id: &str) -> String {
    format!("{PART_PREFIX}{key}\0{upload_id}\0")
}

pub fn part_key(key: &str, upload_id: &str, part: u32) -> String {
    format!("{}{part:05}", parts_prefix(key, upload_id))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartItem {
    pub number: u32,
    pub size_bytes: u64,
    pub etag: Box<str>,
    pub mtime_ms: u64,
    /// Its checksum of the upload's algorithm (`mpu_parts_with_checksums`).
    pub checksum: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadItem {
    pub key: String,
    pub upload_id: String,
    pub initiated_ms: u64,
    pub checksum: Option<UploadChecksum>,
}

fn new_upload_id() -> String {
    let v: u128 = rand::random();
    format!("{v:032x}")
}

impl Store {
    /// Starts an upload; `meta` (content type, stored headers) is what the
    /// completed object will carry.
    pub async fn mpu_create(&self, bucket: &str, key: &str, meta: ObjectMeta) -> Result<String> {
        self.mpu_create_with_checksum(bucket, key, meta, None).await
    }

    /// `mpu_create`, with the checksum every part carries and the completed
    /// object gets (kept as the upload record's ETag; see `checksum`).
    pub async fn mpu_create_with_checksum(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        checksum: Option<UploadChecksum>,
    ) -> Result<String> {
        let upload_id = new_upload_id();
        let mut meta = meta;
        meta.etag = checksum.map(UploadChecksum::encode).unwrap_or_default();
        meta.mtime_ms = now_ms();
        self.put(bucket, &upload_key(key, &upload_id), meta, Bytes::new())
            .await?;
        Ok(upload_id)
    }

    fn upload_live(&self, bucket: &str, key: &str, upload_id: &str) -> bool {
        if !valid_upload_id(upload_id) {
            return false;
        }
        let upload = upload_key(key, upload_id);
        self.head(bucket, &upload).is_some() && !self.upload_ending(bucket, &upload)
    }

    /// The checksum the upload was created with (NoSuchUpload if it is not
    /// in progress).
    pub fn mpu_checksum(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<Option<UploadChecksum>> {
        if !self.upload_live(bucket, key, upload_id) {
            return Err(UploadError::NoSuchUpload.into());
        }
        let info = self
            .head(bucket, &upload_key(key, upload_id))
            .ok_or(UploadError::NoSuchUpload)?;
        Ok(UploadChecksum::decode(&info.etag))
    }

    pub(super) fn upload_ending(&self, bucket: &str, upload: &str) -> bool {
        self.inner
            .marks
            .uploads_ending
            .borrow()
            .contains(&(bucket.to_string(), upload.to_string()))
    }

    /// Starts a streamed part; `finish` installs it only if the upload is
    /// still in progress then. Uploading a part number again replaces it.
    pub fn put_part_stream(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
    ) -> Result<PutWriter> {
        if !(1..=PART_NUMBER_MAX).contains(&part) {
            return Err(StoreError::Invalid(format!(
                "part number {part} is outside 1..={PART_NUMBER_MAX}"
            )));
        }
        if !self.upload_live(bucket, key, upload_id) {
            return Err(UploadError::NoSuchUpload.into());
        }
        let mut w = self.put_stream(
            bucket,
            &part_key(key, upload_id, part),
            ObjectMeta::default(),
        );
        w.part_of = Some(upload_key(key, upload_id));
        Ok(w)
    }

    /// Live parts of an upload with numbers above `after`, at most `limit`.
    pub fn mpu_parts(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        after: u32,
        limit: usize,
    ) -> Result<Vec<PartItem>> {
        if !self.upload_live(bucket, key, upload_id) {
            return Err(UploadError::NoSuchUpload.into());
        }
        let prefix = parts_prefix(key, upload_id);
        let start = format!("{prefix}{:05}", after.saturating_add(1));
        let index = self.inner.index.borrow();
        let Some(keys) = index.get(bucket) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (k, entry) in keys.range(start..) {
            let Some(number) = k.strip_prefix(&prefix) else {
                break;
            };
            if out.len() >= limit {
                break;
            }
            let (State::Live(info), Ok(number)) = (&entry.state, number.parse::<u32>()) else {
                continue;
            };
            out.push(PartItem {
                number,
                size_bytes: info.size_bytes,
                etag: info.etag.clone(),
                mtime_ms: info.mtime_ms,
                checksum: None,
            });
        }
        Ok(out)
    }

    /// `mpu_parts`, with the upload's checksum choice and, when it made
    /// one, each part's checksum (read from the part's record).
    pub async fn mpu_parts_with_checksums(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        after: u32,
        limit: usize,
    ) -> Result<(Vec<PartItem>, Option<UploadChecksum>)> {
        let chosen = self.mpu_checksum(bucket, key, upload_id)?;
        let mut parts = self.mpu_parts(bucket, key, upload_id, after, limit)?;
        let Some(chosen) = chosen else {
            return Ok((parts, None));
        };
        for batch in parts.chunks_mut(READS_IN_FLIGHT_MAX) {
            let reads = batch.iter().map(|p| {
                let part = part_key(key, upload_id, p.number);
                async move { self.open_read(bucket, &part).await }
            });
            let readers = futures::future::join_all(reads).await;
            for (p, reader) in batch.iter_mut().zip(readers) {
                // A part gone meanwhile is listed without one; one
                // uploaded again is listed as the record read.
                let Ok(reader) = reader else { continue };
                p.etag = reader.meta.etag.as_str().into();
                p.size_bytes = reader.meta.size_bytes;
                p.mtime_ms = reader.meta.mtime_ms;
                p.checksum = reader
                    .meta
                    .headers
                    .iter()
                    .find(|(n, _)| n == chosen.algorithm.header())
                    .map(|(_, v)| v.clone());
            }
        }
        Ok((parts, Some(chosen)))
    }

    /// Uploads in progress whose key starts with `prefix`, ordered by key
    /// then upload id, strictly after (`key_marker`, `upload_id_marker`).
    pub fn mpu_list(
        &self,
        bucket: &str,
        prefix: &str,
        key_marker: &str,
        upload_id_marker: &str,
        limit: usize,
    ) -> Vec<UploadItem> {
        let index = self.inner.index.borrow();
        let Some(keys) = index.get(bucket) else {
            return Vec::new();
        };
        let from = format!("{UPLOAD_PREFIX}{}", prefix.max(key_marker));
        let scan_prefix = format!("{UPLOAD_PREFIX}{prefix}");
        let mut out = Vec::new();
        for (k, entry) in keys.range(from..) {
            if !k.starts_with(&scan_prefix) || out.len() >= limit {
                break;
            }
            let State::Live(info) = &entry.state else {
                continue;
            };
            let Some((key, id)) = k[UPLOAD_PREFIX.len()..].rsplit_once('\0') else {
                continue;
            };
            if (key, id) <= (key_marker, upload_id_marker)
                || (upload_id_marker.is_empty() && key == key_marker)
            {
                continue;
            }
            out.push(UploadItem {
                key: key.to_string(),
                upload_id: id.to_string(),
                initiated_ms: info.mtime_ms,
                checksum: UploadChecksum::decode(&info.etag),
            });
        }
        out
    }

    /// Makes `key` the concatenation of the listed parts (number, ETag
    /// without quotes) without copying their bytes, then ends the upload.
    pub async fn mpu_complete(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
    ) -> Result<ObjectInfo> {
        let checks = CompletionChecks::default();
        self.mpu_complete_version(bucket, key, upload_id, parts, &checks, false)
            .await
            .map(|done| done.info)
    }

    /// `mpu_complete`, checking `checks`; with `new_version` the object is
    /// a new real version (`versions`).
    pub async fn mpu_complete_version(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        checks: &CompletionChecks,
        new_version: bool,
    ) -> Result<CompletedObject> {
        if !valid_upload_id(upload_id) {
            return Err(UploadError::NoSuchUpload.into());
        }
        let upload_index_key = upload_key(key, upload_id);
        self.completion_ended(bucket, &upload_index_key).await;
        if !self.upload_live(bucket, key, upload_id) {
            // Perhaps a retry of a completion that succeeded.
            let (seq, info, version) = self
                .completed_before(bucket, key, upload_id, parts)
                .ok_or(UploadError::NoSuchUpload)?;
            let checksum = self.current_checksum(bucket, key, seq).await;
            return Ok(CompletedObject {
                info,
                version,
                checksum,
            });
        }
        // Nothing awaited since the check: from here a concurrent Complete
        // or Abort of this upload waits for this one to end.
        let completing = (bucket.to_string(), upload_index_key);
        self.inner
            .mpu
            .completing
            .borrow_mut()
            .insert(completing.clone(), Vec::new());
        let _completing = CompletingGuard {
            store: self,
            id: completing,
        };
        if parts.is_empty() {
            return Err(UploadError::NoParts.into());
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(UploadError::InvalidPartOrder.into());
        }
        let upload = self.open_read(bucket, &upload_key(key, upload_id)).await?;
        let mut meta = ObjectMeta::clone(&upload.meta);
        drop(upload);
        let created = UploadChecksum::decode(&meta.etag);
        let chosen = match created {
            Some(c) => Some(c),
            None => named_checksum(checks)?,
        };
        if chosen.is_some() {
            // What the index can refuse, before a record is read per part.
            let mut scratch = meta.clone();
            self.completion_extents(bucket, key, upload_id, parts, &mut scratch)?;
            check_size(checks, scratch.size_bytes)?;
        }
        let summed = match chosen {
            // Checksums listed for the parts of an upload without one are
            // not checked (a part may carry one of any algorithm).
            None => None,
            Some(c) => {
                let required = created.is_some();
                self.part_checksums(bucket, key, upload_id, parts, c, checks, required)
                    .await?
            }
        };
        // From here to the append nothing awaits: the parts read are the
        // parts written, and their segments are pinned against compaction.
        let extents = self.completion_extents(bucket, key, upload_id, parts, &mut meta)?;
        check_size(checks, meta.size_bytes)?;
        let checksum = match (chosen, summed) {
            (Some(c), Some(summed)) => Some(
                self.object_checksum(bucket, key, upload_id, parts, c, &summed, checks, &mut meta)?,
            ),
            _ => None,
        };
        let _writing = self.start_writing(bucket, key);
        let (seq, info) = self
            .write_completed(bucket, key, meta, extents, new_version)
            .await?;
        // Before the upload ends: from then on a retry is answered from here.
        self.inner.mpu.completed.borrow_mut().remember(
            bucket,
            &upload_key(key, upload_id),
            Completed {
                parts_digest: parts_digest(parts),
                seq,
            },
        );
        self.end_upload(bucket, key, upload_id, false).await?;
        let id = self.version_id(seq, info.stamp);
        Ok(CompletedObject {
            info,
            version: new_version.then_some(id),
            checksum,
        })
    }

    /// Each listed part's raw digest of the upload's algorithm, its length
    /// and the seq of the record read, checking the digests the client
    /// lists. Parts are read in batches (a part's checksum is in its
    /// record, not in the index). Unless `required`, a part without a
    /// digest of that algorithm makes it None.
    #[allow(clippy::too_many_arguments)]
    async fn part_checksums(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        chosen: UploadChecksum,
        checks: &CompletionChecks,
        required: bool,
    ) -> Result<Option<Vec<(Vec<u8>, u64, u64)>>> {
        let algorithm = chosen.algorithm;
        let mut out = Vec::with_capacity(parts.len());
        for (batch_index, batch) in parts.chunks(READS_IN_FLIGHT_MAX).enumerate() {
            let reads = batch.iter().map(|(number, _)| {
                let part = part_key(key, upload_id, *number);
                async move { self.open_read(bucket, &part).await }
            });
            let readers = futures::future::join_all(reads).await;
            for (i, ((number, etag), reader)) in batch.iter().zip(readers).enumerate() {
                let reader = match reader {
                    Ok(r) if *r.meta.etag == **etag => r,
                    Ok(_) | Err(StoreError::NotFound) => {
                        return Err(UploadError::InvalidPart(*number).into())
                    }
                    Err(e) => return Err(e),
                };
                let stored = |a: Algorithm| {
                    reader
                        .meta
                        .headers
                        .iter()
                        .find(|(n, _)| n == a.header())
                        .and_then(|(_, v)| a.decode(v))
                };
                let Some(raw) = stored(algorithm) else {
                    if required {
                        return Err(UploadError::PartChecksumMissing(*number).into());
                    }
                    return Ok(None);
                };
                // Listed checksums of other algorithms (a part may carry
                // two) are checked where the part has one of theirs.
                let listed = checks
                    .part_checksums
                    .get(batch_index * READS_IN_FLIGHT_MAX + i)
                    .map_or(&[][..], Vec::as_slice);
                for (a, value) in listed {
                    if let Some(mine) = stored(*a) {
                        if a.decode(value).as_ref() != Some(&mine) {
                            return Err(UploadError::PartChecksum(*number).into());
                        }
                    }
                }
                out.push((raw, reader.meta.size_bytes, reader.seq));
            }
        }
        Ok(Some(out))
    }

    /// The completed object's checksum from its parts' (read before, by
    /// `part_checksums`: each must still be that record), checked against
    /// what the client sent and added to `meta`'s headers.
    #[allow(clippy::too_many_arguments)]
    fn object_checksum(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        chosen: UploadChecksum,
        summed: &[(Vec<u8>, u64, u64)],
        checks: &CompletionChecks,
        meta: &mut ObjectMeta,
    ) -> Result<(Algorithm, String)> {
        for ((number, _), (_, _, seq)) in parts.iter().zip(summed) {
            let same = self
                .lookup(bucket, &part_key(key, upload_id, *number))
                .is_some_and(|e| e.seq == *seq);
            if !same {
                return Err(StoreError::Invalid(
                    "a part was uploaded again during completion; retry".into(),
                ));
            }
        }
        if let Some(sent) = checks.kind.filter(|k| *k != chosen.kind) {
            return Err(UploadError::ChecksumType {
                chosen: chosen.kind.name(),
                sent: sent.name(),
            }
            .into());
        }
        let algorithm = chosen.algorithm;
        let digests: Vec<(Vec<u8>, u64)> = summed
            .iter()
            .map(|(raw, len, _)| (raw.clone(), *len))
            .collect();
        let value = chosen.complete(&digests);
        if let Some((sent_algorithm, sent)) = &checks.object {
            if *sent_algorithm != algorithm {
                return Err(UploadError::ChecksumAlgorithm {
                    chosen: algorithm.name(),
                    sent: sent_algorithm.name(),
                }
                .into());
            }
            // A COMPOSITE value may be sent with or without its `-N`;
            // values are compared as digests, not as base64 text.
            let digest = |v: &str| {
                let (v, count) = v.trim().split_once('-').unwrap_or((v.trim(), ""));
                algorithm.decode(v).map(|raw| (raw, count.to_string()))
            };
            let matches = match (digest(sent), digest(&value)) {
                (Some((sent, sent_count)), Some((mine, count))) => {
                    sent == mine && (sent_count.is_empty() || sent_count == count)
                }
                _ => false,
            };
            if !matches {
                return Err(UploadError::ObjectChecksum(algorithm.name()).into());
            }
        }
        meta.headers
            .retain(|(n, _)| !n.starts_with(super::checksum::HEADER_PREFIX));
        meta.headers
            .push((algorithm.header().to_string(), value.clone()));
        if meta.headers.len() >= record::HEADERS_COUNT_MAX {
            // The part sizes give way: the slot is for tags.
            meta.headers.retain(|(n, _)| n != PARTS_HEADER);
        }
        Ok((algorithm, value))
    }

    /// The checksum stored with the key's current version if it is still
    /// the record `seq`.
    async fn current_checksum(
        &self,
        bucket: &str,
        key: &str,
        seq: u64,
    ) -> Option<(Algorithm, String)> {
        let found = self.version_to_read(bucket, key, Pick::Current).ok()?;
        let reader = self.open_read(bucket, &found.index_key).await.ok()?;
        if reader.seq != seq {
            return None;
        }
        reader.meta.headers.iter().find_map(|(n, v)| {
            Algorithm::ALL
                .into_iter()
                .find(|a| a.header() == n)
                .map(|a| (a, v.clone()))
        })
    }

    /// Appends the completed object's record (a new seq, the parts'
    /// extents) with their segments pinned, and installs it unless a part
    /// moved meanwhile. Returns its seq and what the index holds. With
    /// `new_version` the record is a new real version of `key`.
    pub(super) async fn write_completed(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        extents: Vec<ExtentRef>,
        new_version: bool,
    ) -> Result<(u64, ObjectInfo)> {
        let mut meta = meta;
        let size_bytes = meta.size_bytes;
        // No await between the stamp and the seq: both order this write.
        let stamp = self.issue_stamp(bucket, key, &mut meta, None);
        let seq = self.take_seq()?;
        let index_key = if new_version {
            version_key(key, self.version_id(seq, stamp))
        } else {
            key.to_string()
        };
        let key = index_key.as_str();
        let header = Header {
            seq,
            bucket: bucket.into(),
            key: key.into(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body: Body::Object {
                meta: meta.clone(),
                extents: extents.clone(),
            },
        };
        let header = record::encode_header(&header)
            .map_err(|_| UploadError::TooManyExtents(extents.len()))?;
        let pinned = self.pin_all(&extents);
        let written = self.append_durable(header, Bytes::new()).await;
        let vanished = self.missing_segment(&extents).is_some();
        let unpin = |store: &Store| {
            for &s in &pinned {
                store.unpin(s);
            }
        };
        let loc = match written {
            Ok(loc) => loc,
            Err(e) => {
                unpin(self);
                return Err(e);
            }
        };
        if vanished {
            unpin(self);
            // Compaction moved a part away before the pin took hold; the
            // record stays unused on disk (recovery drops it too).
            self.count_stale(bucket, key);
            return Err(StoreError::Invalid(
                "a part moved during completion; retry".into(),
            ));
        }
        let info = ObjectInfo {
            size_bytes,
            etag: meta.etag.into(),
            mtime_ms: meta.mtime_ms,
            stamp,
            extents: extents.into(),
        };
        self.install(
            bucket,
            key,
            Entry {
                seq,
                loc,
                state: State::Live(info.clone()),
                older_on_disk: 0,
            },
        );
        // Installed: compaction now sees the object as an owner of these
        // extents; only now may the segments be compacted.
        unpin(self);
        Ok((seq, info))
    }

    /// Pins every segment holding one of `extents` (once each); returns
    /// them, for unpinning.
    fn pin_all(&self, extents: &[ExtentRef]) -> Vec<u64> {
        let mut pinned: Vec<u64> = extents.iter().map(|e| e.segment_id).collect();
        pinned.sort_unstable();
        pinned.dedup();
        for &s in &pinned {
            self.pin(s);
        }
        pinned
    }

    /// The extents of the listed parts, in order; sets `meta`'s ETag (the
    /// MD5 of the parts' MD5s, dash, count), size and mtime. Refuses a part
    /// that is not live with that ETag, or one too small but the last.
    fn completion_extents(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        meta: &mut ObjectMeta,
    ) -> Result<Vec<ExtentRef>> {
        let mut extents = Vec::new();
        let mut md5s = Vec::with_capacity(16 * parts.len());
        let mut size_bytes = 0u64;
        let mut sizes = Vec::with_capacity(parts.len());
        for (i, (number, etag)) in parts.iter().enumerate() {
            let info = self
                .head(bucket, &part_key(key, upload_id, *number))
                .filter(|info| *info.etag == *etag)
                .ok_or(UploadError::InvalidPart(*number))?;
            if i + 1 < parts.len() && info.size_bytes < PART_BYTES_MIN {
                return Err(UploadError::EntityTooSmall(*number).into());
            }
            let digest = hex::decode(&*info.etag).map_err(|_| UploadError::InvalidPart(*number))?;
            md5s.extend_from_slice(&digest);
            extents.extend_from_slice(&info.extents);
            size_bytes += info.size_bytes;
            sizes.push(info.size_bytes);
        }
        let runs = encode_part_sizes(&sizes);
        meta.headers.retain(|(n, _)| n != PARTS_HEADER);
        // Leaves a slot for tags (PutObjectTagging adds a header).
        if runs.len() <= PARTS_HEADER_BYTES_MAX
            && meta.headers.len() + 2 <= record::HEADERS_COUNT_MAX
        {
            meta.headers.push((PARTS_HEADER.to_string(), runs));
        }
        meta.etag = format!("{}-{}", hex::encode(Md5::digest(&md5s)), parts.len());
        meta.size_bytes = size_bytes;
        meta.mtime_ms = now_ms();
        Ok(extents)
    }

    /// Waits until no completion of `upload` (its index key) is under way.
    async fn completion_ended(&self, bucket: &str, upload: &str) {
        loop {
            let rx = {
                let mut completing = self.inner.mpu.completing.borrow_mut();
                let Some(waiters) = completing.get_mut(&(bucket.to_string(), upload.to_string()))
                else {
                    return;
                };
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                rx
            };
            let _ = rx.await;
        }
    }

    /// The key's current version (its seq, info and version), if it is
    /// what completing `upload_id` with exactly `parts` wrote (see the
    /// module documentation).
    fn completed_before(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
    ) -> Option<(u64, ObjectInfo, Option<u64>)> {
        let current = self.resolve(bucket, key, Pick::Current)?;
        let (current_seq, info) = self.current_live(bucket, key)?;
        let info = (current_seq, info, current.version);
        let upload = upload_key(key, upload_id);
        let remembered = self.inner.mpu.completed.borrow().get(bucket, &upload);
        if let Some(done) = remembered {
            return (done.seq == current_seq && done.parts_digest == parts_digest(parts))
                .then_some(info);
        }
        // Forgotten, or completed before a restart: the upload's tombstone
        // is newer than the object its completion wrote, and older than
        // anything written to the key since.
        let ended = self.lookup(bucket, &upload)?;
        if !matches!(ended.state, State::Deleted { .. }) || ended.seq < current_seq {
            return None;
        }
        (multipart_etag(parts)? == *info.1.etag).then_some(info)
    }

    /// Drops an upload and its parts.
    pub async fn mpu_abort(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        if valid_upload_id(upload_id) {
            // Aborting an upload being completed: NoSuchUpload once it has
            // (as for any completed upload), an abort if it failed.
            self.completion_ended(bucket, &upload_key(key, upload_id))
                .await;
        }
        if !self.upload_live(bucket, key, upload_id) {
            return Err(UploadError::NoSuchUpload.into());
        }
        self.end_upload(bucket, key, upload_id, true).await
    }

    /// Drops every upload and part of `bucket` held here, because the
    /// bucket was deleted (or is being created again over leftovers of a
    /// deletion cut short). Returns how many records were dropped.
    pub async fn mpu_purge_bucket(&self, bucket: &str) -> Result<usize> {
        // Taken before anything is awaited, so a caller that has just made
        // the bucket invisible knows these are all there are.
        let uploads = self.live_keys_with_prefix(bucket, UPLOAD_PREFIX);
        let parts = self.live_keys_with_prefix(bucket, PART_PREFIX);
        self.inner.mpu.completed.borrow_mut().forget_bucket(bucket);
        if uploads.is_empty() && parts.is_empty() {
            return Ok(0);
        }
        // No part is installed for these uploads from here on.
        let ending: Vec<(String, String)> = uploads
            .iter()
            .map(|u| (bucket.to_string(), u.clone()))
            .filter(|e| !self.inner.marks.uploads_ending.borrow().contains(e))
            .collect();
        self.inner
            .marks
            .uploads_ending
            .borrow_mut()
            .extend(ending.iter().cloned());
        let dropped = uploads.len() + parts.len();
        let mut keys = uploads;
        keys.extend(parts);
        let result = self.write_tombstones(bucket, keys).await;
        let mut ends = self.inner.marks.uploads_ending.borrow_mut();
        for e in &ending {
            ends.remove(e);
        }
        result.map(|()| dropped)
    }

    /// Buckets with multipart state (uploads or parts) on this shard.
    pub fn mpu_buckets(&self) -> Vec<String> {
        let index = self.inner.index.borrow();
        index
            .iter()
            .filter(|(_, keys)| {
                keys.range("\0".to_string()..)
                    .take_while(|(k, _)| is_internal_key(k))
                    .any(|(_, e)| matches!(e.state, State::Live(_)))
            })
            .map(|(bucket, _)| bucket.clone())
            .collect()
    }

    /// Tombstones the parts and the upload record, written as one batch.
    /// When aborting, the upload goes first so that a part finishing
    /// meanwhile is refused.
    async fn end_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        upload_first: bool,
    ) -> Result<()> {
        let upload = upload_key(key, upload_id);
        // From here no part of this upload is installed (PutWriter::finish
        // checks), so the parts listed below are all there will be.
        let ending = (bucket.to_string(), upload.clone());
        self.inner
            .marks
            .uploads_ending
            .borrow_mut()
            .insert(ending.clone());
        let prefix = parts_prefix(key, upload_id);
        let mut keys = self.live_keys_with_prefix(bucket, &prefix);
        if upload_first {
            keys.insert(0, upload);
        } else {
            keys.push(upload);
        }
        let result = self.write_tombstones(bucket, keys).await;
        self.inner.marks.uploads_ending.borrow_mut().remove(&ending);
        result
    }

    fn live_keys_with_prefix(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let index = self.inner.index.borrow();
        let Some(keys) = index.get(bucket) else {
            return Vec::new();
        };
        keys.range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, e)| matches!(e.state, State::Live(_)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Tombstones for `keys`, queued together (one group commit when they
    /// fit) and installed once durable.
    pub(super) async fn write_tombstones(&self, bucket: &str, keys: Vec<String>) -> Result<()> {
        let mut pending = Vec::with_capacity(keys.len());
        for key in keys {
            let seq = self.take_seq()?;
            let stamp = now_ms();
            let header = Header {
                seq,
                bucket: bucket.into(),
                key: key.clone(),
                payload_bytes: 0,
                block_crcs: Vec::new(),
                body: Body::Tombstone { mtime_ms: stamp },
            };
            let header =
                record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
            debug_assert_eq!(Kind::Tombstone, Body::Tombstone { mtime_ms: 0 }.kind());
            pending.push((key, seq, stamp, self.append(header, Bytes::new()).await?));
        }
        let mut first_error = None;
        for (key, seq, stamp, rx) in pending {
            match rx.await.map_err(|_| StoreError::ShuttingDown) {
                Ok(Ok(loc)) => {
                    self.install(
                        bucket,
                        &key,
                        Entry {
                            seq,
                            loc,
                            state: State::Deleted { stamp },
                            older_on_disk: 0,
                        },
                    );
                }
                Ok(Err(e)) | Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// After recovery: tombstones part records whose upload is gone.
    pub(super) async fn sweep_orphan_parts(&self) -> Result<usize> {
        let orphans: Vec<(String, Vec<String>)> = {
            let index = self.inner.index.borrow();
            index
                .iter()
                .filter_map(|(bucket, keys)| {
                    let found: Vec<String> = keys
                        .range(PART_PREFIX.to_string()..)
                        .take_while(|(k, _)| k.starts_with(PART_PREFIX))
                        .filter(|(_, e)| matches!(e.state, State::Live(_)))
                        .filter(|(k, _)| {
                            let rest = &k[PART_PREFIX.len()..];
                            let Some((upload, _number)) = rest.rsplit_once('\0') else {
                                return true;
                            };
                            let Some((key, id)) = upload.rsplit_once('\0') else {
                                return true;
                            };
                            !matches!(
                                keys.get(&upload_key(key, id)).map(|e| &e.state),
                                Some(State::Live(_))
                            )
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    (!found.is_empty()).then(|| (bucket.clone(), found))
                })
                .collect()
        };
        let mut swept = 0;
        for (bucket, keys) in orphans {
            swept += keys.len();
            self.write_tombstones(&bucket, keys).await?;
        }
        Ok(swept)
    }
}

#[cfg(test)]
mod part_size_tests {
    use super::{encode_part_sizes, part_range};

    #[test]
    fn part_sizes_round_trip_as_runs() {
        let sizes = [5u64, 5, 5, 7, 7, 2];
        let v = encode_part_sizes(&sizes);
        assert_eq!(v, "5*3,7*2,2*1");
        let mut offset = 0;
        for (i, &s) in sizes.iter().enumerate() {
            assert_eq!(part_range(&v, i as u32 + 1), Some((offset, s, 6)));
            offset += s;
        }
        assert_eq!(part_range(&v, 0), None);
        assert_eq!(part_range(&v, 7), None);
        for bad in ["", "5", "5*", "x*1", "5*1,,2*1", "18446744073709551615*2"] {
            assert_eq!(part_range(bad, 1).and(part_range(bad, 2)), None, "{bad:?}");
        }
    }
}
