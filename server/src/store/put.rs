//! PUT: `PutWriter` streams an object's bytes (inline, or as extents of
//! `chunk_bytes`), then `finish` checks the PUT's condition, appends the
//! object record and installs it. `WritingKey` marks keys with a version
//! between taking its seq and installing it.

use std::collections::VecDeque;

use bytes::Bytes;
use futures::channel::oneshot;

use super::index::{Entry, State};
use super::record::{self, Body, ExtentRef, Header, Kind, ObjectMeta};
use super::versions::version_key;
use super::{mpu, now_ms, Loc, ObjectInfo, PutCondition, Result, Store, StoreError};

/// Marks a key as being written until dropped (see `KeyMarks::writing`).
pub(super) struct WritingKey {
    pub(super) store: Store,
    pub(super) key: (String, String),
}

impl Drop for WritingKey {
    fn drop(&mut self) {
        let mut writing = self.store.inner.marks.writing.borrow_mut();
        if let Some(n) = writing.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                writing.remove(&self.key);
                self.store.inner.marks.stamps.borrow_mut().remove(&self.key);
            }
        }
    }
}

/// A streamed PUT in progress.
pub struct PutWriter {
    pub(super) store: Store,
    pub(super) bucket: String,
    pub(super) key: String,
    pub(super) meta: ObjectMeta,
    pub(super) buffer: Vec<u8>,
    /// A whole chunk handed in as one piece, kept without a copy until
    /// more bytes come (then it is written as an extent) or the body ends
    /// (then it may go inline). Never set while `buffer` holds bytes.
    pub(super) held: Option<Bytes>,
    pub(super) written_bytes: u64,
    pub(super) extents: Vec<ExtentRef>,
    pub(super) in_flight: VecDeque<(u64, oneshot::Receiver<Result<Loc>>)>,
    /// Segments pinned by this PUT's durable extents.
    pub(super) pinned: Vec<u64>,
    /// For a multipart part: the upload's index key, which must still be
    /// live when the part is installed. Parts always use extents.
    pub(super) part_of: Option<String>,
    pub(super) condition: Option<PutCondition>,
    /// Write a new real version (the bucket has versioning enabled) rather
    /// than the null version at the key itself.
    pub(super) new_version: bool,
}

impl Drop for PutWriter {
    fn drop(&mut self) {
        for segment_id in self.pinned.drain(..) {
            self.store.unpin(segment_id);
        }
    }
}

/// Extent writes in flight per PUT: enough to keep the disk busy.
pub(super) const PUT_EXTENTS_IN_FLIGHT_MAX: usize = 4;

impl PutWriter {
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn set_etag(&mut self, etag: String) {
        self.meta.etag = etag;
    }

    pub fn set_condition(&mut self, condition: PutCondition) {
        self.condition = Some(condition);
    }

    /// Headers known only once the body is in (a verified checksum).
    /// The object becomes a new real version (see `versions`).
    pub fn set_new_version(&mut self) {
        self.new_version = true;
    }

    pub fn add_headers(&mut self, headers: Vec<(String, String)>) {
        self.meta.headers.extend(headers);
    }

    pub fn written_bytes(&self) -> u64 {
        self.written_bytes
            + self.buffer.len() as u64
            + self.held.as_ref().map_or(0, |h| h.len() as u64)
    }

    pub async fn write(&mut self, mut data: Bytes) -> Result<()> {
        let chunk = self.store.inner.cfg.chunk_bytes as usize;
        if !data.is_empty() {
            if let Some(held) = self.held.take() {
                self.write_extent(held).await?;
            }
        }
        while !data.is_empty() {
            if self.buffer.len() == chunk {
                let piece = Bytes::from(std::mem::take(&mut self.buffer));
                self.write_extent(piece).await?;
            }
            if self.buffer.is_empty() && data.len() >= chunk {
                // Whole chunks pass through without a staging copy; the
                // last one is held (it may be the object's only chunk,
                // which goes inline).
                let piece = data.split_to(chunk);
                if data.is_empty() {
                    self.held = Some(piece);
                    break;
                }
                self.write_extent(piece).await?;
                continue;
            }
            let take = (chunk - self.buffer.len()).min(data.len());
            if self.buffer.capacity() == 0 {
                self.buffer.reserve_exact(chunk.min(take.max(64 * 1024)));
            }
            self.buffer.extend_from_slice(&data.split_to(take));
        }
        Ok(())
    }

