//! Messages between shards. Everything here is `Send`: it crosses threads
//! over bounded glommio shared channels, once per hop.

use bytes::Bytes;

use crate::store::checksum::{Algorithm, UploadChecksum};
use crate::store::mpu::{CompletionChecks, PartItem, UploadError, UploadItem};
use crate::store::record::ObjectMeta;
use crate::store::versions::Pick;
use crate::store::{ListItem, ObjectInfo, PutCondition};

pub type SessionId = u64;

#[derive(Debug)]
pub enum Op {
    Head {
        bucket: String,
        key: String,
    },
    ReadOpen {
        bucket: String,
        key: String,
        pick: Pick,
    },
    ReadChunk {
        session: SessionId,
        offset: u64,
        len_bytes: u64,
    },
    ReadClose {
        session: SessionId,
    },
    /// `part`: (upload id, part number) for a multipart part of `key`.
    PutOpen {
        bucket: String,
        key: String,
        meta: ObjectMeta,
        part: Option<(String, u32)>,
        condition: Option<PutCondition>,
    },
    PutData {
        session: SessionId,
        data: Bytes,
    },
    PutFinish {
        session: SessionId,
        etag: String,
        headers: Vec<(String, String)>,
    },
    PutAbort {
        session: SessionId,
    },
    Delete {
        bucket: String,
        key: String,
        pick: Pick,
    },
    /// Replace (Some, URL-encoded) or remove an object's tags.
    SetTags {
        bucket: String,
        key: String,
        pick: Pick,
        tags: Option<String>,
    },
    /// `versions`: None lists current objects; Some lists every version of
    /// each key (`ListItem::Versions`), from `start_after` itself when it
    /// names a version to resume after.
    List {
        bucket: String,
        prefix: String,
        start_after: String,
        delimiter: Option<String>,
        limit: usize,
        versions: Option<Option<Pick>>,
    },
    MpuCreate {
        bucket: String,
        key: String,
        meta: ObjectMeta,
        checksum: Option<UploadChecksum>,
    },
    /// The checksum an upload in progress was created with.
    MpuChecksum {
        bucket: String,
        key: String,
        upload_id: String,
    },
    MpuComplete {
        bucket: String,
        key: String,
        upload_id: String,
        parts: Vec<(u32, String)>,
        checks: Box<CompletionChecks>,
    },
    MpuAbort {
        bucket: String,
        key: String,
        upload_id: String,
    },
    MpuParts {
        bucket: String,
        key: String,
        upload_id: String,
        after: u32,
        limit: usize,
    },
    MpuList {
        bucket: String,
        prefix: String,
        key_marker: String,
        upload_id_marker: String,
        limit: usize,
    },
    /// To the bucket-owner shard; `owner` None: the root principal.
    /// `copy`: made for a replica's copy of a key, not asked by a client
    /// (not noted as a bucket change: `Shard::bucket_touched`).
    BucketCreate {
        name: String,
        owner: Option<String>,
    },
    /// To the bucket-owner shard.
    BucketDelete {
        name: String,
    },
    /// From the bucket-owner shard: `name` now exists (Some) or not (None),
    /// created by `owner` (None: the root principal, or not known yet).
    BucketApply {
        name: String,
        created_ms: Option<u64>,
        owner: Option<String>,
    },
    /// To the bucket-owner shard: store (Some) or remove (None) a user.
    UserSet {
        name: String,
        doc: Option<Bytes>,
    },
    /// From the bucket-owner shard: the user record written at `seq`.
    UserApply {
        name: String,
        seq: u64,
        doc: Option<Bytes>,
    },
    /// From the bucket-owner shard: refuse new PUTs into `name` and report
    /// how many objects (stored or being written) it holds here.
    BucketLock {
        name: String,
    },
    BucketUnlock {
        name: String,
    },
    /// To every shard: refuse clients' writes into `name` until `until`
    /// or a `BucketReopen` with `token` (a cluster DeleteBucket checks it
    /// is empty meanwhile; each hold stands on its own); the writes in
    /// progress here (`Reply::Count`).
    BucketClose {
        name: String,
        token: u64,
        until: std::time::Instant,
    },
    /// To every shard: end the `BucketClose` with `token`.
    BucketReopen {
        name: String,
        token: u64,
    },
    /// To every shard: drop up to 4096 versions of `name` written before
    /// `before_ms` here (`Reply::Count`: how many; 0: none is left).
    BucketPurge {
        name: String,
        before_ms: u64,
    },
    /// To the bucket-owner shard: store (Some) or remove (None) a bucket
    /// configuration document, then apply it everywhere.
    BucketConfigSet {
        name: String,
        kind: crate::bucket_config::ConfigKind,
        doc: Option<Bytes>,
    },
    /// To the bucket-owner shard: the buckets after `after` (by name), each
    /// with its owner and stored documents, until about `budget` bytes of
    /// documents (at least one bucket); `Reply::BucketDocs`.
    BucketDocs {
        after: Option<String>,
        budget: usize,
    },
    /// From the bucket-owner shard: the document written at `seq` for the
    /// bucket created at `created_ms`.
    BucketConfigApply {
        name: String,
        created_ms: u64,
        kind: crate::bucket_config::ConfigKind,
        seq: u64,
        doc: Option<Bytes>,
    },
    /// From the bucket-owner shard at start-up: buckets are published,
    /// start serving.
    Start,
    /// A scrape: this shard's counters.
    Metrics,
    /// Empty the object cache (admin POST /cache/drop).
    DropCache,
    /// Cluster: take a node-to-node MAC once (on the shard the MAC hashes
    /// to, so that a replay is refused whichever shard it reaches).
    TakeNodeMac {
        mac: [u8; 32],
    },
    /// Cluster: the key's replication state here (`Reply::KeyState`).
    KeyState {
        bucket: String,
        key: String,
    },
    /// Cluster: a replica's copy of its primary's delete, stamped; not
    /// written (`Reply::Count(0)`) while the shard's fence is above
    /// `fence_max` (checked with the condition, in the same turn).
    DeleteStamped {
        bucket: String,
        key: String,
        condition: PutCondition,
        fence_max: u64,
        /// A delete marker rather than a tombstone (versioned buckets).
        marker: bool,
    },
    /// Cluster: a page of this shard's replication digest, of the keys in
    /// `pgs` (sorted; None: every group), after raising the fence to
    /// `epoch`.
    Digest {
        after: Option<(String, String)>,
        limit: usize,
        pgs: Option<Vec<u32>>,
        epoch: u64,
    },
    /// Cluster: raise this shard's fence to `epoch` (0: leave it) and
    /// answer it (`Reply::Count`).
    Fence {
        epoch: u64,
    },
}

