//! The cluster's buckets and users, kept in etcd (the catalog).
//!
//! etcd holds every bucket of a cluster: `buckets/NAME` (its record) and
//! `buckets/NAME/KIND` (each configuration document: owner, policy, ACL,
//! tagging, CORS, lifecycle, versioning), every user (`users/NAME`, with
//! its keys), and `catalog`, written by every change (its presence says
//! etcd holds the cluster's buckets and users). A change is one etcd
//! transaction, conditional on the bucket's record or the user's (a
//! create on its absence; a delete or a document on its presence), so
//! etcd decides which of two racing changes wins, on any node, whichever
//! nodes are down. Each node keeps its own copy (the buckets of its
//! store, which its shards serve from) and makes it etcd's: its control
//! thread reads the catalog when it changed (`read`: the names, and the
//! contents of what changed since the copy last applied) and hands it
//! to the bucket-owner shard, which applies the difference (`apply`). A
//! node that was down, cut off or restarted so gets every change it
//! missed, in etcd's order, before it counts as caught up.
//!
//! A door that made a change asks every up or draining node to apply the
//! catalog up to the change's revision and waits for them (`change`), so
//! a request on any such node that starts after the answer sees it. A
//! node that does not answer fails the request (503: the change is in
//! force, and reaches that node at its next map read; retrying confirms
//! it), unless nothing listens at its address (its process is gone: it
//! applies the catalog before it serves again). Down nodes are not asked.
//! A node answers no S3 request before it applied the catalog once since
//! it started.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use percore_protocol::placement::NodeState;
use serde_json::{json, Value};

use super::etcd::{prefix_end, txn, Etcd};
use super::map::Keys;
use super::shardmap::{Report, ShardMap};
use crate::bucket_config::ConfigKind;
use crate::shard::msg::{BucketDocs, ShardError};
use crate::shard::Shard;

/// A bucket change, as a door asks etcd for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Create {
        name: String,
        owner: Option<String>,
    },
    /// `owner`: the bucket's owner as the door authorized the request
    /// against (None: the root principal); a bucket of the name now owned
    /// by another (deleted and made again meanwhile) is not touched.
    /// `epoch`: only while the cluster map is still at this epoch (the
    /// door found every group's acting primary under it empty and closed:
    /// `frontend::s3::cluster`); None: whatever the map.
    Delete {
        name: String,
        owner: Option<String>,
        epoch: Option<u64>,
    },
    /// Stores (Some) or removes (None) one configuration document.
    Doc {
        name: String,
        kind: ConfigKind,
        doc: Option<Bytes>,
        owner: Option<String>,
    },
    /// Adds a user (Some: its record, unless the name exists) or removes
    /// one (None).
    User {
        name: String,
        doc: Option<Bytes>,
    },
}

/// What came of a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// A create of a name that exists; for a bucket, owned by this user
    /// (None: the root principal).
    Exists(Option<String>),
    /// No such bucket (or user).
    Missing,
    /// The bucket is owned by another than the door authorized against
    /// (it was deleted and made again meanwhile).
    Conflict,
    /// The cluster map moved past the epoch the change was made for.
    Moved,
}

/// A door's change, for the control thread to record (`commit`); the
/// answer: what came of it and etcd's revision after it.
#[derive(Debug, Clone)]
pub struct Ask {
    pub change: Change,
    pub reply: mpsc::Sender<Result<Committed, String>>,
    /// Not begun after this (the door has given up and told its client
    /// to retry: a late commit could undo the retry's change).
    pub until: Instant,
}

/// What etcd made of a change (`commit`), as the door needs it to answer.
#[derive(Debug)]
pub struct Committed {
    pub outcome: Outcome,
    /// The catalog's revision with the change (or, not made, the one the
    /// outcome was decided by): every node that serves applies it first.
    pub rev: i64,
    /// The nodes with an `alive/` key at that revision, the others' leases
    /// having lapsed (None: not read). A node not among them answers
    /// nothing by its copy until it has joined again, and it reads the
    /// catalog after it joins (`catalog::serving`; `control`).
    pub alive: Option<std::collections::BTreeSet<u32>>,
}

/// `Committed` for a change `commit` decided with etcd at revision `rev`
/// (made: `rev` is the catalog's; else the catalog's is read, as of
/// `rev`), with the nodes alive then. Without that read, the catalog's
/// revision is taken to be `rev` (later or the same) and no node counts as
/// gone.
pub fn committed(etcd: &Etcd, keys: &Keys, outcome: Outcome, rev: i64) -> Committed {
    let facts = (|| -> Result<(i64, std::collections::BTreeSet<u32>), String> {
        let mut end = keys.catalog();
        end.push(0);
        let (kvs, _, _) = etcd.range_page((&keys.catalog(), &end), 1, rev, true)?;
        let catalog_rev = kvs.first().map_or(rev, |kv| kv.mod_revision);
        let prefix = keys.alives();
        let (mut from, until) = (prefix.clone(), prefix_end(&prefix));
        let mut alive = std::collections::BTreeSet::new();
        loop {
            let (kvs, _, more) = etcd.range_page((&from, &until), NAMES_PAGE, rev, true)?;
            for kv in &kvs {
                if let Some(id) = kv
                    .key
                    .strip_prefix(prefix.as_slice())
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(|k| k.parse::<u32>().ok())
                {
                    alive.insert(id);
                }
            }
            match kvs.last() {
                Some(kv) if more => {
                    from.clone_from(&kv.key);
                    from.push(0);
                }
                _ => return Ok((catalog_rev, alive)),
            }
        }
    })();
    match facts {
        Ok((catalog_rev, alive)) => Committed {
            rev: if outcome == Outcome::Done {
                rev
            } else {
                catalog_rev
            },
            outcome,
            alive: Some(alive),
        },
        Err(e) => {
            tracing::warn!(error = %e, "cluster: cannot read which nodes were alive at a bucket change; every node is waited for");
            Committed {
                outcome,
                rev,
                alive: None,
            }
        }
    }
}

/// The catalog as etcd held it at revision `rev`, for the bucket-owner
/// shard to apply.
#[derive(Debug, Default)]
pub struct Catalog {
    pub rev: i64,
    /// Records and documents changed after this revision carry their
    /// contents; the others are as the shard last applied them.
    pub since: i64,
    /// etcd holds the cluster's buckets (false: a cluster made before the
    /// catalog; its nodes seed it from their own).
    pub seeded: bool,
    /// This node has put its own users in (`seed`; until then its users
    /// are not made the catalog's).
    pub users_seeded: bool,
    pub buckets: BTreeMap<String, Entry>,
    /// Buckets deleted through the catalog within `DELETED_TTL_S` (their
    /// records: `Change::Delete`), with when (the door's clock, ms).
    pub deleted: BTreeMap<String, u64>,
    /// When the read began, by this node's clock (ms since the epoch): a
    /// bucket made here before then and not in the read was deleted, not
    /// made after it.
    pub read_ms: u64,
    /// Every user, with its record if it changed since `since`.
    pub users: BTreeMap<String, Option<Bytes>>,
}

