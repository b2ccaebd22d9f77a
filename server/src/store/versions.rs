//! Object versions (S3 versioning) on top of the one-version-per-key
//! index.
//!
//! Every version is an index key of its own, so recovery, compaction and
//! tombstones treat it like any object:
//!
//! - the **null version** (every write of a bucket that was never
//!   versioned, and the writes of a suspended one) lives at the plain key,
//!   and a new null version replaces the old one as an overwrite does;
//! - a **real version** (a write while versioning is enabled) lives at
//!   `"\0v/" key "\0" id`, where the id is 16 hex digits of `!seq` of the
//!   version's first record: the versions of a key sort newest first, right
//!   after one another (keys never hold a NUL, so the key ends at the first
//!   one). A later rewrite of a version's metadata (tags) keeps its key, so
//!   it keeps its place;
//! - a **delete marker** is a `DeleteMarker` record, at either place:
//!   indexed as `State::Marker`, it reads as deleted but is kept by
//!   compaction as a live record is;
//! - removing a version for good (DELETE with a versionId) writes an
//!   ordinary tombstone at its place.
//!
//! The **current version** of a key is the newer of its null version (by
//! the seq of its record) and its newest real version (by the seq in its
//! id). A tag rewrite takes a new seq, so the null version's metadata may
//! only be rewritten while it is current (`set_object_header` refuses it
//! otherwise): then no rewrite can make an older null version look newer.
//!
//! A bucket with no real version and no delete marker costs one range
//! probe per lookup (`has_versions`) and behaves exactly as before.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::index::{Entry, State};
use super::record::Kind;
use super::{ObjectInfo, Result, Store, StoreError};

/// Index keys of real versions start with this (inside the reserved
/// namespace of keys starting with NUL).
pub const VERSIONS_PREFIX: &str = "\0v/";

/// A real version's id at or above this is a replication stamp
/// (milliseconds since 1970: a cluster node's versions, whose ids every
/// replica shares and which increase across primaries, `Store::next_stamp`);
/// below it, the seq of the version's first record on this store (a
/// single node, and a cluster node's versions from before ids were
/// stamps). 2^40 ms is November 2004; a store takes no 2^40 seqs.
pub const STAMP_ID_MIN: u64 = 1 << 40;

/// The object key an index key is a version of (itself for a plain key):
/// what places it, on a cluster node's shards and in placement groups.
#[must_use]
pub fn base_key(index_key: &str) -> &str {
    split_version_key(index_key).map_or(index_key, |(key, _)| key)
}

/// The null version's place among its key's real versions (ids), given
/// the newest real version's id: its stamp where ids are stamps (every
/// replica orders them alike), else its record's seq.
fn null_order(null: &Entry, newest_real: Option<u64>) -> u64 {
    match newest_real {
        Some(v) if v >= STAMP_ID_MIN => null.state.stamp(),
        _ => null.seq,
    }
}

/// A version's place among its key's versions (newer is larger).
pub(super) fn order_in(keys: &Keys, key: &str, version: Option<u64>, e: &Entry) -> u64 {
    version.unwrap_or_else(|| null_order(e, newest_real(keys, key).map(|(_, v, _)| v)))
}

/// A bucket's versioning state, as S3 knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Versioning {
    /// Never enabled: every write is the null version.
    #[default]
    Off,
    Enabled,
    /// Writes are the null version again; real versions are kept.
    Suspended,
}

/// Which version a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    Current,
    /// `versionId=null`.
    Null,
    /// A real version: the seq its id encodes.
    Id(u64),
}

impl Pick {
    /// A `versionId` parameter: "null" or 16 lowercase hex digits; None
    /// if it is neither.
    pub fn parse(id: &str) -> Option<Pick> {
        if id == "null" {
            return Some(Pick::Null);
        }
        if id.len() != 16 || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        u64::from_str_radix(id, 16).ok().map(|v| Pick::Id(!v))
    }
}

/// The id S3 shows for a version: "null", or 16 hex digits.
pub fn version_id(version: Option<u64>) -> String {
    match version {
        None => "null".to_string(),
        Some(seq) => format!("{:016x}", !seq),
    }
}

