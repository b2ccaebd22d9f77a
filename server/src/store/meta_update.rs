//! Rewriting an object's metadata without its bytes (PutObjectTagging,
//! DeleteObjectTagging): a new record of the same object under a new seq,
//! with the same ETag and modification time. An inline object's record is
//! written again with its payload; an object in extents gets a record that
//! lists the same extents (as a multipart completion does).
//!
//! The rewrite must never hide a write that was acknowledged: it is
//! refused (ConditionalConflict) when the key has another write in flight
//! or its version changed since the metadata was read, both checked in
//! the same poll that takes the new seq, so any write that starts later
//! gets a larger seq and wins.

use bytes::Bytes;

use super::index::State;
use super::versions::Pick;
use super::{PutCondition, Result, Store, StoreError};

impl Store {
    /// Replaces (Some) or removes (None) the stored header `name` of the
    /// current version of `key`.
    pub async fn set_object_header(
        &self,
        bucket: &str,
        key: &str,
        name: &str,
        value: Option<String>,
    ) -> Result<()> {
        self.set_version_header(bucket, key, Pick::Current, name, value)
            .await
            .map(drop)
    }

    /// `set_object_header` of the version of `key` that `pick` names.
    /// Returns that version (None: the null version).
    pub async fn set_version_header(
        &self,
        bucket: &str,
        key: &str,
        pick: Pick,
        name: &str,
        value: Option<String>,
    ) -> Result<Option<u64>> {
        let found = self.version_to_read(bucket, key, pick)?;
        if found.version.is_none()
            && self
                .resolve(bucket, key, Pick::Current)
                .is_some_and(|c| c.version.is_some())
        {
            // Its new seq would make it look newer than the real versions
            // (see `versions`).
            return Err(StoreError::NotSupported(
                "changing the tags of a null version that is not the current version",
            ));
        }
        let version = found.version;
        let key = found.index_key.as_str();
        self.rewrite_header(bucket, key, name, value).await?;
        Ok(version)
    }

    /// `set_object_header` at an index key.
    async fn rewrite_header(
        &self,
        bucket: &str,
        key: &str,
        name: &str,
        value: Option<String>,
    ) -> Result<()> {
        let mut reader = self.open_read(bucket, key).await?;
        let seq = reader.seq;
        let mut meta = super::record::ObjectMeta::clone(&reader.meta);
        let before = meta.headers.len();
        meta.headers.retain(|(n, _)| n != name);
        if value.is_none() && meta.headers.len() == before {
            return Ok(()); // Nothing to remove.
        }
        if let Some(v) = value {
            meta.headers.push((name.to_string(), v));
        }
        if meta.headers.len() > super::record::HEADERS_COUNT_MAX {
            return Err(StoreError::Invalid(format!(
                "the object has {} metadata entries already: no room for {name}",
                meta.headers.len() - 1
            )));
        }
        let inline = match self.lookup(bucket, key) {
            Some(e) if e.seq == seq => match &e.state {
                State::Live(info) => info.extents.is_empty(),
                State::Deleted { .. } | State::Marker { .. } => return Err(StoreError::NotFound),
            },
            _ => return Err(StoreError::ConditionalConflict),
        };
        if inline {
            let size = reader.size_bytes();
            let payload = reader.read(0, size).await?;
            let payload = Bytes::copy_from_slice(&payload);
            drop(reader);
            let mut w = self.put_stream(bucket, key, meta);
            w.set_condition(PutCondition::IfSeq(seq));
            w.write(payload).await?;
            return match w.finish().await {
                // Another write won the race: not a failed precondition
                // of the caller's, a conflict to retry.
                Err(StoreError::PreconditionFailed) => Err(StoreError::ConditionalConflict),
                other => other.map(drop),
            };
        }
        drop(reader);
        // No await from here to the seq taken in `write_completed`.
        if self.is_writing(bucket, key) {
            return Err(StoreError::ConditionalConflict);
        }
        // A null version (at the key itself) must still be the current
        // version: a real version or delete marker written during the read
        // would otherwise be hidden by the rewrite's newer seq.
        if !key.starts_with('\0') && self.live_seq(bucket, key) != Some(seq) {
            return Err(StoreError::ConditionalConflict);
        }
        let extents = match self.lookup(bucket, key) {
            // The entry's extents are current even if compaction moved
            // them since the read (it keeps the seq).
            Some(e) if e.seq == seq => match e.state {
                State::Live(info) => info.extents.to_vec(),
                State::Deleted { .. } | State::Marker { .. } => return Err(StoreError::NotFound),
            },
            _ => return Err(StoreError::ConditionalConflict),
        };
        let _writing = self.start_writing(bucket, key);
        self.write_completed(bucket, key, meta, extents, false)
            .await?;
        Ok(())
    }
}
