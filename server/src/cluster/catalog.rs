//! The cluster's buckets, kept in etcd (the bucket catalog).
//!
//! etcd holds every bucket of a cluster: `buckets/NAME` (its record) and
//! `buckets/NAME/KIND` (each configuration document: owner, policy, ACL,
//! tagging, CORS, lifecycle, versioning), and `catalog`, written by every
//! change (its presence says etcd holds the cluster's buckets). A bucket
//! change is one etcd transaction, conditional on the bucket's record
//! (a create on its absence; a delete or a document on its presence), so
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
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
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
    Delete {
        name: String,
    },
    /// Stores (Some) or removes (None) one configuration document.
    Doc {
        name: String,
        kind: ConfigKind,
        doc: Option<Bytes>,
    },
}

/// What came of a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// A create of a name that exists, owned by this user (None: the root
    /// principal).
    Exists(Option<String>),
    NoSuchBucket,
}

/// A door's change, for the control thread to record (`commit`); the
/// answer: what came of it and etcd's revision after it.
#[derive(Debug, Clone)]
pub struct Ask {
    pub change: Change,
    pub reply: mpsc::Sender<Result<(Outcome, i64), String>>,
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
    pub buckets: BTreeMap<String, Entry>,
}

/// One bucket of a `Catalog`.
#[derive(Debug, Default)]
pub struct Entry {
    /// Its documents, each with its contents if it changed since `since`.
    pub docs: Vec<(ConfigKind, Option<Bytes>)>,
}

/// The catalog's revision applied by this node's bucket-owner shard (0:
/// none yet since start), and whether its next read must carry every
/// document (the shard found one missing that it should have had).
#[derive(Default)]
pub struct Applied {
    pub rev: AtomicI64,
    pub full: AtomicBool,
}

/// This node's `Applied` (one per process: one node).
pub static APPLIED: std::sync::LazyLock<Applied> = std::sync::LazyLock::new(Applied::default);

/// Whether this node has applied the catalog since it started (until then
/// it answers no bucket change and no bucket list).
pub fn ready() -> bool {
    APPLIED.rev.load(Ordering::Acquire) > 0
}

/// Keys per page of a catalog read: the names, and the documents (each at
/// most 256 KiB, base64 in the answer: well under etcd's answer bound).
const NAMES_PAGE: usize = 1000;
const DOCS_PAGE: usize = 32;