/// One bucket of a `Catalog`.
#[derive(Debug, Default)]
pub struct Entry {
    /// Its documents, each with its contents if it changed since `since`.
    pub docs: Vec<(ConfigKind, Option<Bytes>)>,
    /// When it was made (as the door's clock had it), if its record was
    /// carried (it was made since `since`).
    pub created_ms: Option<u64>,
}

/// The catalog's revision applied by this node's bucket-owner shard (0:
/// none yet since start), and whether its next read must carry every
/// document (the shard found one missing that it should have had).
#[derive(Default)]
pub struct Applied {
    pub rev: AtomicI64,
    pub full: AtomicBool,
    /// The apply running now skipped something (`apply`).
    pub skipped: AtomicBool,
}

/// This node's `Applied` (one per process: one node).
pub static APPLIED: std::sync::LazyLock<Applied> = std::sync::LazyLock::new(Applied::default);

/// The drops of deleted buckets' keys under way (`purge_deleted`).
static PURGING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The token of the hold `purge_deleted` puts on a bucket it drops, and
/// the buckets it holds so (on the bucket-owner shard, which applies the
/// catalog).
pub const PURGE_HOLD: u64 = u64::MAX;
thread_local! {
    static PURGE_HELD: std::cell::RefCell<std::collections::BTreeSet<String>> =
        const { std::cell::RefCell::new(std::collections::BTreeSet::new()) };
}

/// Whether this node may answer another node's digest or fetch (`POST
/// /_percore/digest`, `GET /_percore/fetch`: catch-ups, repairs, drops):
/// only while its copy of the catalog is known current (`serving`: so
/// not before it applied one since it started or joined again, when it
/// may still hold keys of buckets deleted meanwhile), and not while it
/// drops what it holds of a deleted bucket, so that no other node takes
/// those keys from it (and the bucket with them).
pub fn may_source() -> bool {
    serving() && PURGING.load(Ordering::Acquire) == 0
}

/// Whether this node has applied the catalog since it started (until then
/// it answers no bucket change and no bucket list).
pub fn ready() -> bool {
    APPLIED.rev.load(Ordering::Acquire) > 0
}

/// What this node confirmed with etcd about its catalog: a read sent at
/// (`control::mono_ms`) `sent` found the catalog at revision `need`, so a
/// copy with `need` applied is known current until `until` (`sent` plus
/// the map's freshness, `control::map_fresh_ms`). Two such: the last, and
/// the one before it that found an earlier revision, so a node goes on
/// serving its copy while it reads and applies a change it found (a door
/// waits for that earlier one to lapse before it answers without this
/// node's word: the change was made after that read). A sequence lock:
/// the control thread writes, the shards read.
pub struct Fresh {
    seq: AtomicU64,
    need: AtomicI64,
    until: AtomicU64,
    prev_need: AtomicI64,
    prev_until: AtomicU64,
}

/// This node's `Fresh`.
pub static FRESH: Fresh = Fresh {
    seq: AtomicU64::new(0),
    need: AtomicI64::new(0),
    until: AtomicU64::new(0),
    prev_need: AtomicI64::new(0),
    prev_until: AtomicU64::new(0),
};

impl Fresh {
    /// Writes under the lock (one writer: the control thread).
    fn write(&self, f: impl FnOnce(&Fresh)) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        f(self);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// ((need, until), (prev_need, prev_until)), consistent.
    /// (A writer held up mid-write for long: nothing in force.)
    fn read(&self) -> ((i64, u64), (i64, u64)) {
        for _ in 0..10_000 {
            let s = self.seq.load(Ordering::Acquire);
            if s % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let got = (
                (
                    self.need.load(Ordering::Relaxed),
                    self.until.load(Ordering::Relaxed),
                ),
                (
                    self.prev_need.load(Ordering::Relaxed),
                    self.prev_until.load(Ordering::Relaxed),
                ),
            );
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s {
                return got;
            }
        }
        ((0, 0), (0, 0))
    }
}

