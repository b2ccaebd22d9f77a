//! Bucket configurations across shards: a Put or Delete of one goes to the
//! bucket-owner shard, which writes the document durably
//! (`store::bucket_config`) and then applies it on every shard before it
//! answers, so a request that starts after the answer, on any shard, sees
//! it. Applies carry the write's seq (a late, older one is ignored) and
//! the bucket's creation time (one for a bucket since deleted and created
//! again is ignored).

use std::rc::Rc;

use bytes::Bytes;

use super::msg::{Op, Reply, ShardError};
use super::{store_error, Shard, BUCKET_OWNER_SHARD};
use crate::access::{self, Principal};
use crate::bucket_config::{BucketConfig, ConfigKind};

/// Ok when every shard confirmed an apply; else Busy: the change is
/// durable and will reach the slow shard (applies are always delivered),
/// but the caller must not be told it is in force everywhere yet.
pub(super) fn all_applied(replies: &[Reply]) -> Reply {
    if replies.iter().all(|r| matches!(r, Reply::Ok)) {
        Reply::Ok
    } else {
        Reply::Err(ShardError::Busy)
    }
}

impl Shard {
    /// This shard's view of `bucket`'s configuration (None: no bucket).
    pub fn bucket_config(&self, bucket: &str) -> Option<BucketConfig> {
        self.buckets
            .borrow()
            .get(bucket)
            .filter(|b| !b.locked)
            .map(|b| b.config.clone())
    }

    /// Whether `principal` may do `action` on `key` (None: the bucket
    /// itself) of `bucket`, decided on this shard's view without copying
    /// it, also while the bucket is locked by a DeleteBucket (its owner and
    /// policy still hold then). None: no such bucket here.
    pub fn decide_access(
        &self,
        principal: &Principal,
        action: &str,
        bucket: &str,
        key: Option<&str>,
    ) -> Option<bool> {
        if *principal == Principal::Root {
            return Some(true);
        }
        let buckets = self.buckets.borrow();
        let view = buckets.get(bucket)?;
        Some(access::decide(
            principal,
            action,
            bucket,
            key,
            Some(&view.config),
        ))
    }

    /// The buckets `principal` lists: those it owns, all for root.
    pub fn buckets_of(&self, principal: &Principal) -> Vec<(String, u64)> {
        self.buckets
            .borrow()
            .iter()
            .filter(|(_, b)| {
                *principal == Principal::Root || principal.owns(b.config.owner.as_deref())
            })
            .map(|(n, b)| (n.clone(), b.created_ms))
            .collect()
    }

