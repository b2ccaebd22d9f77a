//! `percore.meta` in the data directory: what the data was written with.
//! Starting with a different shard count would put keys on shards that do
//! not hold them, so it is refused until resharding exists.

use std::path::Path;

use percore_protocol::routing;
use serde::{Deserialize, Serialize};

/// 4: delete markers (record kind 8, S3 versioning), which a percore of
/// format 3 would take for damage and cut off the newest segment as a torn
/// tail. 3: records written now have 4 KiB CRC blocks (`store::record`,
/// `BLOCK_BYTES`); 2: record format version 2 (headers bound to their
/// place). Older directories are read and upgraded in place: this file
/// says 3 from then on, so that a percore that reads only older records
/// refuses the directory instead of cutting the records it cannot read
/// as torn tails (a percore of format 2 takes a 4 KiB-block count for a
/// malformed header).
pub const FORMAT_VERSION: u32 = 4;
/// 5: a cluster node's data (`cluster` below), whose keys are placed by
/// the cluster's seed and placement groups: a percore that reads at most
/// format 4 would open it with single-node routing and miss its keys, so
/// it must refuse it. A single node's data stays at format 4.
pub const CLUSTER_FORMAT_VERSION: u32 = 5;
const FORMAT_VERSION_READ_MIN: u32 = 1;
const FILE_NAME: &str = "percore.meta";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DataMeta {
    pub format_version: u32,
    pub shards: usize,
    pub hash_algorithm: String,
    pub hash_seed: u64,
    /// The cluster this data belongs to (absent: a single node's data).
    /// Keys of a cluster node are placed by the cluster's seed and
    /// placement groups, so data of one kind never opens as the other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterBinding>,
    /// The cluster node this data is, once it joined with it: a node's
    /// directory never starts as another node (absent: not joined yet,
    /// or written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Made for a cluster node that has not joined with it yet: an empty
    /// disk, which joins lacking its groups' writes
    /// (`cluster::map::Joining::fresh`). Cleared once a join recorded
    /// that; a directory written before it was kept is not fresh.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh: bool,
    /// A cluster node's directory's id (random, made with it; given to a
    /// directory of a cluster node made before it was kept when it is
    /// next opened): the node's record names the directory its data is
    /// on, and a node on another one is `empty` (`cluster::map::NodeRecord`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
}

/// A new directory id: 128 random bits, hex.
fn new_disk_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// What a cluster node's data was placed with.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterBinding {
    /// The cluster's name in etcd.
    pub name: String,
    /// Its creation time (ms), telling apart two clusters of one name.
    pub created_ms: u64,
    pub pgs: u32,
    /// Hex (`0x...`): TOML integers stop at 2^63.
    pub seed: String,
}

impl DataMeta {
    /// The seed keys are hashed with: the cluster's in a cluster.
    pub fn seed(&self) -> Result<u64, String> {
        match &self.cluster {
            None => Ok(self.hash_seed),
            Some(c) => c
                .seed
                .strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("percore.meta: bad cluster seed {:?}", c.seed)),
        }
    }
}