/// A read of the catalog's revision sent at `sent` found `need` (the
/// control thread, after each successful one).
pub fn confirmed(need: i64, sent: u64, fresh_ms: u64) {
    FRESH.write(|f| {
        let cur = f.need.load(Ordering::Relaxed);
        if need != cur {
            // The last becomes the one before, unless it was never
            // applied and the one before it was (each was read before
            // the changes after it: either stays sound).
            let applied = APPLIED.rev.load(Ordering::Acquire);
            if applied >= cur || applied < f.prev_need.load(Ordering::Relaxed) {
                f.prev_need.store(cur, Ordering::Relaxed);
                f.prev_until
                    .store(f.until.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            f.need.store(need, Ordering::Relaxed);
        }
        f.until
            .store(sent.saturating_add(fresh_ms), Ordering::Relaxed);
    });
}

/// This node's copy of the catalog is not known current any more (it
/// joined again: doors that found it without a lease did not wait for it).
pub fn lapse() {
    FRESH.write(|f| {
        f.until.store(0, Ordering::Relaxed);
        f.prev_until.store(0, Ordering::Relaxed);
    });
}

/// Whether this node may answer requests by its copy of the catalog now:
/// it has applied one since it started, and one that etcd held at a
/// confirmation still in force (`Fresh`); and its lease is confirmed (not
/// while it stops). A door that cannot reach a node to confirm a change
/// waits that long (`change`), so a node that missed a change answers
/// nothing (503) by the time the change is answered, until it has read it.
pub fn serving() -> bool {
    let now = super::control::mono_ms();
    let applied = APPLIED.rev.load(Ordering::Acquire);
    let (cur, prev) = FRESH.read();
    let current = |(need, until): (i64, u64)| now < until && applied >= need;
    ready()
        && (current(cur) || current(prev))
        && super::control::STATUS
            .get()
            .is_some_and(|s| now < s.lead_until_ms.load(Ordering::Acquire))
}

/// Keys per page of a catalog read: the names, and the documents (each at
/// most 256 KiB, base64 in the answer: well under etcd's answer bound).
const NAMES_PAGE: usize = 1000;
const DOCS_PAGE: usize = 32;
/// A seeded bucket's documents go in its record's transaction up to this
/// many bytes (etcd takes requests of 1.5 MiB by default; base64 in JSON).
const SEED_TXN_BYTES: usize = 512 << 10;
/// A read that needs at most this many values gets them one by one.
const VALUE_GETS_MAX: usize = 64;
/// How long the record of a deleted bucket stays in etcd (`apply`: a
/// node that comes back within it drops what it still holds of the
/// bucket; one away longer keeps it, logged: remove it and empty its
/// directory): 7 days.
const DELETED_TTL_S: i64 = 7 * 24 * 3600;

/// Records `change` in etcd (on the control thread): what came of it and
/// etcd's revision after it (a change that was done has that revision).
pub fn commit(etcd: &Etcd, keys: &Keys, change: &Change) -> Result<(Outcome, i64), String> {
    let seeded = txn::present(&keys.catalog());
    let stamp = txn::put(&keys.catalog(), b"1");
    let done = match change {
        Change::Create { name, owner } => return commit_create(etcd, keys, name, owner.as_deref()),
        Change::Delete { name, owner, epoch } => {
            match commit_delete(etcd, keys, name, owner.as_deref(), *epoch)? {
                Ok(done) => done,
                Err(moved) => return Ok(moved),
            }
        }
        Change::User {
            name,
            doc: Some(doc),
        } => {
            let (done, rev) = etcd.txn_rev(
                vec![seeded, txn::absent(&keys.user(name))],
                vec![
                    txn::put(&keys.user(name), doc),
                    txn::delete(&keys.user_removed(name)),
                    stamp,
                ],
                vec![],
            )?;
            if done {
                return Ok((Outcome::Done, rev));
            }
            check_seeded(etcd, keys)?;
            return Ok((Outcome::Exists(None), rev));
        }
        Change::User { name, doc: None } => etcd.txn_rev(
            vec![seeded, txn::present(&keys.user(name))],
            vec![
                txn::delete(&keys.user(name)),
                txn::put(&keys.user_removed(name), b"1"),
                stamp,
            ],
            vec![],
        )?,
        Change::Doc {
            name,
            kind,
            doc,
            owner,
        } => {
            let key = keys.bucket_doc(name, kind.name());
            let op = match doc {
                Some(d) => txn::put(&key, d),
                None => txn::delete(&key),
            };
            etcd.txn_rev(
                vec![
                    seeded,
                    txn::present(&keys.bucket(name)),
                    owned_by(keys, name, owner.as_deref()),
                ],
                vec![op, stamp],
                vec![],
            )?
        }
    };
    if done.0 {
        return Ok((Outcome::Done, done.1));
    }
    check_seeded(etcd, keys)?;
    // Decided by this read: its revision is the one to confirm.
    let (present, rev) = match change {
        Change::Delete { name, .. } | Change::Doc { name, .. } => {
            let (kvs, rev) = etcd.range(&keys.bucket(name), None)?;
            (!kvs.is_empty(), rev)
        }
        _ => (false, done.1),
    };
    Ok((
        if present {
            Outcome::Conflict
        } else {
            Outcome::Missing
        },
        rev,
    ))
}

/// A delete's transaction outcome and revision, or `Outcome::Moved` and
/// the revision it was read at.
type TxnOrMoved = Result<(bool, i64), (Outcome, i64)>;

/// `commit` of a delete.
fn commit_delete(
    etcd: &Etcd,
    keys: &Keys,
    name: &str,
    owner: Option<&str>,
    epoch: Option<u64>,
) -> Result<TxnOrMoved, String> {
    let seeded = txn::present(&keys.catalog());
    let stamp = txn::put(&keys.catalog(), b"1");
    let mut compare = vec![
        seeded,
        txn::present(&keys.bucket(name)),
        owned_by(keys, name, owner),
    ];
    if let Some(e) = epoch {
        compare.push(txn::value_is(&keys.epoch(), e.to_string().as_bytes()));
    }
    // Nodes that hold copies of its keys and were not asked (down, or
    // holding copies of groups that moved away) drop them when they see
    // the record (`apply`). The transaction is the first etcd call (a
    // DeleteBucket's holds must still stand when it is made): the record
    // is put on its lease after it.
    let record = json!({ "deleted_ms": super::map::now_ms() }).to_string();
    let done = etcd.txn_rev(
        compare,
        vec![
            txn::delete(&keys.bucket(name)),
            txn::delete_prefix(&keys.bucket_docs(name)),
            txn::put(&keys.bucket_deleted(name), record.as_bytes()),
            stamp,
        ],
        vec![],
    )?;
    if done.0 {
        let leased = etcd
            .lease_grant(DELETED_TTL_S)
            .and_then(|lease| etcd.put(&keys.bucket_deleted(name), record.as_bytes(), lease));
        if let Err(e) = leased {
            tracing::warn!(bucket = name, error = %e, "cluster: the record of a deleted bucket is kept without its lease (it stays in etcd until removed by hand)");
        }
        return Ok(Ok(done));
    }
    if let Some(e) = epoch {
        // Moved only while the bucket is there: a transaction the etcd
        // client sent again to another member after the first took it
        // fails its compares, and the delete is in force (the door must
        // wait for the nodes to apply it, not end its holds).
        let (kvs, rev) = etcd.range(&keys.epoch(), None)?;
        let (bucket, _) = etcd.range(&keys.bucket(name), None)?;
        if !bucket.is_empty()
            && kvs
                .first()
                .is_none_or(|kv| kv.value != e.to_string().as_bytes())
        {
            return Ok(Err((Outcome::Moved, rev)));
        }
    }
    Ok(Ok(done))
}

/// The compare that bucket `name` is owned by `owner` (None: the root
/// principal: no owner document).
fn owned_by(keys: &Keys, name: &str, owner: Option<&str>) -> Value {
    let key = keys.bucket_doc(name, ConfigKind::Owner.name());
    match owner {
        Some(o) => txn::value_is(&key, o.as_bytes()),
        None => txn::absent(&key),
    }
}

/// `commit` of a create.
fn commit_create(
    etcd: &Etcd,
    keys: &Keys,
    name: &str,
    owner: Option<&str>,
) -> Result<(Outcome, i64), String> {
    let seeded = txn::present(&keys.catalog());
    let stamp = txn::put(&keys.catalog(), b"1");
    let record = json!({ "created_ms": super::map::now_ms() }).to_string();
    // No document of an earlier bucket of the name may stay (there
    // should be none: a delete takes them). The owner's key is
    // left out of the deletes, which may not overlap the put.
    let docs = keys.bucket_docs(name);
    let owner_key = keys.bucket_doc(name, ConfigKind::Owner.name());
    let mut after_owner = owner_key.clone();
    after_owner.push(0);
    let mut ops = vec![
        txn::put(&keys.bucket(name), record.as_bytes()),
        txn::delete_range(&docs, &owner_key),
        txn::delete_range(&after_owner, &prefix_end(&docs)),
        stamp,
    ];
    ops.push(match owner {
        Some(o) => txn::put(&owner_key, o.as_bytes()),
        None => txn::delete(&owner_key),
    });
    let (done, rev) = etcd.txn_rev(vec![seeded, txn::absent(&keys.bucket(name))], ops, vec![])?;
    if done {
        return Ok((Outcome::Done, rev));
    }
    check_seeded(etcd, keys)?;
    // The owner as of this read (its revision is the one to confirm).
    let (kvs, rev) = etcd.range(&keys.bucket_doc(name, ConfigKind::Owner.name()), None)?;
    let owner = kvs
        .first()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
    Ok((Outcome::Exists(owner), rev))
}

fn check_seeded(etcd: &Etcd, keys: &Keys) -> Result<(), String> {
    match etcd.get(&keys.catalog())? {
        Some(_) => Ok(()),
        None => Err("the cluster's bucket catalog is being made from its nodes' buckets (a cluster made by an older percore); retry in a few seconds".into()),
    }
}

/// The catalog's revision now (0: none: a cluster made before it).
pub fn revision(etcd: &Etcd, keys: &Keys) -> Result<i64, String> {
    Ok(etcd.get(&keys.catalog())?.map_or(0, |kv| kv.mod_revision))
}

/// Keys with their modification revisions.
type Listed = Vec<(Vec<u8>, i64)>;

/// Every key under `prefix` (with its modification revision) as of
/// revision `rev` (0: now), in pages; and that revision.
fn list(etcd: &Etcd, prefix: &[u8], rev: i64) -> Result<(Listed, i64), String> {
    let end = prefix_end(prefix);
    let mut out = Vec::new();
    let mut at = rev;
    let mut from = prefix.to_vec();
    loop {
        let (kvs, got, more) = etcd.range_page((&from, &end), NAMES_PAGE, at, true)?;
        if at == 0 {
            at = got;
        }
        out.extend(kvs.iter().map(|kv| (kv.key.clone(), kv.mod_revision)));
        match (more, kvs.last()) {
            (true, Some(last)) => {
                from.clone_from(&last.key);
                from.push(0);
            }
            _ => return Ok((out, at)),
        }
    }
}

/// The values of `wanted` (keys under `prefix`) as of revision `rev`: a
/// few one by one, more by reading the prefix in pages (a filtered range
/// would make etcd load every value of it for each page).
fn values(
    etcd: &Etcd,
    prefix: &[u8],
    wanted: &[&[u8]],
    rev: i64,
) -> Result<std::collections::HashMap<Vec<u8>, Bytes>, String> {
    let mut out = std::collections::HashMap::new();
    if wanted.len() <= VALUE_GETS_MAX {
        for key in wanted {
            let mut end = key.to_vec();
            end.push(0);
            let (kvs, _, _) = etcd.range_page((key, &end), 1, rev, false)?;
            if let Some(kv) = kvs.into_iter().next() {
                out.insert(kv.key, Bytes::from(kv.value));
            }
        }
        return Ok(out);
    }
    let wanted: std::collections::HashSet<&[u8]> = wanted.iter().copied().collect();
    let end = prefix_end(prefix);
    let mut from = prefix.to_vec();
    loop {
        let (kvs, _, more) = etcd.range_page((&from, &end), DOCS_PAGE, rev, false)?;
        let last = kvs.last().map(|kv| kv.key.clone());
        for kv in kvs {
            if wanted.contains(kv.key.as_slice()) {
                out.insert(kv.key, Bytes::from(kv.value));
            }
        }
        match (more, last) {
            (true, Some(last)) => {
                from = last;
                from.push(0);
            }
            _ => return Ok(out),
        }
    }
}

/// Reads the catalog (on the control thread): every name, and the
/// contents of what changed after `since` (0: everything), all as of one
/// revision.
pub fn read(etcd: &Etcd, keys: &Keys, me: u32, since: i64) -> Result<Catalog, String> {
    let prefix = keys.buckets();
    let users = keys.users();
    let read_ms = super::map::now_ms();
    let (bucket_keys, rev) = list(etcd, &prefix, 0)?;
    let deleted_prefix = keys.buckets_deleted();
    let (deleted, _) = list(etcd, &deleted_prefix, rev)?;
    let deleted_keys: Vec<Vec<u8>> = deleted.into_iter().map(|(k, _)| k).collect();
    let deleted = values(etcd, &deleted_prefix, &refs(&deleted_keys), rev)?;
    let (user_keys, _) = list(etcd, &users, rev)?;
    let (seeded, _) = list(etcd, &keys.catalog(), rev)?;
    let (mine, _) = list(etcd, &keys.seeded(me), rev)?;
    let mut cat = Catalog {
        rev,
        since,
        seeded: seeded.iter().any(|(k, _)| *k == keys.catalog()),
        users_seeded: mine.iter().any(|(k, _)| *k == keys.seeded(me)),
        deleted: deleted
            .iter()
            .filter_map(|(k, v)| {
                let name = std::str::from_utf8(k.strip_prefix(deleted_prefix.as_slice())?).ok()?;
                let at = serde_json::from_slice::<Value>(v).ok()?["deleted_ms"].as_u64()?;
                crate::frontend::common::valid_bucket_name(name).then(|| (name.to_string(), at))
            })
            .collect(),
        read_ms,
        ..Catalog::default()
    };
    let changed = |all: &Listed| -> Vec<Vec<u8>> {
        all.iter()
            .filter(|(_, m)| *m > since)
            .map(|(k, _)| k.clone())
            .collect()
    };
    let (wanted_b, wanted_u) = (changed(&bucket_keys), changed(&user_keys));
    let got_b = values(etcd, &prefix, &refs(&wanted_b), rev)?;
    let got_u = values(etcd, &users, &refs(&wanted_u), rev)?;
    for (key, _) in &bucket_keys {
        let Some((name, kind)) = parse_key(&prefix, key) else {
            tracing::warn!(key = %String::from_utf8_lossy(key), "cluster: a bucket catalog key not understood; skipped");
            continue;
        };
        let entry = cat.buckets.entry(name).or_default();
        match kind {
            Some(kind) => entry.docs.push((kind, got_b.get(key).cloned())),
            None => {
                entry.created_ms = got_b
                    .get(key)
                    .and_then(|v| serde_json::from_slice::<Value>(v).ok()?["created_ms"].as_u64());
            }
        }
    }
    // Documents without their bucket's record (a seed under way) are not
    // a bucket.
    let records: std::collections::HashSet<String> = bucket_keys
        .iter()
        .filter_map(|(k, _)| match parse_key(&prefix, k) {
            Some((name, None)) => Some(name),
            _ => None,
        })
        .collect();
    cat.buckets.retain(|name, _| records.contains(name));
    for (key, _) in &user_keys {
        match user_of(&users, key) {
            Some(name) => {
                cat.users.insert(name, got_u.get(key).cloned());
            }
            None => {
                tracing::warn!(key = %String::from_utf8_lossy(key), "cluster: a catalog user key not understood; skipped")
            }
        }
    }
    Ok(cat)
}

fn refs(keys: &[Vec<u8>]) -> Vec<&[u8]> {
    keys.iter().map(Vec::as_slice).collect()
}

/// `users/NAME` (None: not a valid user name).
fn user_of(prefix: &[u8], key: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(key.strip_prefix(prefix)?).ok()?;
    crate::access::users::valid_user_name(name).then(|| name.to_string())
}

/// `buckets/NAME` or `buckets/NAME/KIND` (None: not a valid name, or a
/// kind this version does not know).
fn parse_key(prefix: &[u8], key: &[u8]) -> Option<(String, Option<ConfigKind>)> {
    let rest = std::str::from_utf8(key.strip_prefix(prefix)?).ok()?;
    let (name, kind) = match rest.split_once('/') {
        Some((n, k)) => (n, Some(ConfigKind::from_name(k)?)),
        None => (rest, None),
    };
    crate::frontend::common::valid_bucket_name(name).then(|| (name.to_string(), kind))
}

/// A user's name and record.
pub type UserRecord = (String, Bytes);

/// Seeds the catalog from this node's users and buckets (on the control
/// thread of node `me`).
///
/// Users: each node puts its own in once (users were per node before the
/// catalog), each only if the name is not there and was never removed
/// through the catalog, then says so (`seeded/ID`); until then its own
/// users are not made the catalog's. A new node has none.
///
/// Buckets, for a cluster made before the catalog (every node held every
/// bucket): each bucket with its documents goes in unless it is there
/// already (so each round moves on, and each bucket comes whole from one
/// node), only while the catalog is not marked made; the first node to
/// have put all of its own marks it made.
///
/// Stops after `budget` (the map reads share this thread), to go on
/// at the next read. Returns whether the catalog is made and this node's
/// users are in.
pub fn seed(
    etcd: &Etcd,
    keys: &Keys,
    me: u32,
    (buckets, users): (Option<&[BucketDocs]>, Option<&[UserRecord]>),
    budget: Duration,
) -> Result<bool, String> {
    let started = Instant::now();
    let (have_b, rev) = list(etcd, &keys.buckets(), 0)?;
    let (have_u, _) = list(etcd, &keys.users(), rev)?;
    let have: std::collections::HashSet<Vec<u8>> =
        have_b.into_iter().chain(have_u).map(|(k, _)| k).collect();
    if let Some(users) = users {
        for (name, doc) in users {
            let key = keys.user(name);
            if have.contains(&key) {
                continue;
            }
            if started.elapsed() > budget {
                return Ok(false);
            }
            // Into a made catalog it moves the catalog's revision too, so
            // that nodes that applied it already read it again.
            let fresh = || vec![txn::absent(&key), txn::absent(&keys.user_removed(name))];
            let mut made = fresh();
            made.push(txn::present(&keys.catalog()));
            let stamped = vec![txn::put(&key, doc), txn::put(&keys.catalog(), b"1")];
            if !etcd.txn(made, stamped, vec![])? {
                let mut unmade = fresh();
                unmade.push(txn::absent(&keys.catalog()));
                etcd.txn(unmade, vec![txn::put(&key, doc)], vec![])?;
            }
        }
        etcd.put(&keys.seeded(me), b"1", 0)?;
    }
    let Some(buckets) = buckets else {
        return Ok(true);
    };
    let unmade = || txn::absent(&keys.catalog());
    for b in buckets {
        let record_key = keys.bucket(&b.name);
        if have.contains(&record_key) {
            // Another node's (or this one's, with its documents).
            continue;
        }
        if started.elapsed() > budget {
            return Ok(false);
        }
        // When it was made is not known (each node made it at its own
        // time): 0, which no node takes for a later bucket of the name.
        let record = json!({ "created_ms": 0 }).to_string();
        let record_op = txn::put(&record_key, record.as_bytes());
        let docs: Vec<(Vec<u8>, Value)> = b
            .docs
            .iter()
            .map(|(kind, doc)| {
                let key = keys.bucket_doc(&b.name, kind.name());
                let op = txn::put(&key, doc);
                (key, op)
            })
            .collect();
        let size: usize = b.docs.iter().map(|(_, d)| d.len()).sum();
        if size <= SEED_TXN_BYTES {
            // The bucket with its documents in one transaction.
            let mut ops = vec![record_op];
            ops.extend(docs.into_iter().map(|(_, op)| op));
            etcd.txn(vec![unmade(), txn::absent(&record_key)], ops, vec![])?;
        } else {
            // Too large for one request: the documents first (a catalog
            // read takes no document without its record), the record last.
            for (_, op) in docs {
                etcd.txn(vec![unmade()], vec![op], vec![])?;
            }
            etcd.txn(
                vec![unmade(), txn::absent(&record_key)],
                vec![record_op],
                vec![],
            )?;
        }
    }
    etcd.txn(
        vec![unmade()],
        vec![txn::put(&keys.catalog(), b"1")],
        vec![],
    )?;
    Ok(true)
}

/// Every bucket this node holds, with its documents (bucket-owner shard).
async fn local_buckets(shard: &Rc<Shard>) -> Result<Vec<BucketDocs>, String> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let (page, more) = shard
            .bucket_docs(after.clone(), 1 << 20)
            .await
            .map_err(|e| format!("{e:?}"))?;
        after = page.last().map(|b| b.name.clone());
        all.extend(page);
        if !more || after.is_none() {
            return Ok(all);
        }
    }
}