/// The index key of the real version of `key` created at `seq`.
pub fn version_key(key: &str, seq: u64) -> String {
    format!("{VERSIONS_PREFIX}{key}\0{:016x}", !seq)
}

/// (key, seq) of a real version's index key.
pub fn split_version_key(index_key: &str) -> Option<(&str, u64)> {
    let rest = index_key.strip_prefix(VERSIONS_PREFIX)?;
    let (key, id) = rest.split_once('\0')?;
    match Pick::parse(id)? {
        Pick::Id(seq) => Some((key, seq)),
        _ => None,
    }
}

/// A version found for a request.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Where it is in the index.
    pub index_key: String,
    /// None: the null version.
    pub version: Option<u64>,
    /// Some(mtime): a delete marker.
    pub marker: Option<u64>,
    /// The seq of its record (changes when its metadata is rewritten).
    pub seq: u64,
}

/// What a DELETE did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteOutcome {
    /// A version (object or marker) was there to delete or hide.
    pub existed: bool,
    /// The version the answer names (`x-amz-version-id`): the marker
    /// written, or the version removed. None in a bucket never versioned.
    pub version: Option<Option<u64>>,
    /// A delete marker was written, or the version removed was one.
    pub marker: bool,
}

/// One version in a listing, newest first within its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionEntry {
    pub version: Option<u64>,
    /// Its place among the key's versions (newer is larger): a real
    /// version's id, the null version's `null_order`.
    pub order: u64,
    pub latest: bool,
    /// None: a delete marker (then `mtime_ms` is its time).
    pub object: Option<(u64, Box<str>)>,
    pub mtime_ms: u64,
}

type Keys = BTreeMap<String, Entry>;

/// Whether the bucket holds any real version or marker index key.
pub(super) fn has_versions(keys: &Keys) -> bool {
    keys.range::<str, _>((Bound::Included(VERSIONS_PREFIX), Bound::Unbounded))
        .next()
        .is_some_and(|(k, _)| k.starts_with(VERSIONS_PREFIX))
}

/// The newest real version of `key` (object or marker): (index key, seq of
/// its id, entry).
fn newest_real<'a>(keys: &'a Keys, key: &str) -> Option<(&'a str, u64, &'a Entry)> {
    let group = format!("{VERSIONS_PREFIX}{key}\0");
    keys.range::<str, _>((Bound::Included(group.as_str()), Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(&group))
        .filter(|(_, e)| e.state.is_version())
        .find_map(|(k, e)| split_version_key(k).map(|(_, seq)| (k.as_str(), seq, e)))
}

/// The newer of a key's null version and its newest real version.
fn newer<'a>(
    plain: Option<(&'a str, &'a Entry)>,
    real: Option<(&'a str, u64, &'a Entry)>,
) -> Option<(&'a str, Option<u64>, &'a Entry)> {
    match (plain, real) {
        (Some((k, e)), Some((_, vseq, _))) if null_order(e, Some(vseq)) > vseq => {
            Some((k, None, e))
        }
        (_, Some((k, vseq, e))) => Some((k, Some(vseq), e)),
        (Some((k, e)), None) => Some((k, None, e)),
        (None, None) => None,
    }
}

/// The current version of `key`: (index key, version, entry).
pub(super) fn current_in<'a>(
    keys: &'a Keys,
    key: &str,
) -> Option<(&'a str, Option<u64>, &'a Entry)> {
    let plain = keys
        .get_key_value(key)
        .filter(|(_, e)| e.state.is_version())
        .map(|(k, e)| (k.as_str(), e));
    if !has_versions(keys) {
        return plain.map(|(k, e)| (k, None, e));
    }
    newer(plain, newest_real(keys, key))
}

/// Every version of `key`, newest first.
pub(super) fn versions_in<'a>(keys: &'a Keys, key: &str) -> Vec<(Option<u64>, &'a Entry)> {
    versions_page(keys, key, None, usize::MAX).0
}

