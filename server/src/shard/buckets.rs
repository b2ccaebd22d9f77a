//! Buckets: the replicated bucket view every shard keeps, the bucket-owner
//! shard's create and delete (lock everywhere, count, apply everywhere),
//! and the per-bucket count of writes in progress that DeleteBucket checks.

use std::rc::Rc;

use super::msg::{Op, Reply, ShardError};
use super::{store_error, Shard, BUCKET_OWNER_SHARD};
use crate::bucket_config::ConfigKind;

/// The most versions one BucketPurge call drops.
const PURGE_PER_CALL: usize = 4096;

/// The most DeleteBucket holds one bucket may have at once (doors racing,
/// clients' retries); more are refused (503).
const HOLDS_MAX: usize = 16;

#[derive(Debug, Clone)]
pub struct BucketView {
    pub created_ms: u64,
    /// Set while shard 0 checks emptiness for a DeleteBucket.
    pub locked: bool,
    /// The holds of cluster DeleteBuckets that close the bucket to
    /// clients' writes (token, and until when: each lapses by itself);
    /// at most `HOLDS_MAX`.
    pub closing: Vec<(u64, std::time::Instant)>,
    /// Tags, CORS and lifecycle rules (see `bucket_config`).
    pub config: crate::bucket_config::BucketConfig,
}
impl Shard {
    pub fn bucket_exists(&self, name: &str) -> bool {
        self.buckets.borrow().get(name).is_some_and(|b| !b.locked)
    }

    /// The creation time of `name`, if it exists and is not locked.
    pub(super) fn bucket_created_ms(&self, name: &str) -> Option<u64> {
        let buckets = self.buckets.borrow();
        buckets
            .get(name)
            .filter(|b| !b.locked)
            .map(|b| b.created_ms)
    }

    pub fn bucket_list(&self) -> Vec<(String, u64)> {
        self.buckets
            .borrow()
            .iter()
            .map(|(n, b)| (n.clone(), b.created_ms))
            .collect()
    }

    /// On the bucket-owner shard at start-up: push the recovered bucket set
    /// to every shard before anyone serves requests.
    pub async fn publish_buckets(self: &Rc<Self>) {
        assert_eq!(self.id, BUCKET_OWNER_SHARD);
        for (name, created_ms) in self.store.bucket_records() {
            for s in 0..self.count {
                self.call(
                    s,
                    Op::BucketApply {
                        name: name.clone(),
                        created_ms: Some(created_ms),
                        owner: None,
                    },
                )
                .await;
            }
        }
        self.publish_bucket_configs().await;
        self.publish_users().await;
    }

    pub(super) async fn bucket_create(
        self: &Rc<Self>,
        name: String,
        owner: Option<String>,
    ) -> Reply {
        debug_assert_eq!(self.id, BUCKET_OWNER_SHARD);
        if !self.creating.borrow_mut().insert(name.clone()) {
            return Reply::Err(ShardError::ConditionalConflict);
        }
        let reply = self.bucket_create_inner(&name, owner).await;
        self.creating.borrow_mut().remove(&name);
        reply
    }