/// Asks the control thread to put this node's buckets (a catalog not made
/// yet) and users (not put in yet) into the catalog (`seed`); Err: the
/// catalog is not applied meanwhile.
async fn ask_seed(shard: &Rc<Shard>, cat: &Catalog) -> Result<(), String> {
    let buckets = if cat.seeded {
        None
    } else {
        Some(local_buckets(shard).await?)
    };
    let users = (!cat.users_seeded).then(|| local_users(shard));
    let map = shard.cluster_map().ok_or("no cluster map yet")?;
    map.synced_tx
        .send(Report::Seed(buckets, users))
        .map_err(|_| "this node's control thread is gone")?;
    Err("this node's users and buckets are being put into the catalog".into())
}

/// Every user this node holds, as stored (its record).
fn local_users(shard: &Rc<Shard>) -> Vec<(String, Bytes)> {
    shard
        .user_list()
        .iter()
        .map(|u| (u.name.clone(), Bytes::from(u.to_doc())))
        .collect()
}

/// Makes this node's users the catalog's (bucket-owner shard): adds or
/// replaces those whose record differs, removes those it no longer has.
/// Returns how many records the read should have carried and did not.
async fn apply_users(shard: &Rc<Shard>, cat: &Catalog) -> Result<usize, String> {
    let skip = |name: &str, why: &str| {
        tracing::warn!(user = %name, "cluster: a catalog user record {why}; skipped");
        // Not here, it would look missing to a read that does not carry
        // it: every read is whole while it stays.
        APPLIED.skipped.store(true, Ordering::Release);
    };
    let mut local: BTreeMap<String, Bytes> = local_users(shard).into_iter().collect();
    let mut missing = 0;
    for (name, doc) in &cat.users {
        let have = local.remove(name);
        match (doc, have) {
            (Some(d), have) if have.as_ref() != Some(d) => {
                let Some(user) = crate::access::users::User::from_doc(d) else {
                    skip(name, "not understood");
                    continue;
                };
                if user.name != *name {
                    skip(name, "that names another user");
                    continue;
                }
                shard
                    .set_user(name, Some(&user))
                    .await
                    .map_err(|e| format!("{e:?}"))?;
            }
            (None, None) => missing += 1,
            _ => {}
        }
    }
    for name in local.keys() {
        shard
            .set_user(name, None)
            .await
            .map_err(|e| format!("{e:?}"))?;
    }
    Ok(missing)
}