/// At most `limit` versions of `key`, newest first, after the one `after`
/// names (None: from the newest), and whether no more follow them. Walks
/// only what it returns (and tombstones among them), however many
/// versions the key has. After a null version that is gone since, the
/// walk starts again from the newest real version.
pub(super) fn versions_page<'a>(
    keys: &'a Keys,
    key: &str,
    after: Option<Pick>,
    limit: usize,
) -> (Vec<(Option<u64>, &'a Entry)>, bool) {
    let group = format!("{VERSIONS_PREFIX}{key}\0");
    let null = keys.get(key).filter(|e| e.state.is_version());
    let newest = newest_real(keys, key).map(|(_, v, _)| v);
    let null_at = null.map(|n| null_order(n, newest));
    // Where the walk of real versions starts, and whether the null
    // version is still to come (by its place, `null_order`).
    let (from, mut null_ahead) = match (after, null_at) {
        (None | Some(Pick::Current), _) => (Bound::Included(group.clone()), null.is_some()),
        (Some(Pick::Id(seq)), _) => (
            Bound::Excluded(version_key(key, seq)),
            null_at.is_some_and(|n| n < seq),
        ),
        (Some(Pick::Null), Some(n)) => (Bound::Excluded(version_key(key, n)), false),
        (Some(Pick::Null), None) => (Bound::Included(group.clone()), false),
    };
    let mut reals = keys
        .range::<str, _>((from.as_ref().map(String::as_str), Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(&group))
        .filter(|(_, e)| e.state.is_version())
        .filter_map(|(k, e)| split_version_key(k).map(|(_, seq)| (seq, e)))
        .peekable();
    let mut out = Vec::new();
    while out.len() <= limit {
        let next_real = reals.peek().map(|(seq, _)| *seq);
        if let (Some(n), Some(at)) = (null, null_at) {
            if null_ahead && next_real.is_none_or(|s| s < at) {
                out.push((None, n));
                null_ahead = false;
                continue;
            }
        }
        match reals.next() {
            Some((seq, e)) => out.push((Some(seq), e)),
            None => break,
        }
    }
    let complete = out.len() <= limit;
    out.truncate(limit);
    (out, complete)
}

/// The keys of a bucket from a bound on, each with its null version and
/// its newest real version (at least one of them a version), in key order.
pub(super) struct KeyGroups<'a> {
    keys: &'a Keys,
    plain: std::iter::Peekable<std::collections::btree_map::Range<'a, String, Entry>>,
    /// Next index key of the real-version namespace to look at.
    real_from: Option<String>,
    real_peeked: Option<(&'a str, u64, &'a Entry)>,
}

/// A key with what it holds: (key, null version, newest real version).
pub(super) type KeyGroup<'a> = (&'a str, Option<&'a Entry>, Option<(u64, &'a Entry)>);

impl<'a> KeyGroups<'a> {
    /// `lower` bounds user keys and is at least "\u{1}" (no reserved key).
    pub(super) fn new(keys: &'a Keys, lower: &Bound<String>) -> KeyGroups<'a> {
        let real_from = has_versions(keys).then(|| match lower {
            Bound::Included(k) => format!("{VERSIONS_PREFIX}{k}\0"),
            // Past every version of `k` (the next key is `k` + a char >= 1).
            Bound::Excluded(k) => format!("{VERSIONS_PREFIX}{k}\u{1}"),
            Bound::Unbounded => format!("{VERSIONS_PREFIX}\u{1}"),
        });
        KeyGroups {
            keys,
            plain: keys
                .range::<String, _>((lower.clone(), Bound::Unbounded))
                .peekable(),
            real_from,
            real_peeked: None,
        }
    }

    /// The next key's newest real version.
    fn next_real(&mut self) -> Option<(&'a str, u64, &'a Entry)> {
        loop {
            let from = self.real_from.as_deref()?;
            let (first, _) = self
                .keys
                .range::<str, _>((Bound::Included(from), Bound::Unbounded))
                .next()?;
            if !first.starts_with(VERSIONS_PREFIX) {
                self.real_from = None;
                return None;
            }
            let Some((key, _)) = split_version_key(first) else {
                // Not ours (cannot happen): step over it.
                self.real_from = Some(format!("{first}\0"));
                continue;
            };
            self.real_from = Some(format!("{VERSIONS_PREFIX}{key}\u{1}"));
            if let Some((_, seq, e)) = newest_real(self.keys, key) {
                return Some((key, seq, e));
            }
        }
    }
}

impl<'a> Iterator for KeyGroups<'a> {
    type Item = KeyGroup<'a>;

