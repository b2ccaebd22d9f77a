//! The shard's typed API for the front doors: one async method per
//! operation, which builds the `Op`, routes it to the shard that owns the
//! data (the key's owner, or the bucket-owner shard), and turns the `Reply`
//! into a typed `Result`. A front door never matches on `Reply` itself.
//!
//! Streaming reads and writes of one object go through `ObjectSource` and
//! `ObjectSink` (`shard::object`); the merged listing is `list_merged`.

use std::collections::VecDeque;
use std::rc::Rc;

use super::msg::{Op, Removed, Reply, ShardError};
use super::{Shard, BUCKET_OWNER_SHARD};
use crate::store::checksum::{Algorithm, UploadChecksum};
use crate::store::mpu::{CompletionChecks, PartItem, UploadItem};
use crate::store::record::ObjectMeta;
use crate::store::versions::Pick;
use crate::store::{ListItem, ObjectInfo};

/// A completed upload: the object, its version id to show (None: the bucket
/// was never versioned) and its checksum.
pub type Completion = (ObjectInfo, Option<String>, Option<(Algorithm, String)>);

/// The error for a reply of the wrong kind (a bug), or the error it carries.
pub(super) fn unexpected(r: Reply) -> ShardError {
    match r {
        Reply::Err(e) => e,
        other => ShardError::Internal(format!("unexpected reply {other:?}")),
    }
}