/// Opens (or creates) the data directory's meta for `shards` shards, of a
/// single node (`cluster` None) or of a node of `cluster`.
pub fn open_or_create(
    dir: &Path,
    shards: usize,
    cluster: Option<&ClusterBinding>,
) -> Result<DataMeta, String> {
    let path = dir.join(FILE_NAME);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mut meta: DataMeta =
                toml::from_str(&text).map_err(|e| format!("{} is damaged: {e}", path.display()))?;
            if !(FORMAT_VERSION_READ_MIN..=CLUSTER_FORMAT_VERSION).contains(&meta.format_version) {
                return Err(format!(
                    "{} has format version {}, this percore reads up to {CLUSTER_FORMAT_VERSION}",
                    path.display(),
                    meta.format_version
                ));
            }
            if meta.hash_algorithm != routing::HASH_ALGORITHM {
                return Err(format!(
                    "{} uses hash {}, this percore uses {}",
                    path.display(),
                    meta.hash_algorithm,
                    routing::HASH_ALGORITHM
                ));
            }
            if meta.shards != shards {
                return Err(format!(
                    "the data in {} was written by {} shard(s); start with --shards {} (add --unpinned if this machine has fewer cores); changing the shard count (resharding) is not supported yet",
                    dir.display(),
                    meta.shards,
                    meta.shards
                ));
            }
            check_binding(dir, meta.cluster.as_ref(), cluster)?;
            let want = if meta.cluster.is_some() {
                CLUSTER_FORMAT_VERSION
            } else {
                FORMAT_VERSION
            };
            let mut changed = meta.format_version < want;
            meta.format_version = meta.format_version.max(want);
            if meta.cluster.is_some() && meta.disk.is_none() {
                meta.disk = Some(new_disk_id());
                changed = true;
            }
            if changed {
                write_meta(dir, &path, &meta)?;
            }
            Ok(meta)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let meta = DataMeta {
                format_version: if cluster.is_some() {
                    CLUSTER_FORMAT_VERSION
                } else {
                    FORMAT_VERSION
                },
                shards,
                hash_algorithm: routing::HASH_ALGORITHM.to_string(),
                hash_seed: routing::HASH_SEED_DEFAULT,
                cluster: cluster.cloned(),
                node: None,
                fresh: cluster.is_some(),
                disk: cluster.is_some().then(new_disk_id),
            };
            write_meta(dir, &path, &meta)?;
            Ok(meta)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Refuses a cluster node's data started as another node.
pub fn check_node(dir: &Path, meta: &DataMeta, node: &str) -> Result<(), String> {
    match &meta.node {
        Some(n) if n != node => Err(format!(
            "the data in {} is node {n}'s; start it with --node {n}, or give node {node} a data directory of its own (an empty one joins as a replaced disk)",
            dir.display()
        )),
        _ => Ok(()),
    }
}

/// Records that cluster node `node` joined with this data (its join
/// recorded whether the data was fresh): it is that node's from now on,
/// and not fresh.
pub fn joined(dir: &Path, node: &str) -> Result<(), String> {
    let path = dir.join(FILE_NAME);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut meta: DataMeta =
        toml::from_str(&text).map_err(|e| format!("{} is damaged: {e}", path.display()))?;
    check_node(dir, &meta, node)?;
    if meta.node.as_deref() == Some(node) && !meta.fresh {
        return Ok(());
    }
    meta.node = Some(node.to_string());
    meta.fresh = false;
    write_meta(dir, &path, &meta)
}

/// Refuses data placed for another cluster, or for none.
fn check_binding(
    dir: &Path,
    have: Option<&ClusterBinding>,
    want: Option<&ClusterBinding>,
) -> Result<(), String> {
    let d = dir.display();
    match (have, want) {
        (None, None) => Ok(()),
        (Some(h), Some(w)) if h == w => Ok(()),
        (None, Some(w)) => Err(format!(
            "the data in {d} is a single node's; a node joining cluster {} needs an empty --data (moving a node's data into a cluster is not supported yet)",
            w.name
        )),
        (Some(h), None) => Err(format!(
            "the data in {d} belongs to cluster {}; start with --cluster (its etcd endpoints), or use another --data for a single node",
            h.name
        )),
        (Some(h), Some(w)) => Err(format!(
            "the data in {d} belongs to cluster {} (created at {} ms, {} placement groups, seed {}), not to cluster {} (created at {} ms, {} placement groups, seed {}); use another --data",
            h.name, h.created_ms, h.pgs, h.seed, w.name, w.created_ms, w.pgs, w.seed
        )),
    }
}

/// Replaces `path` durably: a temporary file, fsync, rename, fsync of `dir`.
fn write_meta(dir: &Path, path: &Path, meta: &DataMeta) -> Result<(), String> {
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let text = toml::to_string(meta).map_err(|e| e.to_string())?;
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))
}
