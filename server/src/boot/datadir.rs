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
const FORMAT_VERSION_READ_MIN: u32 = 1;
const FILE_NAME: &str = "percore.meta";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DataMeta {
    pub format_version: u32,
    pub shards: usize,
    pub hash_algorithm: String,
    pub hash_seed: u64,
}

pub fn open_or_create(dir: &Path, shards: usize) -> Result<DataMeta, String> {
    let path = dir.join(FILE_NAME);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mut meta: DataMeta =
                toml::from_str(&text).map_err(|e| format!("{} is damaged: {e}", path.display()))?;
            if !(FORMAT_VERSION_READ_MIN..=FORMAT_VERSION).contains(&meta.format_version) {
                return Err(format!(
                    "{} has format version {}, this percore reads {FORMAT_VERSION}",
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
            if meta.format_version < FORMAT_VERSION {
                meta.format_version = FORMAT_VERSION;
                write_meta(dir, &path, &meta)?;
            }
            Ok(meta)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let meta = DataMeta {
                format_version: FORMAT_VERSION,
                shards,
                hash_algorithm: routing::HASH_ALGORITHM.to_string(),
                hash_seed: routing::HASH_SEED_DEFAULT,
            };
            write_meta(dir, &path, &meta)?;
            Ok(meta)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
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