/// Makes this node's buckets the catalog's (bucket-owner shard): creates
/// what it lacks, stores the documents that changed, removes the
/// documents and the buckets the catalog no longer has. A bucket the
/// catalog deleted that still holds keys here (this node was down, or
/// holds copies of groups that moved away) goes with them if the catalog
/// recorded the deletion (`purge_deleted`); one it has no record for is
/// not removed: it is logged and stays here until the catalog has it
/// again or it is emptied and the catalog read again.
pub async fn apply(shard: &Rc<Shard>, cat: &Catalog) -> Result<(), String> {
    if !cat.seeded || !cat.users_seeded {
        return ask_seed(shard, cat).await;
    }
    let mut local: BTreeMap<String, Vec<(ConfigKind, Bytes)>> = local_buckets(shard)
        .await?
        .into_iter()
        .map(|b| (b.name, b.docs))
        .collect();
    let created: std::collections::HashMap<String, u64> = shard.bucket_list().into_iter().collect();
    let mut missing = apply_users(shard, cat).await?;
    let err = |e: ShardError| format!("{e:?}");
    for (name, entry) in &cat.buckets {
        let mut have = local.remove(name);
        // A bucket here made well before the catalog's (an earlier bucket
        // of the name, kept because it held keys when it was deleted, or
        // deleted and made again between two reads): it goes first if it
        // is empty or the catalog recorded its deletion; if not, it is
        // left as it is (its keys must not pass to the new bucket's
        // owner) and logged.
        let older = entry.created_ms.filter(|&c| c > 0).is_some_and(|c| {
            created
                .get(name)
                .is_some_and(|&here| here.saturating_add(INCARNATION_SKEW_MS) < c)
        });
        if have.is_some() && older {
            match delete_here(shard, cat, name, created.get(name).copied()).await? {
                Ok(()) | Err(ShardError::NoSuchBucket) => have = None,
                Err(ShardError::BucketNotEmpty) => {
                    tracing::warn!(bucket = %name, "cluster: an earlier bucket of this name still holds keys on this node; the new one is not applied here until they are deleted (looked at again at each catalog change)");
                    // Only a read that carries the record tells the two
                    // apart: every read is whole while it stays.
                    APPLIED.skipped.store(true, Ordering::Release);
                    continue;
                }
                Err(e) => return Err(err(e)),
            }
        }
        if PURGE_HELD.with(|h| h.borrow_mut().remove(name)) {
            // Kept by a drop that did not finish, and the catalog's bucket
            // now (made again): open to clients' writes again.
            shard.reopen_bucket(name, PURGE_HOLD).await;
        }
        let have = match have {
            Some(have) => have,
            None => {
                let owner = match entry.docs.iter().find(|(k, _)| *k == ConfigKind::Owner) {
                    None => None,
                    Some((_, Some(o))) => Some(String::from_utf8_lossy(o).into_owned()),
                    Some((_, None)) => {
                        missing += 1;
                        continue;
                    }
                };
                let made = shard
                    .create_bucket(name, owner.as_deref())
                    .await
                    .map_err(err)?;
                // Made meanwhile by a replica's copy (owned by the root
                // principal): its owner is set below like any document.
                match owner {
                    Some(o) if made => vec![(ConfigKind::Owner, Bytes::from(o))],
                    _ => Vec::new(),
                }
            }
        };
        for (kind, doc) in &entry.docs {
            let now = have.iter().find(|(k, _)| k == kind).map(|(_, d)| d);
            match (doc, now) {
                (Some(d), _) if d.len() > crate::store::bucket_config::CONFIG_DOC_BYTES_MAX => {
                    // Not from a door of this version (they refuse it);
                    // storing it would fail on every read.
                    tracing::warn!(bucket = %name, kind = kind.name(), bytes = d.len(), "cluster: a catalog document too large to store; skipped");
                    APPLIED.skipped.store(true, Ordering::Release);
                }
                (Some(d), now) if now != Some(d) => shard
                    .set_bucket_config(name, *kind, Some(d.clone()))
                    .await
                    .map_err(err)?,
                (None, None) => missing += 1,
                _ => {}
            }
        }
        for (kind, _) in &have {
            if !entry.docs.iter().any(|(k, _)| k == kind) {
                shard
                    .set_bucket_config(name, *kind, None)
                    .await
                    .map_err(err)?;
            }
        }
    }
    for name in local.keys() {
        match delete_here(shard, cat, name, created.get(name).copied()).await? {
            Ok(()) | Err(ShardError::NoSuchBucket) => {}
            Err(ShardError::BucketNotEmpty) => tracing::warn!(
                bucket = %name,
                "cluster: a bucket deleted in the cluster still holds keys on this node; kept here"
            ),
            Err(e) => return Err(err(e)),
        }
    }
    if missing > 0 {
        APPLIED.full.store(true, Ordering::Release);
        return Err(format!(
            "{missing} bucket document(s) the catalog read did not carry; reading it whole"
        ));
    }
    Ok(())
}