impl Op {
    /// Buckets, their configurations and users: run by `execute_bucket_op`.
    pub fn is_bucket_op(&self) -> bool {
        matches!(
            self,
            Op::BucketCreate { .. }
                | Op::BucketDelete { .. }
                | Op::BucketApply { .. }
                | Op::BucketLock { .. }
                | Op::BucketUnlock { .. }
                | Op::BucketClose { .. }
                | Op::BucketReopen { .. }
                | Op::BucketPurge { .. }
                | Op::BucketConfigSet { .. }
                | Op::BucketConfigApply { .. }
                | Op::BucketDocs { .. }
                | Op::UserSet { .. }
                | Op::UserApply { .. }
        )
    }
}

#[derive(Debug)]
pub enum Reply {
    Ok,
    Err(ShardError),
    Head(Option<ObjectInfo>),
    Opened {
        session: SessionId,
        meta: ObjectMeta,
        version_id: Option<String>,
    },
    Data(Bytes),
    Session(SessionId),
    /// The object written and the version id to show for it (None: the
    /// bucket was never versioned).
    Put(ObjectInfo, Option<String>),
    Deleted(Removed),
    /// The version an operation acted on (None: never versioned).
    Version(Option<String>),
    List(Vec<ListItem>),
    Created(bool),
    Count(usize),
    Upload(String),
    UploadChecksum(Option<UploadChecksum>),
    /// A completed upload: the object, the version id to show, and its
    /// checksum.
    Completed(ObjectInfo, Option<String>, Option<(Algorithm, String)>),
    Parts(Vec<PartItem>, Option<UploadChecksum>),
    Uploads(Vec<UploadItem>),
    Metrics(Box<crate::metrics::ShardSnapshot>),
    /// A key's (stamp, ETag: None for a tombstone); None: nothing stored.
    /// (stamp, ETag: None for a tombstone or a marker, whether a delete
    /// marker).
    KeyState(Option<(u64, Option<String>, bool)>),
    /// Digest items and where to resume (None: this shard is done).
    Digest(Vec<crate::store::DigestItem>, Option<(String, String)>),
    /// Buckets with their documents ((kind, document) pairs), and whether
    /// more follow.
    BucketDocs(Vec<BucketDocs>, bool),
}

/// A bucket and its configuration documents, as a joining node copies them.
#[derive(Debug, Clone)]
pub struct BucketDocs {
    pub name: String,
    pub docs: Vec<(crate::bucket_config::ConfigKind, Bytes)>,
}

/// Errors that cross shards; mapped to S3 errors by the front door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardError {
    NoSuchKey,
    NoSuchBucket,
    BucketNotEmpty,
    /// Too many sessions or queued bytes: retry later (S3 SlowDown).
    Busy,
    /// A cluster DeleteBucket holds the bucket closed to clients' writes
    /// while it checks that it is empty: retry (S3 SlowDown).
    BucketClosing,
    NoSpace(String),
    Corrupt(String),
    Internal(String),
    ShuttingDown,
    Upload(UploadError),
    PreconditionFailed,
    ConditionalConflict,
    NoSuchVersion,
    /// The version read is a delete marker: named by its id (`named`), or
    /// the current version.
    DeleteMarker {
        version_id: String,
        named: bool,
    },
    NotImplemented(String),
}

/// What a DELETE did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub existed: bool,
    /// The marker written or the version removed (None: never versioned).
    pub version_id: Option<String>,
    /// A delete marker was written or removed.
    pub marker: bool,
}

pub enum Msg {
    Req {
        id: u64,
        op: Op,
        sent: std::time::Instant,
    },
    Resp {
        id: u64,
        reply: Reply,
    },
}
