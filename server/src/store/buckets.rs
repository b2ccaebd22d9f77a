//! Bucket records, kept in the index of the bucket-owner shard under a
//! namespace no real bucket name can take.

use bytes::Bytes;

use super::index::{Entry, State};
use super::record::{self, Body, Header, Kind};
use super::{now_ms, ListItem, ObjectInfo, Result, Store, StoreError};

/// Namespace of bucket records in the index of the bucket-owner shard.
/// Real bucket names are 3..=63 characters, so "" never collides.
pub(super) const BUCKETS_NAMESPACE: &str = "";

impl Store {
    /// Durably records that `name` exists. Returns false if it already did.
    pub async fn bucket_create(&self, name: &str) -> Result<bool> {
        if self.head(BUCKETS_NAMESPACE, name).is_some() {
            return Ok(false);
        }
        let seq = self.take_seq()?;
        let created_ms = now_ms();
        let header = Header {
            seq,
            bucket: BUCKETS_NAMESPACE.into(),
            key: name.into(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body: Body::Bucket { created_ms },
        };
        let header =
            record::encode_header(&header).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let loc = self.append_durable(header, Bytes::new()).await?;
        let info = ObjectInfo {
            size_bytes: 0,
            etag: "".into(),
            mtime_ms: created_ms,
            stamp: created_ms,
            extents: Box::new([]),
        };
        self.install(
            BUCKETS_NAMESPACE,
            name,
            Entry {
                seq,
                loc,
                state: State::Live(info),
                older_on_disk: 0,
            },
        );
        Ok(true)
    }

    pub async fn bucket_delete(&self, name: &str) -> Result<bool> {
        if self.head(BUCKETS_NAMESPACE, name).is_none() {
            return Ok(false);
        }
        self.write_tombstone(BUCKETS_NAMESPACE, name, Kind::BucketDelete)
            .await?;
        Ok(true)
    }

    /// (name, created_ms) of every bucket recorded here, by name.
    pub fn bucket_records(&self) -> Vec<(String, u64)> {
        self.list(BUCKETS_NAMESPACE, "", "", None, usize::MAX)
            .into_iter()
            .filter_map(|item| match item {
                ListItem::Object { key, mtime_ms, .. } => Some((key, mtime_ms)),
                ListItem::Prefix(_) | ListItem::Versions { .. } | ListItem::Skipped(_) => None,
            })
            .collect()
    }
}
