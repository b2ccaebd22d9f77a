//! DELETE: tombstones, written durably, then installed.

use bytes::Bytes;

use super::index::{Entry, State};
use super::record::{self, Body, Header, Kind};
use super::versions::{version_key, Versioning};
use super::{now_ms, PutCondition, Result, Store, StoreError};

impl Store {
    /// Deletes the current version. Returns whether a live object existed.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<bool> {
        match self.lookup(bucket, key) {
            Some(Entry {
                state: State::Live(_),
                ..
            }) => {}
            _ if self.is_uncertain(bucket, key) => {
                self.write_tombstone(bucket, key, Kind::Tombstone).await?;
                return Ok(false);
            }
            _ => return Ok(false),
        }
        self.write_tombstone(bucket, key, Kind::Tombstone).await?;
        Ok(true)
    }

    /// The seq of the key's current live version, if it has one.
    pub fn live_seq(&self, bucket: &str, key: &str) -> Option<u64> {
        self.current_live(bucket, key).map(|(seq, _)| seq)
    }

    /// The current live version of the key: (seq, mtime, size).
    pub fn live_version(&self, bucket: &str, key: &str) -> Option<(u64, u64, u64)> {
        self.current_live(bucket, key)
            .map(|(seq, info)| (seq, info.mtime_ms, info.size_bytes))
    }

    /// Deletes the key (in a bucket in `mode`: a delete marker where it is
    /// versioned) only if `seq` is still its current version and no write
    /// to it is in flight (checked in the poll that takes the record's
    /// seq, so a later write wins). Returns the index key it wrote (the
    /// key, or a real version's for a marker), None if it did not.
    pub async fn delete_if_current(
        &self,
        bucket: &str,
        key: &str,
        seq: u64,
        mode: Versioning,
    ) -> Result<Option<String>> {
        if self.is_writing(bucket, key) || self.live_seq(bucket, key) != Some(seq) {
            return Ok(None);
        }
        Ok(Some(match mode {
            Versioning::Off => {
                self.write_tombstone(bucket, key, Kind::Tombstone).await?;
                key.to_string()
            }
            Versioning::Suspended => {
                self.write_marker(bucket, key, false).await?;
                key.to_string()
            }
            Versioning::Enabled => version_key(key, self.write_marker(bucket, key, true).await?),
        }))
    }

    /// Writes a delete marker for `key`: a new real version (`real`: its
    /// id is returned) or the null version (its seq).
    pub(super) async fn write_marker(&self, bucket: &str, key: &str, real: bool) -> Result<u64> {
        self.write_bodiless(bucket, key, Kind::DeleteMarker, real)
            .await
    }

    pub(super) async fn write_tombstone(&self, bucket: &str, key: &str, kind: Kind) -> Result<()> {
        self.write_bodiless(bucket, key, kind, false)
            .await
            .map(drop)
    }

    /// A replica's copy of its primary's delete marker at `index_key`
    /// (the null version's place, or a real version's), stamped as the
    /// condition says, installed as `delete_stamped` installs a tombstone.
    pub async fn marker_stamped(
        &self,
        bucket: &str,
        index_key: &str,
        condition: PutCondition,
    ) -> Result<bool> {
        self.bodiless_stamped(bucket, index_key, Kind::DeleteMarker, condition)
            .await
    }

    /// A replica's copy of its primary's delete (stamped `stamp`): a
    /// tombstone, under `condition` (`PutCondition::IfNewer` or
    /// `Replace`; a tombstone is written even where nothing is stored, so
    /// that an older copy arriving late is refused). Returns whether it was
    /// written (false: the condition did not hold).
    pub async fn delete_stamped(
        &self,
        bucket: &str,
        key: &str,
        condition: PutCondition,
    ) -> Result<bool> {
        self.bodiless_stamped(bucket, key, Kind::Tombstone, condition)
            .await
    }

    /// `delete_stamped` of a record of `kind` (Tombstone or DeleteMarker).
    async fn bodiless_stamped(
        &self,
        bucket: &str,
        key: &str,
        kind: Kind,
        condition: PutCondition,
    ) -> Result<bool> {
        // One copy of a key at a time (see `PutWriter::finish_version`).
        if self.is_writing(bucket, key) {
            return Err(StoreError::ConditionalConflict);
        }
        if !condition.stamp_allows(self.key_stamp(bucket, key)) {
            return Ok(false);
        }
        let written = self
            .write_bodiless_at(bucket, key, kind, false, Some(condition))
            .await?;
        Ok(written.is_some())
    }

    /// Writes and installs a record without payload of `kind` (Tombstone,
    /// BucketDelete or DeleteMarker) for `key`, at a new real version's
    /// index key with `real`. Returns its seq (with `real`: its id).
    async fn write_bodiless(&self, bucket: &str, key: &str, kind: Kind, real: bool) -> Result<u64> {
        let seq = self
            .write_bodiless_at(bucket, key, kind, real, None)
            .await?;
        Ok(seq.expect("installed without a replica's condition"))
    }

    /// `write_bodiless`; a tombstone under a replica's `condition` keeps
    /// its stamp and is installed only while the condition holds (None:
    /// it did not).
    async fn write_bodiless_at(
        &self,
        bucket: &str,
        key: &str,
        kind: Kind,
        real: bool,
        condition: Option<PutCondition>,
    ) -> Result<Option<u64>> {
        let _writing = self.start_writing(bucket, key);
        // A tombstone's time is its stamp (no client sees it); no await
        // between it and the seq.
        let preset = condition.as_ref().and_then(|c| c.preset_stamp());
        // So is a delete marker's on a cluster node (it is shown as the
        // marker's time: max(now, the key's newest stamp + 1)).
        let stamped =
            kind == Kind::Tombstone || (kind == Kind::DeleteMarker && self.inner.cfg.write_stamps);
        let mtime_ms = if stamped {
            preset.unwrap_or_else(|| self.next_stamp(bucket, key))
        } else {
            now_ms()
        };
        let seq = self.take_seq()?;
        let id = self.version_id(seq, mtime_ms);
        let index_key = if real {
            version_key(key, id)
        } else {
            key.to_string()
        };
        let (body, state) = match kind {
            Kind::BucketDelete => (
                Body::BucketDelete { mtime_ms },
                State::Deleted { stamp: mtime_ms },
            ),
            Kind::DeleteMarker => (Body::DeleteMarker { mtime_ms }, State::Marker { mtime_ms }),
            _ => (
                Body::Tombstone { mtime_ms },
                State::Deleted { stamp: mtime_ms },
            ),
        };
        let header = Header {
            seq,
            bucket: bucket.into(),
            key: index_key.clone(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body,
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = self.append_durable(header, Bytes::new()).await?;
        if condition.is_some_and(|c| !c.stamp_allows(self.key_stamp(bucket, key))) {
            // Another version arrived meanwhile: the record stays unused.
            self.count_stale(bucket, &index_key);
            return Ok(None);
        }
        self.install(
            bucket,
            &index_key,
            Entry {
                seq,
                loc,
                state,
                older_on_disk: 0,
            },
        );
        Ok(Some(if real { id } else { seq }))
    }
}