/// Deletes `name` here if it holds no key, or if it does and the catalog
/// recorded its deletion (`purge_deleted`).
async fn delete_here(
    shard: &Rc<Shard>,
    cat: &Catalog,
    name: &str,
    created: Option<u64>,
) -> Result<Result<(), ShardError>, String> {
    let deleted = shard.delete_bucket(name).await;
    if deleted == Err(ShardError::BucketNotEmpty)
        && purge_deleted(shard, cat, name, created).await?
    {
        return Ok(Ok(()));
    }
    Ok(deleted)
}

/// Drops what this node holds of `name` and deletes it here, if the
/// catalog recorded its deletion (`Change::Delete`: no acting primary held
/// a key of it then, and none could take a client's write into it until
/// the record was made) and it was made here (`created`) before the read
/// began (not a bucket of the name made since, by a replica's copy that
/// came before this node read the catalog that has it) and before the
/// deletion (by the clocks of this node and the door: one made after it,
/// that an etcd restored from an older snapshot lacks, is not). Ok(true):
/// gone. Otherwise, or if the drop fails (logged), it is kept, logged,
/// as a bucket the catalog lost without a record is.
async fn purge_deleted(
    shard: &Rc<Shard>,
    cat: &Catalog,
    name: &str,
    created: Option<u64>,
) -> Result<bool, String> {
    let Some(&deleted_ms) = cat.deleted.get(name) else {
        return Ok(false);
    };
    // Made here before the deletion (not a bucket of the name made after
    // it that an etcd restored from a snapshot with the record lacks).
    if created.is_none_or(|c| c >= cat.read_ms || c >= deleted_ms) {
        return Ok(false);
    }
    struct Purging;
    impl Drop for Purging {
        fn drop(&mut self) {
            PURGING.fetch_sub(1, Ordering::AcqRel);
        }
    }
    PURGING.fetch_add(1, Ordering::AcqRel);
    let purging = Purging;
    // Closed to clients' writes for good first: if it stays (a copy of
    // a bucket of the name made again, a failed drop), no client's write
    // lands in it to be dropped by a later try. Ended if the catalog has
    // the bucket again and this one is taken for it (`apply`).
    let forever = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
    let _ = shard.close_bucket(name, PURGE_HOLD, forever).await;
    PURGE_HELD.with(|h| h.borrow_mut().insert(name.to_string()));
    let dropped = shard.purge_bucket(name, deleted_ms).await;
    drop(purging);
    let dropped = match dropped {
        Ok(n) => n,
        Err(e) => {
            // Kept (logged by the caller); tried again at the next apply.
            tracing::warn!(bucket = %name, error = ?e, "cluster: could not drop what this node holds of a deleted bucket");
            return Ok(false);
        }
    };
    tracing::info!(bucket = %name, versions = dropped, "cluster: dropped what this node held of a bucket deleted in the cluster while it was not asked");
    match shard.delete_bucket(name).await {
        Ok(()) | Err(ShardError::NoSuchBucket) => Ok(true),
        Err(ShardError::BucketNotEmpty) => Ok(false),
        Err(e) => Err(format!("{e:?}")),
    }
}