    fn next(&mut self) -> Option<KeyGroup<'a>> {
        while self
            .plain
            .peek()
            .is_some_and(|(_, e)| !e.state.is_version())
        {
            self.plain.next();
        }
        if self.real_peeked.is_none() {
            self.real_peeked = self.next_real();
        }
        let plain_key = self.plain.peek().map(|(k, _)| k.as_str());
        let real_key = self.real_peeked.map(|(k, _, _)| k);
        match (plain_key, real_key) {
            (None, None) => None,
            (Some(p), r) if r.is_none_or(|r| p < r) => {
                let (k, e) = self.plain.next()?;
                Some((k.as_str(), Some(e), None))
            }
            (p, Some(r)) => {
                let (_, seq, e) = self.real_peeked.take()?;
                let plain = if p == Some(r) {
                    self.plain.next().map(|(_, e)| e)
                } else {
                    None
                };
                Some((r, plain, Some((seq, e))))
            }
            (Some(_), None) => unreachable!("matched by the second arm"),
        }
    }
}

/// The current version of a key group.
pub(super) fn group_current<'a>(group: &KeyGroup<'a>) -> Option<(Option<u64>, &'a Entry)> {
    let (key, plain, real) = *group;
    newer(plain.map(|e| (key, e)), real.map(|(s, e)| (key, s, e))).map(|(_, v, e)| (v, e))
}

/// The largest id at most `bound` of a real version of `key` whose index
/// key is here (tombstoned or not).
fn newest_id_in(keys: &Keys, key: &str, bound: u64) -> Option<u64> {
    let group = format!("{VERSIONS_PREFIX}{key}\0");
    // Ids sort largest first: from `bound`'s place on.
    let from = version_key(key, bound);
    keys.range::<str, _>((Bound::Included(from.as_str()), Bound::Unbounded))
        .next()
        .filter(|(k, _)| k.starts_with(&group))
        .and_then(|(k, _)| split_version_key(k))
        .map(|(_, id)| id)
}

impl Store {
    /// The largest id at most `bound` of a real version of `key` here,
    /// tombstoned or not (`next_stamp`).
    pub(super) fn newest_id(&self, bucket: &str, key: &str, bound: u64) -> Option<u64> {
        let index = self.inner.index.borrow();
        newest_id_in(index.get(bucket)?, key, bound)
    }

    /// Whether `bucket` holds real versions or delete markers here.
    pub fn has_versions(&self, bucket: &str) -> bool {
        let index = self.inner.index.borrow();
        index.get(bucket).is_some_and(has_versions)
    }

    /// The version `pick` names, object or delete marker; None if there
    /// is none.
    pub fn resolve(&self, bucket: &str, key: &str, pick: Pick) -> Option<Resolved> {
        let index = self.inner.index.borrow();
        let keys = index.get(bucket)?;
        let (index_key, version, entry) = match pick {
            Pick::Current => current_in(keys, key)?,
            Pick::Null => {
                let (k, e) = keys.get_key_value(key)?;
                (k.as_str(), None, e)
            }
            Pick::Id(seq) => {
                let (k, e) = keys.get_key_value(&version_key(key, seq))?;
                (k.as_str(), Some(seq), e)
            }
        };
        let marker = match &entry.state {
            State::Live(_) => None,
            State::Marker { mtime_ms } => Some(*mtime_ms),
            State::Deleted { .. } => return None,
        };
        Some(Resolved {
            index_key: index_key.to_string(),
            version,
            marker,
            seq: entry.seq,
        })
    }