/// Records `change` in etcd (on the control thread): what came of it and
/// etcd's revision after it (a change that was done has that revision).
pub fn commit(etcd: &Etcd, keys: &Keys, change: &Change) -> Result<(Outcome, i64), String> {
    let seeded = txn::present(&keys.catalog());
    let stamp = txn::put(&keys.catalog(), b"1");
    let done = match change {
        Change::Create { name, owner } => {
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
            let (done, rev) =
                etcd.txn_rev(vec![seeded, txn::absent(&keys.bucket(name))], ops, vec![])?;
            if done {
                return Ok((Outcome::Done, rev));
            }
            check_seeded(etcd, keys)?;
            let owner = etcd
                .get(&keys.bucket_doc(name, ConfigKind::Owner.name()))?
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
            return Ok((Outcome::Exists(owner), rev));
        }
        Change::Delete { name } => etcd.txn_rev(
            vec![seeded, txn::present(&keys.bucket(name))],
            vec![
                txn::delete(&keys.bucket(name)),
                txn::delete_prefix(&keys.bucket_docs(name)),
                stamp,
            ],
            vec![],
        )?,
        Change::Doc { name, kind, doc } => {
            let key = keys.bucket_doc(name, kind.name());
            let op = match doc {
                Some(d) => txn::put(&key, d),
                None => txn::delete(&key),
            };
            etcd.txn_rev(
                vec![seeded, txn::present(&keys.bucket(name))],
                vec![op, stamp],
                vec![],
            )?
        }
    };
    if done.0 {
        return Ok((Outcome::Done, done.1));
    }
    check_seeded(etcd, keys)?;
    Ok((Outcome::NoSuchBucket, done.1))
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

/// Reads the catalog (on the control thread): every name, and the
/// contents of what changed after `since` (0: everything), all as of one
/// revision.
pub fn read(etcd: &Etcd, keys: &Keys, since: i64) -> Result<Catalog, String> {
    let prefix = keys.buckets();
    let end = prefix_end(&prefix);
    let mut cat = Catalog {
        since,
        ..Catalog::default()
    };
    let mut changed = false;
    let mut from = prefix.clone();
    loop {
        let (kvs, rev, more) = etcd.range_page((&from, &end), NAMES_PAGE, cat.rev, 0, true)?;
        if cat.rev == 0 {
            cat.rev = rev;
        }
        for kv in &kvs {
            let Some((name, kind)) = parse_key(&prefix, &kv.key) else {
                tracing::warn!(key = %String::from_utf8_lossy(&kv.key), "cluster: a bucket catalog key not understood; skipped");
                continue;
            };
            let entry = cat.buckets.entry(name).or_default();
            changed |= kv.mod_revision > since;
            if let Some(kind) = kind {
                entry.docs.push((kind, None));
            }
        }
        match (more, kvs.last()) {
            (true, Some(last)) => {
                from.clone_from(&last.key);
                from.push(0);
            }
            _ => break,
        }
    }
    let catalog_key = keys.catalog();
    let mut catalog_end = catalog_key.clone();
    catalog_end.push(0);
    let (kvs, _, _) = etcd.range_page((&catalog_key, &catalog_end), 1, cat.rev, 0, true)?;
    cat.seeded = !kvs.is_empty();
    if !changed {
        return Ok(cat);
    }
    let mut from = prefix.clone();
    loop {
        let (kvs, _, more) = etcd.range_page((&from, &end), DOCS_PAGE, cat.rev, since, false)?;
        for kv in &kvs {
            let Some((name, Some(kind))) = parse_key(&prefix, &kv.key) else {
                continue;
            };
            if let Some(slot) = cat
                .buckets
                .get_mut(&name)
                .and_then(|e| e.docs.iter_mut().find(|(k, _)| *k == kind))
            {
                slot.1 = Some(Bytes::from(kv.value.clone()));
            }
        }
        match (more, kvs.last()) {
            (true, Some(last)) => {
                from.clone_from(&last.key);
                from.push(0);
            }
            _ => break,
        }
    }
    Ok(cat)
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

/// Seeds the catalog from this node's buckets (on the control thread): a
/// cluster made before the catalog had its buckets on every node. Each
/// bucket and document goes in unless one is there already, and only
/// while the catalog is not marked made; once every bucket of this node
/// went in, it is marked made. Stops after `budget` (the lease renewals
/// share this thread): Ok(false), to go on at the next read.
pub fn seed(
    etcd: &Etcd,
    keys: &Keys,
    buckets: &[BucketDocs],
    budget: Duration,
) -> Result<bool, String> {
    let started = Instant::now();
    for b in buckets {
        if started.elapsed() > budget {
            return Ok(false);
        }
        let record = json!({ "created_ms": super::map::now_ms() }).to_string();
        etcd.txn(
            vec![
                txn::absent(&keys.catalog()),
                txn::absent(&keys.bucket(&b.name)),
            ],
            vec![txn::put(&keys.bucket(&b.name), record.as_bytes())],
            vec![],
        )?;
        for (kind, doc) in &b.docs {
            let key = keys.bucket_doc(&b.name, kind.name());
            etcd.txn(
                vec![txn::absent(&keys.catalog()), txn::absent(&key)],
                vec![txn::put(&key, doc)],
                vec![],
            )?;
        }
    }
    etcd.txn(
        vec![txn::absent(&keys.catalog())],
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

/// Makes this node's buckets the catalog's (bucket-owner shard): creates
/// what it lacks, stores the documents that changed, removes the
/// documents and the buckets the catalog no longer has. A bucket that
/// holds keys here is not removed (a key written while it was deleted:
/// the delete checked every node first): it is logged and stays here
/// until the catalog has it again or it is emptied and the catalog read
/// again.
pub async fn apply(shard: &Rc<Shard>, cat: &Catalog) -> Result<(), String> {
    if !cat.seeded {
        let local = local_buckets(shard).await?;
        let map = shard.cluster_map().ok_or("no cluster map yet")?;
        map.synced_tx
            .send(Report::Seed(local))
            .map_err(|_| "this node's control thread is gone")?;
        return Err("the bucket catalog is being made from the nodes' buckets".into());
    }
    let mut local: BTreeMap<String, Vec<(ConfigKind, Bytes)>> = local_buckets(shard)
        .await?
        .into_iter()
        .map(|b| (b.name, b.docs))
        .collect();
    let mut missing = 0usize;
    let err = |e: ShardError| format!("{e:?}");
    for (name, entry) in &cat.buckets {
        let have = match local.remove(name) {
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
                shard
                    .create_bucket(name, owner.as_deref())
                    .await
                    .map_err(err)?;
                owner
                    .map(|o| vec![(ConfigKind::Owner, Bytes::from(o))])
                    .unwrap_or_default()
            }
        };
        for (kind, doc) in &entry.docs {
            let now = have.iter().find(|(k, _)| k == kind).map(|(_, d)| d);
            match (doc, now) {
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
        match shard.delete_bucket(name).await {
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

/// How often the bucket-owner shard looks for a catalog from the control
/// thread (a door waits for it).
const FEED_POLL: Duration = Duration::from_millis(5);

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
                if cat.rev > APPLIED.rev.load(Ordering::Acquire) {
                    match apply(&shard, &cat).await {
                        Ok(()) => {
                            APPLIED.rev.fetch_max(cat.rev, Ordering::AcqRel);
                            if cat.since == 0 {
                                APPLIED.full.store(false, Ordering::Release);
                            }
                            tracing::debug!(rev = cat.rev, "cluster: bucket catalog applied");
                        }
                        Err(e) => tracing::warn!(error = %e, "cluster: the bucket catalog could not be applied; the next map read tries again"),
                    }
                }
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
    let map = shard
        .cluster_map()
        .ok_or("this node has not read the cluster map yet")?;
    if !ready() {
        return Err("this node has not read the cluster's buckets yet".into());
    }
    let (tx, rx) = mpsc::channel();
    map.synced_tx
        .send(Report::Bucket(Ask { change, reply: tx }))
        .map_err(|_| "this node's control thread is gone")?;
    let until = Instant::now() + CHANGE_WAIT;
    let (outcome, rev) = loop {
        match rx.try_recv() {
            Ok(got) => break got.map_err(|e| format!("etcd did not take the bucket change: {e}"))?,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < until => {
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
            Err(_) => return Err("etcd did not answer the bucket change in time; it may or may not be in force: retry".into()),
        }
    };
    if outcome == Outcome::NoSuchBucket {
        return Ok(outcome);
    }
    // Every node that serves requests applies it before the answer (a
    // create of a name that exists too: it may be a retry of one that
    // did not reach every node).
    let peers: Vec<_> = map
        .nodes
        .iter()
        .filter(|n| n.id != map.node_id && matches!(n.state, NodeState::Up | NodeState::Draining))
        .collect();
    let body = serde_json::to_vec(&json!({ "rev": rev })).expect("serializable");
    let calls = peers.iter().map(|node| {
        let body = &body;
        let map = &map;
        async move {
            let addr = node
                .s3
                .ok_or_else(|| format!("node {} has no usable S3 address", node.name))?;
            let target = "/_percore/catalog";
            let hash = super::peer_http::body_hash(body);
            let mac = super::replicate::sign(ckey, map, node.id, "POST", target, &hash);
            let (status, answer) =
                match super::peer_http::call(ckey, addr, "POST", target, &mac, body, 4096).await {
                    Ok(got) => got,
                    // Nothing listens there: the node is not running, so it
                    // serves nothing stale, and it reads the catalog (this
                    // change in it) before it serves again.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                };
            let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
            if status == 200 && v["applied"].as_i64().is_some_and(|a| a >= rev) {
                Ok(())
            } else {
                Err(format!("{status} {}", String::from_utf8_lossy(&answer)))
            }
        }
    });
    let (here, there) =
        futures::future::join(applied_here(&map, rev), futures::future::join_all(calls)).await;
    here.map_err(|e| format!("the change is in force, but this node: {e}; retry to confirm"))?;
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