/// A bucket made here this much before the catalog's record of it says
/// (clocks of two nodes apart) is an earlier bucket of the name.
/// Wider than the clock difference nodes accept between them (5 min).
const INCARNATION_SKEW_MS: u64 = 10 * 60_000;

/// How often the bucket-owner shard looks for a catalog from the control
/// thread (a door waits for it).
const FEED_POLL: Duration = Duration::from_millis(5);

/// Applies one catalog from the control thread, unless it is older than
/// what was applied, or carries only what changed while every read must
/// be whole (something was skipped: it asks for a whole one instead).
/// The flag that asks for whole reads is set by a skip or a missing
/// document, and cleared only by a whole read applied without skips.
async fn feed_one(shard: &Rc<Shard>, cat: &Catalog) {
    if cat.seeded && cat.rev <= APPLIED.rev.load(Ordering::Acquire) {
        return;
    }
    if cat.seeded && cat.since != 0 && APPLIED.full.load(Ordering::Acquire) {
        if let Some(map) = shard.cluster_map() {
            let _ = map.synced_tx.send(Report::CatalogSync(cat.rev));
        }
        return;
    }
    APPLIED.skipped.store(false, Ordering::Release);
    match apply(shard, cat).await {
        Ok(()) => {
            let skipped = APPLIED.skipped.load(Ordering::Acquire);
            if cat.since == 0 {
                APPLIED.full.store(skipped, Ordering::Release);
            } else if skipped {
                APPLIED.full.store(true, Ordering::Release);
            }
            APPLIED.rev.fetch_max(cat.rev, Ordering::AcqRel);
            tracing::debug!(rev = cat.rev, "cluster: bucket catalog applied");
        }
        Err(e) => {
            tracing::warn!(error = %e, "cluster: the bucket catalog could not be applied; the next map read tries again")
        }
    }
}

/// Keeps applying the catalogs the control thread sends (bucket-owner
/// shard of a cluster node), one at a time, the newest first.
pub fn start_feed(shard: Rc<Shard>, rx: mpsc::Receiver<Arc<Catalog>>) {
    glommio::spawn_local(async move {
        loop {
            let mut latest = None;
            let closed = loop {
                match rx.try_recv() {
                    Ok(c) => latest = Some(c),
                    Err(mpsc::TryRecvError::Empty) => break false,
                    Err(mpsc::TryRecvError::Disconnected) => break true,
                }
            };
            if let Some(cat) = latest {
                feed_one(&shard, &cat).await;
            }
            if closed {
                return;
            }
            glommio::timer::sleep(FEED_POLL).await;
        }
    })
    .detach();
}

/// How long a door waits for etcd, and for each node to apply a change.
const CHANGE_WAIT: Duration = Duration::from_secs(10);
/// How long a door tries to connect to a node that is down in its map
/// (one that came back and serves before the door's map says so must
/// apply the change too).
const DOWN_CONNECT_WAIT: Duration = Duration::from_millis(300);
/// The longest a door waits for the copies of nodes that did not confirm
/// a change to lapse (`change`): its lease's takeover wait, 9.2 s with
/// the default 10 s lease. With a lease so long that the wait would be
/// longer, such a change is answered 503 (its nodes apply it at their
/// next map read), and a node down and unreachable is not waited for.
const EXCUSE_WAIT_MAX: Duration = Duration::from_secs(30);
/// A change the control thread has not begun to record by then is not
/// recorded (the control thread was busy: a slow etcd, a seed).
const COMMIT_BEGIN_WAIT: Duration = Duration::from_secs(4);