    /// The current version's entry, if it is a live object.
    pub(super) fn current_live(&self, bucket: &str, key: &str) -> Option<(u64, ObjectInfo)> {
        let index = self.inner.index.borrow();
        let (_, _, e) = current_in(index.get(bucket)?, key)?;
        match &e.state {
            State::Live(info) => Some((e.seq, info.clone())),
            State::Deleted { .. } | State::Marker { .. } => None,
        }
    }

    /// The current version's info, if it is a live object.
    pub fn current_info(&self, bucket: &str, key: &str) -> Option<ObjectInfo> {
        self.current_live(bucket, key).map(|(_, info)| info)
    }

    /// The index key of the version `pick` names, for a read; errors say
    /// why there is none to read (`NotFound`, `NoSuchVersion`,
    /// `DeleteMarker`).
    pub fn version_to_read(&self, bucket: &str, key: &str, pick: Pick) -> Result<Resolved> {
        let Some(found) = self.resolve(bucket, key, pick) else {
            return Err(match pick {
                Pick::Id(_) => StoreError::NoSuchVersion,
                Pick::Current | Pick::Null => StoreError::NotFound,
            });
        };
        if found.marker.is_some() {
            return Err(StoreError::DeleteMarker {
                version: found.version,
                named: pick != Pick::Current,
            });
        }
        Ok(found)
    }

    /// Every version of `key`, newest first.
    pub fn versions(&self, bucket: &str, key: &str) -> Vec<VersionEntry> {
        let index = self.inner.index.borrow();
        let Some(keys) = index.get(bucket) else {
            return Vec::new();
        };
        versions_in(keys, key)
            .into_iter()
            .enumerate()
            .map(|(i, (version, e))| {
                version_entry(version, e, i == 0, order_in(keys, key, version, e))
            })
            .collect()
    }

    /// DELETE of `key` in a bucket in `mode`, of the version `pick` names.
    pub async fn delete_object(
        &self,
        bucket: &str,
        key: &str,
        mode: Versioning,
        pick: Pick,
    ) -> Result<DeleteOutcome> {
        let existed_live = || self.current_live(bucket, key).is_some();
        match (pick, mode) {
            (Pick::Current, Versioning::Off) => Ok(DeleteOutcome {
                existed: self.delete(bucket, key).await?,
                version: None,
                marker: false,
            }),
            (Pick::Current, _) => {
                let existed = existed_live();
                let real = mode == Versioning::Enabled;
                let seq = self.write_marker(bucket, key, real).await?;
                Ok(DeleteOutcome {
                    existed,
                    version: Some(real.then_some(seq)),
                    marker: true,
                })
            }
            (Pick::Null | Pick::Id(_), _) => {
                let version = match pick {
                    Pick::Id(seq) => Some(seq),
                    _ => None,
                };
                let Some(found) = self.resolve(bucket, key, pick) else {
                    if pick == Pick::Null && self.is_uncertain(bucket, key) {
                        self.write_tombstone(bucket, key, Kind::Tombstone).await?;
                    }
                    return Ok(DeleteOutcome {
                        existed: false,
                        version: Some(version),
                        marker: false,
                    });
                };
                self.write_tombstone(bucket, &found.index_key, Kind::Tombstone)
                    .await?;
                Ok(DeleteOutcome {
                    existed: true,
                    version: Some(version),
                    marker: found.marker.is_some(),
                })
            }
        }
    }
}

/// A listing's view of one version.
pub(super) fn version_entry(
    version: Option<u64>,
    e: &Entry,
    latest: bool,
    order: u64,
) -> VersionEntry {
    let (object, mtime_ms) = match &e.state {
        State::Live(info) => (Some((info.size_bytes, info.etag.clone())), info.mtime_ms),
        State::Marker { mtime_ms } => (None, *mtime_ms),
        State::Deleted { .. } => (None, 0),
    };
    VersionEntry {
        version,
        order,
        latest,
        object,
        mtime_ms,
    }
}

#[cfg(test)]
mod tests;
