//! The metadata requests: Stat, Delete, List (merged across shards) and
//! the bucket operations (CreateBucket, ListBuckets), each answered with
//! one Reply that names the key's owner where there is one.

use crate::access::Principal;
use percore_protocol::native::{self as proto, Reply, Status};

use super::{shard_error_reply, NativeFront};
use crate::frontend::common::valid_bucket_name;
use crate::shard::msg::ShardError;
use crate::shard::object::ObjectSource;
use crate::store::versions::Pick;
use crate::store::ListItem;

impl NativeFront {
    /// A Reply naming the shard that owns (bucket, key).
    fn owner_reply(&self, bucket: &str, key: &str) -> Reply {
        Reply {
            owner_shard: self.shard.owner_of(bucket, key) as i32,
            ..Reply::default()
        }
    }

    pub(super) async fn delete(&self, bucket: &str, key: &str) -> Reply {
        if !self.shard.bucket_exists(bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        let reply = self.owner_reply(bucket, key);
        match self.shard.delete_version(bucket, key, Pick::Current).await {
            // In a versioned bucket: the delete marker it wrote.
            Ok(removed) => match self
                .replicated(
                    bucket,
                    &crate::cluster::replicate::index_key_of(key, removed.version_id.as_deref()),
                )
                .await
            {
                Ok(()) => Reply {
                    existed: removed.existed,
                    ..reply
                },
                Err((status, message)) => Reply {
                    owner_shard: reply.owner_shard,
                    ..Reply::error(status, message)
                },
            },
            Err(e) => Reply {
                owner_shard: reply.owner_shard,
                ..shard_error_reply(&e)
            },
        }
    }

    pub(super) async fn stat(&self, bucket: &str, key: &str) -> Reply {
        if !self.shard.bucket_exists(bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        let reply = self.owner_reply(bucket, key);
        match ObjectSource::open(&self.shard, bucket, key).await {
            Ok((_, meta)) => {
                use base64::Engine;
                let crc = meta
                    .headers
                    .iter()
                    .find(|(n, _)| n == "x-amz-checksum-crc32c")
                    .and_then(|(_, v)| base64::engine::general_purpose::STANDARD.decode(v).ok())
                    .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
                    .map_or(0, u32::from_be_bytes);
                Reply {
                    size: meta.size_bytes,
                    etag: meta.etag.clone(),
                    mtime_ms: meta.mtime_ms,
                    content_type: meta.content_type.clone(),
                    crc32c: crc,
                    ..reply
                }
            }
            Err(e) => Reply {
                owner_shard: reply.owner_shard,
                ..shard_error_reply(&e)
            },
        }
    }

    pub(super) async fn list(&self, l: proto::ListRequest) -> Reply {
        if !self.shard.bucket_exists(&l.bucket) {
            return shard_error_reply(&ShardError::NoSuchBucket);
        }
        // A cluster node lists the keys it leads: not while it may not.
        if let Some(map) = self.shard.cluster_map() {
            if let Err(why) = crate::cluster::control::may_lead(&map, None) {
                return Reply::error(Status::Busy, why);
            }
        }
        let limit = match l.limit {
            0 => 1000,
            n => n.min(proto::LIST_LIMIT_MAX),
        } as usize;
        let delimiter = (!l.delimiter.is_empty()).then(|| l.delimiter.clone());
        // A start_after inside a common prefix resumes after the prefix.
        let from = match &delimiter {
            Some(d) if l.start_after.starts_with(&l.prefix) => {
                let rest = &l.start_after[l.prefix.len()..];
                match rest.find(d.as_str()) {
                    // The common prefix itself: the store resumes after
                    // every key under a marker that ends on a delimiter.
                    Some(i) => l.start_after[..l.prefix.len() + i + d.len()].to_string(),
                    None => l.start_after.clone(),
                }
            }
            _ => l.start_after.clone(),
        };
        match self
            .shard
            .list_merged(&l.bucket, &l.prefix, &from, delimiter, limit, None)
            .await
        {
            Ok((items, truncated)) => {
                let next = if truncated {
                    items
                        .last()
                        .map(|i| i.name().to_string())
                        .unwrap_or_default()
                } else {
                    String::new()
                };
                // On a cluster, keys this node holds but does not own (left
                // behind by a placement change: reads go to the owner) are
                // not listed; next_start_after still marks how far it got.
                let listed = |i: &ListItem| match i {
                    ListItem::Object { key, .. } => matches!(
                        self.shard.ownership(&l.bucket, key),
                        crate::shard::Ownership::Mine
                    ),
                    ListItem::Prefix(_) => true,
                    _ => false,
                };
                Reply {
                    entries: items
                        .into_iter()
                        .filter(listed)
                        .map(|i| match i {
                            ListItem::Object {
                                key,
                                size_bytes,
                                etag,
                                mtime_ms,
                            } => proto::ListEntry {
                                key,
                                size: size_bytes,
                                etag: etag.to_string(),
                                mtime_ms,
                                is_prefix: false,
                            },
                            ListItem::Prefix(p)
                            | ListItem::Versions { key: p, .. }
                            | ListItem::Skipped(p) => proto::ListEntry {
                                key: p,
                                is_prefix: true,
                                ..Default::default()
                            },
                        })
                        .collect(),
                    truncated,
                    next_start_after: next,
                    ..Reply::default()
                }
            }
            Err(e) => shard_error_reply(&e),
        }
    }

    pub(super) async fn create_bucket(&self, bucket: String, principal: &Principal) -> Reply {
        if !valid_bucket_name(&bucket) {
            return Reply::error(Status::InvalidBucketName, "bucket names are 3-63 characters of a-z, 0-9, '.' and '-', starting and ending with a letter or digit");
        }
        let owner = match principal {
            Principal::User(name) => Some(&**name),
            _ => None,
        };
        if self.shard.is_cluster() {
            // Recorded in etcd, then applied on every node that is up.
            use crate::cluster::catalog::{self, Change, Outcome};
            let ckey = crate::cluster::peer_http::cluster_key(&self.cfg.credentials.secret_key);
            let change = Change::Create {
                name: bucket,
                owner: owner.map(str::to_string),
            };
            return match catalog::change(&self.shard, &ckey, change).await {
                Ok(Outcome::Done) => Reply::default(),
                Ok(_) => Reply::error(Status::BucketExists, "bucket already exists"),
                Err(e) => Reply::error(Status::Busy, &e),
            };
        }
        match self.shard.create_bucket(&bucket, owner).await {
            Ok(true) => Reply::default(),
            Ok(false) => Reply::error(Status::BucketExists, "bucket already exists"),
            Err(e) => shard_error_reply(&e),
        }
    }

    /// The buckets `principal` owns (all of them for the root principal).
    pub(super) fn list_buckets(&self, principal: &Principal) -> Reply {
        Reply {
            buckets: self
                .shard
                .buckets_of(principal)
                .into_iter()
                .map(|(name, created_ms)| proto::BucketEntry { name, created_ms })
                .collect(),
            ..Reply::default()
        }
    }
}