/// Waits until this node applied the catalog up to `rev`, asking the
/// control thread to read it (at most `CHANGE_WAIT`).
async fn applied_here(map: &ShardMap, rev: i64) -> Result<(), String> {
    if APPLIED.rev.load(Ordering::Acquire) >= rev {
        return Ok(());
    }
    map.synced_tx
        .send(Report::CatalogSync(rev))
        .map_err(|_| "this node's control thread is gone")?;
    let until = Instant::now() + CHANGE_WAIT;
    while APPLIED.rev.load(Ordering::Acquire) < rev {
        if Instant::now() > until {
            return Err("it has not applied the bucket catalog in time (is etcd slow?)".into());
        }
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// A bucket change on a cluster node: recorded in etcd, then applied on
/// every up or draining node (this one included) before it is answered.
/// Err: why not (503: retry).
pub async fn change(shard: &Rc<Shard>, ckey: &[u8; 32], change: Change) -> Result<Outcome, String> {
    change_by(shard, ckey, change, Instant::now() + COMMIT_BEGIN_WAIT).await
}

/// `change`, not begun by etcd after `begin_by` (nor after
/// `COMMIT_BEGIN_WAIT`).
pub async fn change_by(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    change: Change,
    begin_by: Instant,
) -> Result<Outcome, String> {
    let map = shard
        .cluster_map()
        .ok_or("this node has not read the cluster map yet")?;
    if !ready() {
        return Err("this node has not read the cluster's buckets yet".into());
    }
    let (tx, rx) = mpsc::channel();
    let until = Instant::now() + CHANGE_WAIT;
    map.synced_tx
        .send(Report::Bucket(Ask {
            change,
            reply: tx,
            // Begun by then, it ends within the etcd client's timeouts,
            // which are well under the rest of the wait.
            until: begin_by.min(Instant::now() + COMMIT_BEGIN_WAIT),
        }))
        .map_err(|_| "this node's control thread is gone")?;
    let Committed {
        outcome,
        rev,
        alive,
    } = loop {
        match rx.try_recv() {
            Ok(got) => break got.map_err(|e| format!("etcd did not take the bucket change: {e}"))?,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < until => {
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
            Err(_) => return Err("etcd did not answer the bucket change in time; it may or may not be in force: retry".into()),
        }
    };
    // etcd answered by now: the change (if made) was made before.
    let committed = Instant::now();
    if matches!(outcome, Outcome::Conflict | Outcome::Moved) {
        return Ok(outcome);
    }
    // Every node that serves requests applies it before the answer; also
    // the catalog an answer that it exists or not is based on (a create of
    // a name that exists, a change of one that does not: the client's
    // retry of a change answered 503 learns that it was made).
    let peers: Vec<_> = map
        .nodes
        .iter()
        .filter(|n| {
            n.id != map.node_id
                && matches!(
                    n.state,
                    NodeState::Up | NodeState::Draining | NodeState::Down
                )
                && alive.as_ref().is_none_or(|a| a.contains(&n.id))
        })
        .collect();
    let body = serde_json::to_vec(&json!({ "rev": rev })).expect("serializable");
    // A node that has not confirmed by then answers nothing by its copy
    // of the catalog (`serving`): its last confirmation with etcd was sent
    // before the change was made (else it saw the change and must apply it
    // before it answers), so it lapsed by the time etcd's answer came here
    // plus the map's freshness; the lease margin covers the clocks' rates.
    // Each node's copy lapses within its own lease's freshness: the
    // longest lease in the map counts.
    let ttl_ms = super::control::STATUS
        .get()
        .map_or(u64::MAX / 4, |s| s.ttl_ms.load(Ordering::Relaxed))
        .max(map.nodes.iter().map(|n| n.ttl_ms).max().unwrap_or(0));
    let fenced = Duration::from_millis(super::control::takeover_wait_ms(ttl_ms));
    let excuse_at = (fenced <= EXCUSE_WAIT_MAX).then(|| committed + fenced);
    // A node alive at the change that this door cannot ask (its map does
    // not have it yet, or has it out: it joined, or came back, since) is
    // waited for until its copy lapsed; so is every node when it is not
    // known which were alive.
    let unseen = alive.as_ref().is_none_or(|a| {
        a.iter()
            .any(|id| *id != map.node_id && !peers.iter().any(|n| n.id == *id))
    });
    let unseen_lapsed = async {
        if let (true, Some(at)) = (unseen, excuse_at) {
            sleep_until(at).await;
        }
    };
    let calls = peers
        .iter()
        .map(|node| confirm(ckey, &map, node, &body, rev, excuse_at));
    let ((here, there), ()) = futures::future::join(
        futures::future::join(applied_here(&map, rev), futures::future::join_all(calls)),
        unseen_lapsed,
    )
    .await;
    here.map_err(|e| format!("the change is in force, but this node: {e}; retry to confirm"))?;
    if unseen && excuse_at.is_none() {
        // A lease too long to wait out, and a node this door cannot ask.
        return Err("the change is in force, but a node this door cannot ask yet may not have it; retry to confirm".into());
    }
    for (node, got) in peers.iter().zip(there) {
        got.map_err(|e| {
            format!(
                "the change is in force, but node {} has not applied it yet ({e}); it will at its next map read; retry to confirm",
                node.name
            )
        })?;
    }
    Ok(outcome)
}

/// Asks `node` to apply the catalog up to `rev` and waits for its word
/// (`change`), or until `excuse_at` (see `change`). Without `excuse_at`
/// (a lease too long to wait for), also Ok where nothing listens at its
/// address (the process is gone: it reads the catalog before it serves
/// again; a firewall that rejects looks the same) or it is down in this
/// door's map and takes no connection within `DOWN_CONNECT_WAIT` (its
/// lease lapsed, unless it joined again since, which this door's map
/// does not show yet).
async fn confirm(
    ckey: &[u8; 32],
    map: &ShardMap,
    node: &super::shardmap::MapNode,
    body: &[u8],
    rev: i64,
    excuse_at: Option<Instant>,
) -> Result<(), String> {
    let Some(at) = excuse_at else {
        return ask(ckey, map, node, body, rev, true).await;
    };
    let asked = async { Some(ask(ckey, map, node, body, rev, false).await) };
    let lapsed = async {
        sleep_until(at).await;
        None
    };
    let why = match futures_lite::future::or(asked, lapsed).await {
        Some(Ok(())) => return Ok(()),
        Some(Err(e)) => {
            // Its word will not come: wait for its copy to lapse.
            sleep_until(at).await;
            e
        }
        None => "no answer".into(),
    };
    tracing::warn!(node = %node.name, error = %why, "cluster: a node did not confirm a bucket change; answered once its copy of the catalog lapsed");
    Ok(())
}

/// Sleeps on the shard's timer until `at`.
async fn sleep_until(at: Instant) {
    glommio::timer::sleep(at.saturating_duration_since(Instant::now())).await;
}

/// `confirm`'s request to `node`.
async fn ask(
    ckey: &[u8; 32],
    map: &ShardMap,
    node: &super::shardmap::MapNode,
    body: &[u8],
    rev: i64,
    lenient: bool,
) -> Result<(), String> {
    let addr = node
        .s3
        .ok_or_else(|| format!("node {} has no usable S3 address", node.name))?;
    if node.state == NodeState::Down
        && super::peer_http::open_within(addr, DOWN_CONNECT_WAIT)
            .await
            .is_err()
    {
        // Down in this door's map and not there. (One that runs, its
        // return not yet in this map, is asked.)
        return if lenient {
            Ok(())
        } else {
            Err("down, and takes no connection".into())
        };
    }
    let target = "/_percore/catalog";
    let hash = super::peer_http::body_hash(body);
    let mac = super::replicate::sign(ckey, map, node.id, "POST", target, &hash);
    let call = super::peer_http::call(ckey, addr, "POST", target, &mac, body, 4096);
    let timed = async {
        glommio::timer::sleep(CHANGE_WAIT).await;
        Err(std::io::Error::other("no answer in time"))
    };
    let (status, answer) = match futures_lite::future::or(call, timed).await {
        Ok(got) => got,
        // Nothing listens there (see `confirm`).
        Err(e) if lenient && e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    if status == 200 && v["applied"].as_i64().is_some_and(|a| a >= rev) {
        Ok(())
    } else {
        Err(format!("{status} {}", String::from_utf8_lossy(&answer)))
    }
}

/// Answers `POST /_percore/catalog {"rev": R}` (a door made a bucket
/// change at revision R): once this node applied the catalog up to R,
/// `{"applied": its revision}`.
pub async fn answer_sync(map: &ShardMap, body: &[u8]) -> Result<Value, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SyncRequest {
        rev: i64,
    }
    let req: SyncRequest =
        serde_json::from_slice(body).map_err(|e| format!("bad catalog request: {e}"))?;
    applied_here(map, req.rev).await?;
    Ok(json!({ "applied": APPLIED.rev.load(Ordering::Acquire) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_keys_parse_to_names_and_kinds() {
        let p = b"/percore/c/buckets/";
        assert_eq!(
            parse_key(p, b"/percore/c/buckets/photos"),
            Some(("photos".into(), None))
        );
        assert_eq!(
            parse_key(p, b"/percore/c/buckets/my.bucket-1/policy"),
            Some(("my.bucket-1".into(), Some(ConfigKind::Policy)))
        );
        // A kind a newer version wrote, a bad name, another prefix.
        assert_eq!(parse_key(p, b"/percore/c/buckets/photos/future"), None);
        assert_eq!(parse_key(p, b"/percore/c/buckets/Bad_Name"), None);
        assert_eq!(parse_key(p, b"/percore/d/buckets/photos"), None);
        assert_eq!(parse_key(p, b"/percore/c/buckets/a/b/policy"), None);
    }
}