    async fn bucket_create_inner(self: &Rc<Self>, name: &str, owner: Option<String>) -> Reply {
        match self.store.bucket_create(name).await {
            Ok(true) => {}
            Ok(false) => return Reply::Created(false),
            Err(e) => return Reply::Err(store_error(e)),
        }
        let created_ms = self
            .store
            .bucket_records()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, c)| c);
        // The owner is recorded right after the bucket; a crash between the
        // two leaves a bucket of the root principal (which can give it away
        // with a policy).
        if let Some(owner) = &owner {
            let _serial = self.config_writes.lock().await;
            let doc = Some(bytes::Bytes::from(owner.clone().into_bytes()));
            if let Err(e) = self
                .store
                .bucket_config_set(name, created_ms, ConfigKind::Owner.name(), doc)
                .await
            {
                tracing::warn!(bucket = name, "could not record the bucket's owner: {e}");
            }
        }
        self.call_all(|| Op::BucketApply {
            name: name.to_string(),
            created_ms: Some(created_ms),
            owner: owner.clone(),
        })
        .await;
        Reply::Created(true)
    }

    /// Lock the bucket everywhere, count its objects and writes in progress
    /// (PUTs, parts, CreateMultipartUpload, completions), delete if none.
    /// Multipart uploads do not count: the durable bucket record is the
    /// commit point, after which every shard drops the bucket's uploads and
    /// parts (`BucketApply` with no `created_ms`; see `store::mpu`).
    pub(super) async fn bucket_delete(self: &Rc<Self>, name: String) -> Reply {
        debug_assert_eq!(self.id, BUCKET_OWNER_SHARD);
        if self.creating.borrow().contains(&name) {
            // Not visible yet: answering NoSuchBucket would let the create
            // land after the delete was counted done.
            return Reply::Err(ShardError::Busy);
        }
        let Some(created_ms) = self.bucket_created_ms(&name) else {
            return Reply::Err(ShardError::NoSuchBucket);
        };
        let counts = self
            .call_all(|| Op::BucketLock { name: name.clone() })
            .await;
        let objects: usize = counts
            .iter()
            .map(|r| if let Reply::Count(n) = r { *n } else { 1 })
            .sum();
        if objects > 0 {
            self.call_all(|| Op::BucketUnlock { name: name.clone() })
                .await;
            return Reply::Err(ShardError::BucketNotEmpty);
        }
        if let Err(e) = self.store.bucket_delete(&name).await {
            self.call_all(|| Op::BucketUnlock { name: name.clone() })
                .await;
            return Reply::Err(store_error(e));
        }
        self.call_all(|| Op::BucketApply {
            name: name.clone(),
            created_ms: None,
            owner: None,
        })
        .await;
        // Its configuration goes too; a failure leaves documents that no
        // longer apply (they name the old bucket's creation time) and
        // that the next start drops.
        let dropped = {
            let _serial = self.config_writes.lock().await;
            // Only this bucket's: one created again meanwhile under the
            // name may have written its owner already.
            self.store.bucket_configs_drop(&name, created_ms).await
        };
        if let Err(e) = dropped {
            tracing::warn!(bucket = %name, "could not drop a deleted bucket's configuration: {e}");
        }
        Reply::Ok
    }

    /// Tracks a PUT into `bucket` so that DeleteBucket sees it.
    pub(super) fn put_started(&self, bucket: &str) {
        *self
            .puts_in_flight
            .borrow_mut()
            .entry(bucket.to_string())
            .or_default() += 1;
    }

    /// Drops the uploads and parts of a deleted `bucket` on this shard. A
    /// failure is logged: the purge is tried again at the next start and
    /// before a bucket of this name is created again.
    pub(super) async fn purge_multipart(&self, bucket: &str) {
        match self.store.mpu_purge_bucket(bucket).await {
            Ok(0) => {}
            Ok(dropped) => tracing::info!(
                shard = self.id,
                bucket,
                dropped,
                "dropped the multipart uploads and parts of a deleted bucket"
            ),
            Err(e) => tracing::warn!(
                shard = self.id,
                bucket,
                "could not drop the multipart uploads of a deleted bucket: {e}"
            ),
        }
    }

    pub(super) fn put_ended(&self, bucket: &str) {
        let mut map = self.puts_in_flight.borrow_mut();
        if let Some(n) = map.get_mut(bucket) {
            *n -= 1;
            if *n == 0 {
                map.remove(bucket);
            }
        }
    }

    /// BucketApply: `name` now exists (`created_ms` Some) or not (None).
    pub(super) async fn bucket_apply(
        &self,
        name: String,
        created_ms: Option<u64>,
        owner: Option<String>,
    ) -> Reply {
        match created_ms {
            Some(created_ms) => {
                // A new bucket (not the start-up publication): drop
                // what a deletion of one with this name left behind
                // before it becomes visible (see `store::mpu`).
                let created = self.started.get() && !self.buckets.borrow().contains_key(&name);
                if created {
                    self.purge_multipart(&name).await;
                }
                let mut buckets = self.buckets.borrow_mut();
                let same = buckets
                    .get(&name)
                    .is_some_and(|b| b.created_ms == created_ms);
                if !same {
                    let mut config = crate::bucket_config::BucketConfig::default();
                    config.owner = owner.map(|o| std::rc::Rc::from(o.as_str()));
                    buckets.insert(
                        name,
                        BucketView {
                            created_ms,
                            locked: false,
                            closing: Vec::new(),
                            config,
                        },
                    );
                }
            }
            None => {
                self.buckets.borrow_mut().remove(&name);
                // The deletion is durable: its uploads go with it.
                self.purge_multipart(&name).await;
            }
        }
        Reply::Ok
    }

    /// BucketLock: refuse new writes into `name`; count its objects and
    /// writes in progress here.
    pub(super) fn bucket_lock(&self, name: String) -> Reply {
        if let Some(b) = self.buckets.borrow_mut().get_mut(&name) {
            b.locked = true;
        }
        let writing = self
            .puts_in_flight
            .borrow()
            .get(&name)
            .copied()
            .unwrap_or(0);
        Reply::Count(self.store.object_count(&name) + writing)
    }

    /// BucketClose: refuse clients' writes into `name` until `until` (or
    /// a BucketReopen with `token`; other holds stand on their own); the
    /// number of writes in progress here. A write counts itself and then
    /// looks for a hold in one turn of this shard (`client_write`), so
    /// each is either counted here or refused.
    pub(super) fn bucket_close(&self, name: &str, token: u64, until: std::time::Instant) -> Reply {
        let now = std::time::Instant::now();
        match self.buckets.borrow_mut().get_mut(name) {
            Some(b) if !b.locked => {
                b.closing.retain(|&(t, u)| u > now && t != token);
                if b.closing.len() >= HOLDS_MAX {
                    return Reply::Err(ShardError::Busy);
                }
                b.closing.push((token, until));
            }
            _ => return Reply::Err(ShardError::NoSuchBucket),
        }
        Reply::Count(self.puts_in_flight.borrow().get(name).copied().unwrap_or(0))
    }

    pub(super) fn bucket_reopen(&self, name: &str, token: u64) -> Reply {
        if let Some(b) = self.buckets.borrow_mut().get_mut(name) {
            b.closing.retain(|&(t, _)| t != token);
        }
        Reply::Ok
    }

    /// A client's write into `bucket` (not a replica's copy) starts: it
    /// counts against the bucket for DeleteBucket, unless a cluster
    /// DeleteBucket holds the bucket closed (`bucket_close`).
    pub(super) fn client_write(&self, bucket: &str) -> Result<WriteInProgress<'_>, ShardError> {
        if self.bucket_closed(bucket) {
            return Err(ShardError::BucketClosing);
        }
        Ok(WriteInProgress::new(self, bucket))
    }

    /// Whether a cluster DeleteBucket holds `bucket` closed to clients'
    /// writes here now.
    pub(super) fn bucket_closed(&self, bucket: &str) -> bool {
        // The clock is read only where a hold stands (not on every PUT).
        self.buckets.borrow().get(bucket).is_some_and(|b| {
            !b.closing.is_empty() && {
                let now = std::time::Instant::now();
                b.closing.iter().any(|&(_, until)| now < until)
            }
        })
    }

    /// BucketPurge: drops the versions of `name` on this shard written
    /// before `before_ms` (their mtime, the primary's clock; copies keep
    /// it): a bucket the cluster deleted while this node was not asked
    /// (`cluster::catalog::apply`); later ones (copies of a bucket of the
    /// name made again) stay. At most `PURGE_PER_CALL` a call; how many
    /// it dropped (0: none is left to drop).
    pub(super) async fn bucket_purge(&self, name: &str, before_ms: u64) -> Reply {
        use crate::store::versions::{Pick, Versioning};
        let mut dropped = 0;
        let mut after = String::new();
        loop {
            let page = self
                .store
                .list_keys(name, "", &after, None, 256, Some(None));
            let Some(last) = page.last() else {
                return Reply::Count(dropped);
            };
            after = last.name().to_string();
            for item in page {
                let crate::store::ListItem::Versions { key, .. } = item else {
                    continue;
                };
                for v in self.store.versions(name, &key) {
                    if v.mtime_ms >= before_ms {
                        continue;
                    }
                    let pick = v.version.map_or(Pick::Null, Pick::Id);
                    match self
                        .store
                        .delete_object(name, &key, Versioning::Off, pick)
                        .await
                    {
                        Ok(done) if done.existed => dropped += 1,
                        Ok(_) => {}
                        Err(e) => return Reply::Err(store_error(e)),
                    }
                }
                if dropped >= PURGE_PER_CALL {
                    return Reply::Count(dropped);
                }
            }
        }
    }

    pub(super) fn bucket_unlock(&self, name: String) -> Reply {
        if let Some(b) = self.buckets.borrow_mut().get_mut(&name) {
            b.locked = false;
        }
        Reply::Ok
    }

    /// The bucket operations of `execute`.
    pub(super) async fn execute_bucket_op(self: &Rc<Self>, op: Op) -> Reply {
        match op {
            Op::BucketCreate { name, owner } => self.bucket_create(name, owner).await,
            Op::BucketDelete { name } => self.bucket_delete(name).await,
            Op::BucketApply {
                name,
                created_ms,
                owner,
            } => self.bucket_apply(name, created_ms, owner).await,
            Op::UserSet { name, doc } => self.user_set(name, doc).await,
            Op::UserApply { name, seq, doc } => {
                self.users.borrow_mut().apply(&name, seq, doc.as_deref());
                Reply::Ok
            }
            Op::BucketLock { name } => self.bucket_lock(name),
            Op::BucketUnlock { name } => self.bucket_unlock(name),
            Op::BucketClose { name, token, until } => self.bucket_close(&name, token, until),
            Op::BucketReopen { name, token } => self.bucket_reopen(&name, token),
            Op::BucketPurge { name, before_ms } => self.bucket_purge(&name, before_ms).await,
            Op::BucketConfigSet { name, kind, doc } => {
                self.bucket_config_set(name, kind, doc).await
            }
            Op::BucketDocs { after, budget } => self.bucket_docs_here(after, budget).await,
            Op::BucketConfigApply {
                name,
                created_ms,
                kind,
                seq,
                doc,
            } => self.bucket_config_apply(&name, created_ms, kind, seq, doc),
            other => {
                debug_assert!(!other.is_bucket_op(), "{other:?}");
                Reply::Err(ShardError::Internal(format!("no handler for {other:?}")))
            }
        }
    }

    /// Start: the bucket view is complete; serve.
    pub(super) async fn start(&self) -> Reply {
        // The bucket view is complete: drop the multipart state of
        // buckets whose deletion was cut short by a crash.
        let gone: Vec<String> = self
            .store
            .mpu_buckets()
            .into_iter()
            .filter(|b| !self.buckets.borrow().contains_key(b))
            .collect();
        for bucket in gone {
            self.purge_multipart(&bucket).await;
        }
        self.started.set(true);
        for w in self.start_waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
        Reply::Ok
    }
}

/// A write counted against its bucket for DeleteBucket (see `put_started`)
/// until dropped, also when the request's future is dropped half-way.
pub(super) struct WriteInProgress<'a> {
    shard: &'a Shard,
    bucket: String,
}

impl<'a> WriteInProgress<'a> {
    pub(super) fn new(shard: &'a Shard, bucket: &str) -> Self {
        shard.put_started(bucket);
        WriteInProgress {
            shard,
            bucket: bucket.to_string(),
        }
    }
}

impl Drop for WriteInProgress<'_> {
    fn drop(&mut self) {
        self.shard.put_ended(&self.bucket);
    }
}
