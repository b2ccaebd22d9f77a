//! DELETE: tombstones, written durably, then installed.

use bytes::Bytes;

use super::index::{Entry, State};
use super::record::{self, Body, Header, Kind};
use super::{now_ms, Result, Store, StoreError};

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
        self.lookup(bucket, key)
            .filter(|e| matches!(e.state, State::Live(_)))
            .map(|e| e.seq)
    }

    /// The current live version of the key: (seq, mtime, size).
    pub fn live_version(&self, bucket: &str, key: &str) -> Option<(u64, u64, u64)> {
        let e = self.lookup(bucket, key)?;
        match e.state {
            State::Live(info) => Some((e.seq, info.mtime_ms, info.size_bytes)),
            State::Deleted => None,
        }
    }

    /// Deletes the key only if `seq` is still its current version and no
    /// write to it is in flight (checked in the poll that takes the
    /// tombstone's seq, so a later write wins). Returns whether it did.
    pub async fn delete_version(&self, bucket: &str, key: &str, seq: u64) -> Result<bool> {
        if self.is_writing(bucket, key) || self.live_seq(bucket, key) != Some(seq) {
            return Ok(false);
        }
        self.write_tombstone(bucket, key, Kind::Tombstone).await?;
        Ok(true)
    }

    pub(super) async fn write_tombstone(&self, bucket: &str, key: &str, kind: Kind) -> Result<()> {
        let _writing = self.start_writing(bucket, key);
        let seq = self.take_seq()?;
        let body = match kind {
            Kind::BucketDelete => Body::BucketDelete { mtime_ms: now_ms() },
            _ => Body::Tombstone { mtime_ms: now_ms() },
        };
        let header = Header {
            seq,
            bucket: bucket.into(),
            key: key.into(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body,
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = self.append_durable(header, Bytes::new()).await?;
        self.install(
            bucket,
            key,
            Entry {
                seq,
                loc,
                state: State::Deleted,
                older_on_disk: 0,
            },
        );
        Ok(())
    }
}