    /// The names of the buckets `owner` (a user name) owns.
    pub fn buckets_owned_by(&self, owner: &str) -> Vec<String> {
        self.buckets
            .borrow()
            .iter()
            .filter(|(_, b)| b.config.owner.as_deref() == Some(owner))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Stores (Some) or removes (None) the `kind` configuration of
    /// `bucket`; the document must already be checked (normalized XML).
    pub async fn set_bucket_config(
        self: &Rc<Self>,
        bucket: &str,
        kind: ConfigKind,
        doc: Option<Bytes>,
    ) -> Result<(), ShardError> {
        let op = Op::BucketConfigSet {
            name: bucket.into(),
            kind,
            doc,
        };
        match self.call(BUCKET_OWNER_SHARD, op).await {
            Reply::Ok => Ok(()),
            Reply::Err(e) => Err(e),
            other => Err(ShardError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// The buckets after `after` with their documents, about `budget`
    /// bytes of documents a page (`Op::BucketDocs`); and whether more
    /// follow.
    pub async fn bucket_docs(
        self: &Rc<Self>,
        after: Option<String>,
        budget: usize,
    ) -> Result<(Vec<super::msg::BucketDocs>, bool), ShardError> {
        match self
            .call(BUCKET_OWNER_SHARD, Op::BucketDocs { after, budget })
            .await
        {
            Reply::BucketDocs(docs, more) => Ok((docs, more)),
            Reply::Err(e) => Err(e),
            other => Err(ShardError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// BucketConfigSet, on the bucket-owner shard.
    pub(super) async fn bucket_config_set(
        self: &Rc<Self>,
        name: String,
        kind: ConfigKind,
        doc: Option<Bytes>,
    ) -> Reply {
        debug_assert_eq!(self.id, BUCKET_OWNER_SHARD);
        let _serial = self.config_writes.lock().await;
        if self.creating.borrow().contains(&name) {
            // Not visible yet: wait for it (a copy's create, or a client's).
            return Reply::Err(ShardError::Busy);
        }
        let Some(created_ms) = self.bucket_created_ms(&name) else {
            return Reply::Err(ShardError::NoSuchBucket);
        };
        // Writes of configurations are serialized here: what this shard's
        // view shows is every write before this one.
        let seq = match self
            .store
            .bucket_config_set(&name, created_ms, kind.name(), doc.clone())
            .await
        {
            Ok(seq) => seq,
            Err(e) => return Reply::Err(store_error(e)),
        };
        let applied = self
            .call_all(|| Op::BucketConfigApply {
                name: name.clone(),
                created_ms,
                kind,
                seq,
                doc: doc.clone(),
            })
            .await;
        all_applied(&applied)
    }

    /// BucketDocs, on the bucket-owner shard: live buckets in name order,
    /// each with its stored documents of its current creation time.
    pub(super) async fn bucket_docs_here(&self, after: Option<String>, budget: usize) -> Reply {
        debug_assert_eq!(self.id, BUCKET_OWNER_SHARD);
        let mut names: Vec<(String, u64)> = self
            .bucket_list()
            .into_iter()
            .filter(|(n, _)| after.as_ref().is_none_or(|a| n > a))
            .collect();
        names.sort_unstable();
        let mut out = Vec::new();
        let mut bytes = 0;
        for (name, created_ms) in names {
            if !out.is_empty() && bytes >= budget {
                return Reply::BucketDocs(out, true);
            }
            let stored = match self.store.bucket_configs_of(&name).await {
                Ok(docs) => docs,
                Err(e) => return Reply::Err(store_error(e)),
            };
            let docs: Vec<(ConfigKind, Bytes)> = stored
                .into_iter()
                .filter(|d| d.bucket == name && d.bucket_created_ms == created_ms)
                .filter_map(|d| ConfigKind::from_name(&d.kind).map(|k| (k, d.doc)))
                .collect();
            // As answered: base64, JSON quoting and names.
            bytes += docs
                .iter()
                .map(|(_, d)| d.len() / 3 * 4 + 32)
                .sum::<usize>()
                + name.len()
                + 64;
            out.push(super::msg::BucketDocs { name, docs });
        }
        Reply::BucketDocs(out, false)
    }

    /// BucketConfigApply, on every shard.
    pub(super) fn bucket_config_apply(
        &self,
        name: &str,
        created_ms: u64,
        kind: ConfigKind,
        seq: u64,
        doc: Option<Bytes>,
    ) -> Reply {
        if let Some(view) = self.buckets.borrow_mut().get_mut(name) {
            if view.created_ms == created_ms {
                view.config.apply(name, kind, seq, doc.as_deref());
            }
        }
        Reply::Ok
    }

    /// At start-up, on the bucket-owner shard once the buckets are out:
    /// the stored configurations of live buckets go to every shard; those
    /// of deleted buckets are dropped.
    pub(super) async fn publish_bucket_configs(self: &Rc<Self>) {
        let docs = match self.store.bucket_configs().await {
            Ok(docs) => docs,
            Err(e) => {
                // Serving without them would drop CORS rules and run no
                // lifecycle: loud, but the data path stays up.
                tracing::error!("could not read the bucket configurations: {e}");
                return;
            }
        };
        for d in docs {
            let Some(kind) = ConfigKind::from_name(&d.kind) else {
                tracing::warn!(bucket = %d.bucket, kind = %d.kind, "unknown bucket configuration kept unused");
                continue;
            };
            let live = self
                .buckets
                .borrow()
                .get(&d.bucket)
                .is_some_and(|b| b.created_ms == d.bucket_created_ms);
            if !live {
                if let Err(e) = self
                    .store
                    .bucket_config_set(&d.bucket, d.bucket_created_ms, &d.kind, None)
                    .await
                {
                    tracing::warn!(bucket = %d.bucket, "could not drop a deleted bucket's configuration: {e}");
                }
                continue;
            }
            self.call_all(|| Op::BucketConfigApply {
                name: d.bucket.clone(),
                created_ms: d.bucket_created_ms,
                kind,
                seq: d.seq,
                doc: Some(d.doc.clone()),
            })
            .await;
        }
    }
}