impl Shard {
    /// The object's stored info on its owner; None if there is none.
    pub async fn head_object(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
    ) -> Result<Option<ObjectInfo>, ShardError> {
        let op = Op::Head {
            bucket: bucket.into(),
            key: key.into(),
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Head(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes the object on its owner (a delete marker where the bucket
    /// is versioned); Ok(true) if it existed.
    pub async fn delete_object(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
    ) -> Result<bool, ShardError> {
        self.delete_version(bucket, key, Pick::Current)
            .await
            .map(|r| r.existed)
    }

    /// DELETE of the version `pick` names, on the key's owner.
    pub async fn delete_version(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        pick: Pick,
    ) -> Result<Removed, ShardError> {
        let op = Op::Delete {
            bucket: bucket.into(),
            key: key.into(),
            pick,
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Deleted(removed) => Ok(removed),
            other => Err(unexpected(other)),
        }
    }

    /// Replaces (Some, URL-encoded) or removes the tags of the object
    /// version `pick` names on its owner, keeping its bytes, ETag and
    /// modification time. Ok: the version id to show.
    pub async fn set_object_tags(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        pick: Pick,
        tags: Option<String>,
    ) -> Result<Option<String>, ShardError> {
        let op = Op::SetTags {
            bucket: bucket.into(),
            key: key.into(),
            pick,
            tags,
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Version(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    /// Creates the bucket on the bucket-owner shard, which publishes it to
    /// every shard before answering, owned by `owner` (None: the root
    /// principal). Ok(false): it existed already. (On a cluster node this
    /// changes this node only: clients' changes go to the catalog,
    /// `cluster::catalog`; a replica's copy into a bucket this node has
    /// not yet applied the catalog of makes it here.)
    pub async fn create_bucket(
        self: &Rc<Self>,
        name: &str,
        owner: Option<&str>,
    ) -> Result<bool, ShardError> {
        let op = Op::BucketCreate {
            name: name.into(),
            owner: owner.map(str::to_string),
        };
        match self.call(BUCKET_OWNER_SHARD, op).await {
            Reply::Created(created) => Ok(created),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes the bucket if it holds no object and no write is in
    /// progress (BucketNotEmpty otherwise), on every shard.
    pub async fn delete_bucket(self: &Rc<Self>, name: &str) -> Result<(), ShardError> {
        let op = Op::BucketDelete { name: name.into() };
        match self.call(BUCKET_OWNER_SHARD, op).await {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Closes `name` to clients' writes on every shard until `until` (a
    /// cluster DeleteBucket: `frontend::s3::cluster`): the writes in
    /// progress into it on this node. NoSuchBucket if a shard lacks it.
    pub async fn close_bucket(
        self: &Rc<Self>,
        name: &str,
        token: u64,
        until: std::time::Instant,
    ) -> Result<usize, ShardError> {
        let replies = self
            .call_all(|| Op::BucketClose {
                name: name.into(),
                token,
                until,
            })
            .await;
        sum_counts(replies)
    }

    /// Ends `close_bucket`'s hold with `token` on every shard.
    pub async fn reopen_bucket(self: &Rc<Self>, name: &str, token: u64) {
        self.call_all(|| Op::BucketReopen {
            name: name.into(),
            token,
        })
        .await;
    }

    /// Drops every version of `name` written before `before_ms` on every
    /// shard (a bucket the cluster deleted: `cluster::catalog::apply`);
    /// how many.
    pub async fn purge_bucket(
        self: &Rc<Self>,
        name: &str,
        before_ms: u64,
    ) -> Result<usize, ShardError> {
        let mut dropped = 0;
        loop {
            let replies = self
                .call_all(|| Op::BucketPurge {
                    name: name.into(),
                    before_ms,
                })
                .await;
            let now = sum_counts(replies)?;
            if now == 0 {
                return Ok(dropped);
            }
            dropped += now;
        }
    }

    /// Starts a multipart upload of `key` on its owner; its upload id.
    pub async fn mpu_create(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        checksum: Option<UploadChecksum>,
    ) -> Result<String, ShardError> {
        let op = Op::MpuCreate {
            bucket: bucket.into(),
            key: key.into(),
            meta,
            checksum,
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Upload(id) => Ok(id),
            other => Err(unexpected(other)),
        }
    }

    /// The checksum an upload in progress was created with.
    pub async fn mpu_checksum(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<Option<UploadChecksum>, ShardError> {
        let op = Op::MpuChecksum {
            bucket: bucket.into(),
            key: key.into(),
            upload_id: upload_id.into(),
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::UploadChecksum(c) => Ok(c),
            other => Err(unexpected(other)),
        }
    }

    /// Completes a multipart upload from `parts` (number, ETag), checking
    /// `checks`: the object, its version id to show and its checksum.
    pub async fn mpu_complete(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: Vec<(u32, String)>,
        checks: CompletionChecks,
    ) -> Result<Completion, ShardError> {
        let op = Op::MpuComplete {
            bucket: bucket.into(),
            key: key.into(),
            upload_id: upload_id.into(),
            parts,
            checks: Box::new(checks),
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Completed(info, version, checksum) => Ok((info, version, checksum)),
            other => Err(unexpected(other)),
        }
    }

    /// Aborts a multipart upload and drops its parts.
    pub async fn mpu_abort(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<(), ShardError> {
        let op = Op::MpuAbort {
            bucket: bucket.into(),
            key: key.into(),
            upload_id: upload_id.into(),
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Up to `limit` parts of an upload numbered after `after`.
    pub async fn mpu_parts(
        self: &Rc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        after: u32,
        limit: usize,
    ) -> Result<(Vec<PartItem>, Option<UploadChecksum>), ShardError> {
        let op = Op::MpuParts {
            bucket: bucket.into(),
            key: key.into(),
            upload_id: upload_id.into(),
            after,
            limit,
        };
        match self.call(self.owner_of(bucket, key), op).await {
            Reply::Parts(parts, checksum) => Ok((parts, checksum)),
            other => Err(unexpected(other)),
        }
    }

    /// Every shard's metrics snapshot, in shard order (a shard that does
    /// not answer is left out).
    pub async fn metrics_all(self: &Rc<Self>) -> Vec<crate::metrics::ShardSnapshot> {
        let mut snaps = Vec::with_capacity(self.count);
        for reply in self.call_all(|| Op::Metrics).await {
            if let Reply::Metrics(s) = reply {
                snaps.push(*s);
            }
        }
        snaps
    }

    /// Empties every shard's object cache; the number of shards that did.
    pub async fn drop_cache_all(self: &Rc<Self>) -> usize {
        self.call_all(|| Op::DropCache)
            .await
            .iter()
            .filter(|r| matches!(r, Reply::Ok))
            .count()
    }

    /// Tells every shard that start-up is over (the bucket set is
    /// published): they start serving. Run by the bucket-owner shard.
    pub async fn start_all(self: &Rc<Self>) {
        self.call_all(|| Op::Start).await;
    }

    /// Every shard's first `limit` uploads after the markers, in shard
    /// order (the caller merges them).
    pub async fn mpu_list_all(
        self: &Rc<Self>,
        bucket: &str,
        prefix: &str,
        key_marker: &str,
        upload_id_marker: &str,
        limit: usize,
    ) -> Vec<Result<Vec<UploadItem>, ShardError>> {
        let replies = self
            .call_all(|| Op::MpuList {
                bucket: bucket.into(),
                prefix: prefix.into(),
                key_marker: key_marker.into(),
                upload_id_marker: upload_id_marker.into(),
                limit,
            })
            .await;
        replies
            .into_iter()
            .map(|r| match r {
                Reply::Uploads(items) => Ok(items),
                other => Err(unexpected(other)),
            })
            .collect()
    }

    /// The first `max` items after `from` across all shards, in key order,
    /// and whether more follow.
    ///
    /// A k-way merge with a cursor per shard: each shard is asked for about
    /// twice its fair share (`2 * max / shards`, at least 16) and asked again
    /// only when its buffered items run out before the page is full, so a
    /// page costs about `2 * max` items of shard work whatever the shard
    /// count (not `shards * max`).
    pub async fn list_merged(
        self: &Rc<Self>,
        bucket: &str,
        prefix: &str,
        from: &str,
        delimiter: Option<String>,
        max: usize,
        versions: Option<Option<Pick>>,
    ) -> Result<(Vec<ListItem>, bool), ShardError> {
        let n = self.count;
        let batch = (2 * max).div_ceil(n).max(16).min(max + 1);
        let mut cursors: Vec<String> = vec![from.to_string(); n];
        let mut buffered: Vec<VecDeque<ListItem>> = vec![VecDeque::new(); n];
        let mut exhausted = vec![false; n];
        let mut asked = vec![false; n];
        let mut out: Vec<ListItem> = Vec::with_capacity(max.min(1024));
        loop {
            let starved: Vec<usize> = (0..n)
                .filter(|&i| buffered[i].is_empty() && !exhausted[i])
                .collect();
            if !starved.is_empty() {
                let calls = starved.iter().map(|&i| {
                    self.call(
                        i,
                        Op::List {
                            bucket: bucket.to_string(),
                            prefix: prefix.to_string(),
                            start_after: cursors[i].clone(),
                            delimiter: delimiter.clone(),
                            limit: batch,
                            // The version to resume after is in the
                            // caller's marker key only.
                            versions: versions.map(|v| v.filter(|_| !asked[i])),
                        },
                    )
                });
                let replies = futures::future::join_all(calls).await;
                for (&i, reply) in starved.iter().zip(replies) {
                    match reply {
                        Reply::List(items) => {
                            // No-progress guard: a shard's page must be
                            // strictly increasing and after its cursor,
                            // or asking again could loop forever.
                            // (The first page may start with a common
                            // prefix that sorts before the caller's marker.)
                            let mut prev = asked[i].then_some(cursors[i].as_str());
                            for item in &items {
                                if prev.is_some_and(|p| item.name() <= p) {
                                    tracing::error!(
                                        shard = self.id,
                                        peer = i,
                                        "listing made no progress after {prev:?}"
                                    );
                                    return Err(ShardError::Internal(format!(
                                        "shard {i} listed {:?} after {prev:?}: listing made no progress",
                                        item.name()
                                    )));
                                }
                                prev = Some(item.name());
                            }
                            asked[i] = true;
                            // A page that ends on a skip is short, not the end.
                            exhausted[i] = items.len() < batch
                                && !matches!(items.last(), Some(ListItem::Skipped(_)));
                            if versions.is_some() {
                                // A page of versions ends at `batch`
                                // versions, or within a key (then the
                                // caller stops there).
                                let listed: usize = items
                                    .iter()
                                    .map(|i| match i {
                                        ListItem::Versions { versions, .. } => versions.len(),
                                        _ => 1,
                                    })
                                    .sum();
                                let cut = items.last().is_some_and(|i| {
                                    matches!(
                                        i,
                                        ListItem::Versions {
                                            complete: false,
                                            ..
                                        }
                                    )
                                });
                                exhausted[i] = cut || (listed < batch && items.len() < batch);
                            }
                            if let Some(last) = items.last() {
                                cursors[i] = last.name().to_string();
                            }
                            buffered[i].extend(items);
                        }
                        Reply::Err(e) => return Err(e),
                        other => {
                            return Err(ShardError::Internal(format!("unexpected reply {other:?}")))
                        }
                    }
                }
                continue;
            }
            // Every shard has a head item or is exhausted: take the least.
            let Some(i) = (0..n)
                .filter(|&i| !buffered[i].is_empty())
                .min_by(|&a, &b| buffered[a][0].name().cmp(buffered[b][0].name()))
            else {
                return Ok((out, false));
            };
            let item = buffered[i].pop_front().expect("non-empty");
            // Only a cursor: the shard listed nothing up to it.
            if matches!(item, ListItem::Skipped(_)) {
                continue;
            }
            // A common prefix can come from several shards.
            if out.last().is_some_and(|l| l.name() == item.name()) {
                continue;
            }
            if out.len() == max {
                return Ok((out, true));
            }
            out.push(item);
        }
    }
}

/// The sum of every shard's `Reply::Count`, or the first other reply as an
/// error.
fn sum_counts(replies: Vec<Reply>) -> Result<usize, ShardError> {
    let mut sum = 0;
    for r in replies {
        match r {
            Reply::Count(n) => sum += n,
            other => return Err(unexpected(other)),
        }
    }
    Ok(sum)
}
