//! Bucket configuration documents (tagging, CORS, lifecycle): small inline
//! records in a namespace no bucket name can take, kept by the
//! bucket-owner shard beside the bucket records. Each carries the creation
//! time of the bucket it was written for, so that a document left behind
//! by a deleted bucket (a crash between the deletion and the clean-up)
//! never applies to a new bucket of the same name.

use bytes::Bytes;
use md5::{Digest, Md5};

use super::index::State;
use super::record::ObjectMeta;
use super::{ListItem, Result, Store, StoreError};

/// Namespace of configuration documents: real bucket names are 3..=63
/// characters of `[a-z0-9.-]`, so this never collides with one.
pub(super) const CONFIG_NAMESPACE: &str = "\u{1}config";
/// Namespace of user records (`access::users`), one per user name.
pub(super) const USERS_NAMESPACE: &str = "\u{1}users";
/// The stored header holding the owning bucket's creation time (ms).
const BUCKET_CREATED_HEADER: &str = "x-percore-bucket-created-ms";
/// Largest document stored (the S3 front door's parse limit is lower).
pub const CONFIG_DOC_BYTES_MAX: usize = 256 * 1024;

/// One stored configuration document.
#[derive(Debug, Clone)]
pub struct ConfigDoc {
    pub bucket: String,
    /// The configuration's kind ("cors", "lifecycle", "tagging").
    pub kind: String,
    /// Creation time of the bucket it was written for.
    pub bucket_created_ms: u64,
    /// Orders documents of one bucket and kind: a later write has a larger
    /// seq on every shard that applies it.
    pub seq: u64,
    pub doc: Bytes,
}

fn doc_key(bucket: &str, kind: &str) -> String {
    format!("{bucket}/{kind}")
}

impl Store {
    /// Durably replaces (Some) or removes (None) the `kind` document of
    /// `bucket`; returns the write's seq.
    pub async fn bucket_config_set(
        &self,
        bucket: &str,
        bucket_created_ms: u64,
        kind: &str,
        doc: Option<Bytes>,
    ) -> Result<u64> {
        if doc.as_ref().is_some_and(|d| d.len() > CONFIG_DOC_BYTES_MAX) {
            return Err(StoreError::Invalid(format!(
                "a bucket configuration document is at most {CONFIG_DOC_BYTES_MAX} bytes"
            )));
        }
        let created = (
            BUCKET_CREATED_HEADER.to_string(),
            bucket_created_ms.to_string(),
        );
        self.write_doc(CONFIG_NAMESPACE, &doc_key(bucket, kind), vec![created], doc)
            .await
    }

    /// Durably stores (Some, inline, with `headers`) or removes (None) a
    /// small record; returns the write's seq. Callers serialize writes of
    /// one key (shard 0's lock), so the seq read back is this write's.
    async fn write_doc(
        &self,
        namespace: &str,
        key: &str,
        headers: Vec<(String, String)>,
        doc: Option<Bytes>,
    ) -> Result<u64> {
        match doc {
            Some(doc) => {
                let meta = ObjectMeta {
                    etag: hex::encode(Md5::digest(&doc)),
                    headers,
                    ..ObjectMeta::default()
                };
                self.put(namespace, key, meta, doc).await?;
            }
            None => {
                self.write_tombstone(namespace, key, super::record::Kind::Tombstone)
                    .await?;
            }
        }
        // Installed before the write returned, and nothing awaited since.
        Ok(self.lookup(namespace, key).map_or(0, |e| e.seq))
    }

    /// Every stored document, read and checked.
    pub async fn bucket_configs(&self) -> Result<Vec<ConfigDoc>> {
        self.configs_under("").await
    }

    /// The stored documents of `bucket` (of any creation time: callers
    /// compare `bucket_created_ms`), read and checked.
    pub async fn bucket_configs_of(&self, bucket: &str) -> Result<Vec<ConfigDoc>> {
        self.configs_under(&format!("{bucket}/")).await
    }