    pub(super) async fn write_extent(&mut self, piece: Bytes) -> Result<()> {
        while self.in_flight.len() >= PUT_EXTENTS_IN_FLIGHT_MAX {
            self.collect_one().await?;
        }
        let object_offset = self.written_bytes;
        let header = Header {
            seq: 0,
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            payload_bytes: piece.len() as u64,
            block_crcs: record::block_crcs(&piece),
            body: Body::Extent { object_offset },
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        self.written_bytes += piece.len() as u64;
        let rx = self.store.append(header, piece).await?;
        self.in_flight.push_back((object_offset, rx));
        Ok(())
    }

    pub(super) async fn collect_one(&mut self) -> Result<()> {
        let (_, rx) = self.in_flight.pop_front().expect("in flight");
        let loc = rx.await.map_err(|_| StoreError::ShuttingDown)??;
        self.store.pin(loc.segment_id);
        self.pinned.push(loc.segment_id);
        self.extents.push(ExtentRef {
            segment_id: loc.segment_id,
            record_offset: loc.offset,
            header_bytes: loc.header_bytes,
            payload_bytes: loc.payload_bytes,
        });
        Ok(())
    }

    /// Makes the object durable and visible. `meta.size_bytes` is set here;
    /// `meta.etag` must be set by the caller.
    pub async fn finish(self) -> Result<ObjectInfo> {
        self.finish_version().await.map(|(info, _)| info)
    }

    /// `finish`, also returning the version written: Some(seq) for a new
    /// real version, None for the null version.
    pub async fn finish_version(mut self) -> Result<(ObjectInfo, Option<u64>)> {
        let (payload, size_bytes) = self.finish_body().await?;
        let store = self.store.clone();
        self.meta.size_bytes = size_bytes;
        if self.meta.mtime_ms == 0 {
            self.meta.mtime_ms = now_ms();
        }
        let preset = self.condition.as_ref().and_then(PutCondition::preset_stamp);
        let seen = match &self.condition {
            // One conditional write of a key at a time (a replica's copies
            // included): no refused record may carry a higher seq than the
            // version that won, which recovery would bring back.
            Some(_) if store.is_writing(&self.bucket, &self.key) => {
                return Err(StoreError::ConditionalConflict);
            }
            // A replica's copy (checked again before it is installed).
            Some(c) if c.preset_stamp().is_some() => {
                if !c.stamp_allows(store.key_stamp(&self.bucket, &self.key)) {
                    return Err(StoreError::PreconditionFailed);
                }
                None
            }
            Some(c) => Some(store.check_put_condition(&self.bucket, &self.key, c)?),
            None => None,
        };
        let _writing = store.start_writing(&self.bucket, &self.key);
        // No await between the stamp and the seq: both order this write.
        let stamp = store.issue_stamp(&self.bucket, &self.key, &mut self.meta, preset);
        let seq = store.take_seq()?;
        let info = ObjectInfo {
            size_bytes,
            etag: self.meta.etag.clone().into(),
            mtime_ms: self.meta.mtime_ms,
            stamp,
            extents: self.extents.clone().into(),
        };
        let id = store.version_id(seq, stamp);
        let index_key = if self.new_version {
            version_key(&self.key, id)
        } else {
            self.key.clone()
        };
        let header = Header {
            seq,
            bucket: self.bucket.clone(),
            key: index_key.clone(),
            payload_bytes: payload.len() as u64,
            block_crcs: record::block_crcs(&payload),
            body: Body::Object {
                meta: self.meta.clone(),
                extents: self.extents.clone(),
            },
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = store.append_durable(header, payload).await?;
        if let Err(e) = self.still_installable(seen) {
            if self.new_version {
                // A version key of its own: nothing newer hides the record
                // at recovery but a tombstone (counted below, so that
                // compaction keeps it while the record exists).
                if let Err(t) = store
                    .write_tombstone(&self.bucket, &index_key, Kind::Tombstone)
                    .await
                {
                    tracing::error!(
                        bucket = %self.bucket,
                        key = %self.key,
                        "a refused version could not be hidden ({t}): it may reappear after a restart"
                    );
                }
            }
            // The record is on disk all the same: count it for the key.
            store.count_stale(&self.bucket, &index_key);
            return Err(e);
        }
        store.install(
            &self.bucket,
            &index_key,
            Entry {
                seq,
                loc,
                state: State::Live(info.clone()),
                older_on_disk: 0,
            },
        );
        Ok((info, self.new_version.then_some(id)))
    }

    /// Ends the body: an object that fits one chunk (and is no multipart
    /// part) is returned whole, to go inline in its record; otherwise the
    /// rest is written as an extent and every extent write is awaited.
    /// Returns (inline payload, object size).
    async fn finish_body(&mut self) -> Result<(Bytes, u64)> {
        let inline = self.extents.is_empty() && self.in_flight.is_empty() && self.part_of.is_none();
        if inline {
            let payload = match self.held.take() {
                Some(held) => held,
                None => Bytes::from(std::mem::take(&mut self.buffer)),
            };
            let size_bytes = payload.len() as u64;
            return Ok((payload, size_bytes));
        }
        if let Some(held) = self.held.take() {
            self.write_extent(held).await?;
        }
        if !self.buffer.is_empty() {
            let piece = Bytes::from(std::mem::take(&mut self.buffer));
            self.write_extent(piece).await?;
        }
        while !self.in_flight.is_empty() {
            self.collect_one().await?;
        }
        Ok((Bytes::new(), self.written_bytes))
    }

    /// Once the object's record is durable: whether it may still become
    /// the current version. `seen` is the version the PUT's condition was
    /// checked against, if it had one.
    fn still_installable(&self, seen: Option<Option<u64>>) -> Result<()> {
        let store = &self.store;
        // An extent made durable just before its segment was pinned could
        // have been compacted away: then this version must not become visible
        // (recovery drops it too, its extents being gone).
        if let Some(missing) = store.missing_segment(&self.extents) {
            return Err(StoreError::Invalid(format!(
                "extent segment {missing} vanished during the PUT; retry"
            )));
        }
        // A replica's copy: another version arrived meanwhile.
        if let Some(c) = &self.condition {
            if !c.stamp_allows(store.key_stamp(&self.bucket, &self.key)) {
                return Err(StoreError::PreconditionFailed);
            }
        }
        // Another write won the race since the condition was checked.
        if let Some(seen) = seen {
            let now = store.live_seq(&self.bucket, &self.key);
            if now != seen {
                return Err(StoreError::PreconditionFailed);
            }
        }
        // A part whose upload was aborted or completed meanwhile stays
        // invisible (start-up sweeps such records, see `mpu`).
        if let Some(upload) = &self.part_of {
            if store.head(&self.bucket, upload).is_none()
                || store.upload_ending(&self.bucket, upload)
            {
                return Err(mpu::UploadError::NoSuchUpload.into());
            }
        }
        Ok(())
    }
}

impl Store {
    /// Marks `key` as being written until the guard drops.
    pub(super) fn start_writing(&self, bucket: &str, key: &str) -> WritingKey {
        let k = (bucket.to_string(), key.to_string());
        *self
            .inner
            .marks
            .writing
            .borrow_mut()
            .entry(k.clone())
            .or_default() += 1;
        WritingKey {
            store: self.clone(),
            key: k,
        }
    }

    /// The replication stamp, ETag (None: a tombstone or a delete marker)
    /// and whether it is a delete marker, of the index key `key` itself.
    pub fn index_key_state(&self, bucket: &str, key: &str) -> Option<(u64, Option<String>, bool)> {
        self.lookup(bucket, key).map(|e| {
            let etag = match &e.state {
                State::Live(info) => Some(info.etag.to_string()),
                State::Deleted { .. } | State::Marker { .. } => None,
            };
            let marker = matches!(e.state, State::Marker { .. });
            (e.state.stamp(), etag, marker)
        })
    }

    /// The replication stamp of the key's current version or tombstone.
    pub fn key_stamp(&self, bucket: &str, key: &str) -> Option<u64> {
        self.lookup(bucket, key).map(|e| match &e.state {
            State::Live(info) => info.stamp,
            State::Deleted { stamp } => *stamp,
            State::Marker { mtime_ms } => *mtime_ms,
        })
    }

    /// A new real version's id (`versions::STAMP_ID_MIN`): its stamp on a
    /// cluster node (every replica keeps it, and stamps increase across
    /// primaries), the seq of its record on a single node.
    pub(super) fn version_id(&self, seq: u64, stamp: u64) -> u64 {
        if self.inner.cfg.write_stamps {
            stamp.max(super::versions::STAMP_ID_MIN)
        } else {
            seq
        }
    }

    /// A stamp for a new version of `key`, after every version of it this
    /// store holds or is writing: max(now, newest + 1), a hybrid clock in
    /// milliseconds. Call while the key is marked as being written (the
    /// stamp is remembered until its last mark drops) and with no await
    /// before its seq is taken, so that stamps and seqs agree. On a
    /// cluster node "every version" includes the key's real versions (by
    /// their ids, tombstoned ones too), so that a new real version's id
    /// is above every id the key had, and a new null version is newer than
    /// every real one (`versions::null_order`).
    pub(super) fn next_stamp(&self, bucket: &str, key: &str) -> u64 {
        let k = (bucket.to_string(), key.to_string());
        let mut current = self.key_stamp(bucket, key).unwrap_or(0);
        if self.inner.cfg.write_stamps {
            // Not an id a day or more ahead of the clock (no version or
            // marker at one is copied: `replica::valid_version_id`), which
            // would lift every later one.
            let bound = now_ms().saturating_add(24 * 3600 * 1000);
            current = current.max(self.newest_id(bucket, key, bound).unwrap_or(0));
        }
        let mut issued = self.inner.marks.stamps.borrow_mut();
        let last = issued.get(&k).copied().unwrap_or(0);
        let stamp = now_ms()
            .max(current.saturating_add(1))
            .max(last.saturating_add(1));
        if self.is_writing(bucket, key) {
            issued.insert(k, stamp);
        }
        stamp
    }

    /// `next_stamp` (or `preset`: a replica keeps its primary's stamp),
    /// written into `meta` as `STAMP_HEADER`.
    pub(super) fn issue_stamp(
        &self,
        bucket: &str,
        key: &str,
        meta: &mut ObjectMeta,
        preset: Option<u64>,
    ) -> u64 {
        meta.headers.retain(|(n, _)| n != super::STAMP_HEADER);
        if !self.inner.cfg.write_stamps {
            // A single node: versions stamp with their modification time
            // (as recovery reads them back).
            return meta.mtime_ms;
        }
        let stamp = preset.unwrap_or_else(|| self.next_stamp(bucket, key));
        meta.headers
            .push((super::STAMP_HEADER.to_string(), stamp.to_string()));
        stamp
    }

    pub(super) fn is_writing(&self, bucket: &str, key: &str) -> bool {
        self.inner
            .marks
            .writing
            .borrow()
            .contains_key(&(bucket.to_string(), key.to_string()))
    }

    /// Stores a whole object held in memory.
    pub async fn put(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        data: Bytes,
    ) -> Result<ObjectInfo> {
        let mut w = self.put_stream(bucket, key, meta);
        w.write(data).await?;
        w.finish().await
    }

    /// Starts a streamed PUT; nothing is visible until `finish` returns.
    pub fn put_stream(&self, bucket: &str, key: &str, meta: ObjectMeta) -> PutWriter {
        PutWriter {
            store: self.clone(),
            bucket: bucket.to_string(),
            key: key.to_string(),
            meta,
            buffer: Vec::new(),
            held: None,
            written_bytes: 0,
            extents: Vec::new(),
            in_flight: VecDeque::new(),
            pinned: Vec::new(),
            part_of: None,
            condition: None,
            new_version: false,
        }
    }

    /// Checks a PUT condition against the current version; Ok carries the
    /// current version's seq, to be found unchanged at install time.
    pub fn check_put_condition(
        &self,
        bucket: &str,
        key: &str,
        condition: &PutCondition,
    ) -> Result<Option<u64>> {
        let live = self.current_live(bucket, key);
        match (condition, live) {
            (c @ (PutCondition::IfNewer(_) | PutCondition::Replace { .. }), _) => {
                if c.stamp_allows(self.key_stamp(bucket, key)) {
                    Ok(None)
                } else {
                    Err(StoreError::PreconditionFailed)
                }
            }
            (PutCondition::IfNoneMatchAny, None) => Ok(None),
            (PutCondition::IfNoneMatchAny, Some(_)) => Err(StoreError::PreconditionFailed),
            (PutCondition::IfMatch(_), None) => Err(StoreError::NotFound),
            (PutCondition::IfSeq(_), None) => Err(StoreError::NotFound),
            (PutCondition::IfSeq(want), Some((seq, _))) => {
                if *want == seq {
                    Ok(Some(seq))
                } else {
                    Err(StoreError::ConditionalConflict)
                }
            }
            (PutCondition::IfMatch(list), Some((seq, info))) => {
                if list.iter().any(|t| t == "*" || **t == *info.etag) {
                    Ok(Some(seq))
                } else {
                    Err(StoreError::PreconditionFailed)
                }
            }
        }
    }
}
