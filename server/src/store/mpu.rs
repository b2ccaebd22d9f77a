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

use bytes::Bytes;
use md5::{Digest, Md5};
use thiserror::Error;

use super::record::{self, Body, Header, Kind, ObjectMeta};
use super::{now_ms, Entry, ObjectInfo, PutWriter, Result, State, Store, StoreError};

pub const PART_NUMBER_MAX: u32 = 10_000;
/// Every part but the last must be at least this large.
pub const PART_BYTES_MIN: u64 = 5 << 20;
const UPLOAD_PREFIX: &str = "\0u/";
const PART_PREFIX: &str = "\0p/";
/// Upload ids are 32 lower-case hex digits.
const UPLOAD_ID_LEN: usize = 32;

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
}

/// Whether `key` belongs to the reserved (multipart) namespace.
pub fn is_internal_key(key: &str) -> bool {
    key.starts_with('\0')
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadItem {
    pub key: String,
    pub upload_id: String,
    pub initiated_ms: u64,
}

fn new_upload_id() -> String {
    let v: u128 = rand::random();
    format!("{v:032x}")
}

impl Store {
    /// Starts an upload; `meta` (content type, stored headers) is what the
    /// completed object will carry.
    pub async fn mpu_create(&self, bucket: &str, key: &str, meta: ObjectMeta) -> Result<String> {
        let upload_id = new_upload_id();
        let mut meta = meta;
        meta.etag = String::new();
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

    pub(super) fn upload_ending(&self, bucket: &str, upload: &str) -> bool {
        self.inner
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
            });
        }
        Ok(out)
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
        if !self.upload_live(bucket, key, upload_id) {
            return Err(UploadError::NoSuchUpload.into());
        }
        if parts.is_empty() {
            return Err(UploadError::NoParts.into());
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(UploadError::InvalidPartOrder.into());
        }
        let upload = self.open_read(bucket, &upload_key(key, upload_id)).await?;
        let mut meta = upload.meta.clone();
        drop(upload);
        // From here to the append nothing awaits: the parts read are the
        // parts written, and their segments are pinned against compaction.
        let mut extents = Vec::new();
        let mut md5s = Vec::with_capacity(16 * parts.len());
        let mut size_bytes = 0u64;
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
        }
        meta.etag = format!("{}-{}", hex::encode(Md5::digest(&md5s)), parts.len());
        meta.size_bytes = size_bytes;
        meta.mtime_ms = now_ms();
        let _writing = self.start_writing(bucket, key);
        let seq = self.take_seq()?;
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
        let mut pinned: Vec<u64> = extents.iter().map(|e| e.segment_id).collect();
        pinned.sort_unstable();
        pinned.dedup();
        for &s in &pinned {
            self.pin(s);
        }
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
        self.end_upload(bucket, key, upload_id, false).await?;
        Ok(info)
    }

    /// Drops an upload and its parts.
    pub async fn mpu_abort(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        if !self.upload_live(bucket, key, upload_id) {
            return Err(UploadError::NoSuchUpload.into());
        }
        self.end_upload(bucket, key, upload_id, true).await
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
        self.inner.uploads_ending.borrow_mut().remove(&ending);
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
            let header = Header {
                seq,
                bucket: bucket.into(),
                key: key.clone(),
                payload_bytes: 0,
                block_crcs: Vec::new(),
                body: Body::Tombstone { mtime_ms: now_ms() },
            };
            let header =
                record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
            debug_assert_eq!(Kind::Tombstone, Body::Tombstone { mtime_ms: 0 }.kind());
            pending.push((key, seq, self.append(header, Bytes::new()).await?));
        }
        let mut first_error = None;
        for (key, seq, rx) in pending {
            match rx.await.map_err(|_| StoreError::ShuttingDown) {
                Ok(Ok(loc)) => {
                    self.install(
                        bucket,
                        &key,
                        Entry {
                            seq,
                            loc,
                            state: State::Deleted,
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