    async fn configs_under(&self, prefix: &str) -> Result<Vec<ConfigDoc>> {
        let mut docs = Vec::new();
        let items = self.list(CONFIG_NAMESPACE, prefix, "", None, usize::MAX);
        for item in items {
            let ListItem::Object { key, .. } = item else {
                continue;
            };
            let Some((bucket, kind)) = key.split_once('/') else {
                continue;
            };
            let seq = match self.lookup(CONFIG_NAMESPACE, &key) {
                Some(e) if matches!(e.state, State::Live(_)) => e.seq,
                _ => continue,
            };
            // One damaged document is lost alone, not every bucket's.
            let payload = match self.read_doc(CONFIG_NAMESPACE, &key).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::error!(key, "bucket configuration unreadable, ignored: {e}");
                    continue;
                }
            };
            let (bucket_created_ms, payload) = (created_of(&payload.0).unwrap_or(0), payload.1);
            docs.push(ConfigDoc {
                bucket: bucket.to_string(),
                kind: kind.to_string(),
                bucket_created_ms,
                seq,
                doc: payload,
            });
        }
        Ok(docs)
    }

    /// Durably stores (Some) or removes (None) the record of user `name`;
    /// returns the write's seq.
    pub async fn user_set(&self, name: &str, doc: Option<Bytes>) -> Result<u64> {
        self.write_doc(USERS_NAMESPACE, name, Vec::new(), doc).await
    }

    /// A whole small record: its metadata and payload.
    async fn read_doc(&self, namespace: &str, key: &str) -> Result<(ObjectMeta, Bytes)> {
        let mut reader = self.open_read(namespace, key).await?;
        let size = reader.size_bytes();
        let payload = reader.read(0, size).await?;
        Ok((
            ObjectMeta::clone(&reader.meta),
            Bytes::copy_from_slice(&payload),
        ))
    }

    /// Every stored user record: (name, seq, document).
    pub async fn users(&self) -> Result<Vec<(String, u64, Bytes)>> {
        let mut out = Vec::new();
        for item in self.list(USERS_NAMESPACE, "", "", None, usize::MAX) {
            let ListItem::Object { key, .. } = item else {
                continue;
            };
            let Some(seq) = self.live_seq(USERS_NAMESPACE, &key) else {
                continue;
            };
            match self.read_doc(USERS_NAMESPACE, &key).await {
                Ok((_, doc)) => out.push((key, seq, doc)),
                // That user's keys fail; every other user's work.
                Err(e) => tracing::error!(user = key, "user record unreadable, ignored: {e}"),
            }
        }
        Ok(out)
    }

    /// Removes the documents of `bucket` as created at `bucket_created_ms`
    /// (after its deletion); those of a bucket created again under the
    /// name stay.
    pub async fn bucket_configs_drop(&self, bucket: &str, bucket_created_ms: u64) -> Result<usize> {
        let prefix = format!("{bucket}/");
        let keys: Vec<String> = self
            .list(CONFIG_NAMESPACE, &prefix, "", None, usize::MAX)
            .into_iter()
            .filter_map(|item| match item {
                ListItem::Object { key, .. } => Some(key),
                ListItem::Prefix(_) | ListItem::Versions { .. } | ListItem::Skipped(_) => None,
            })
            .collect();
        let mut dropped = 0;
        for key in &keys {
            let created = match self.open_read(CONFIG_NAMESPACE, key).await {
                Ok(reader) => created_of(&reader.meta),
                // Unreadable: it applies to no bucket either way.
                Err(_) => None,
            };
            if created.is_none_or(|c| c == bucket_created_ms) {
                self.delete(CONFIG_NAMESPACE, key).await?;
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

fn created_of(meta: &ObjectMeta) -> Option<u64> {
    meta.headers
        .iter()
        .find(|(n, _)| n == BUCKET_CREATED_HEADER)
        .and_then(|(_, v)| v.parse().ok())
}
