//! Listing keys in order (with prefix, delimiter and continuation) and
//! counting live objects, from the index alone.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::bucket_config::{CONFIG_NAMESPACE, USERS_NAMESPACE};
use super::buckets::BUCKETS_NAMESPACE;
use super::index::{Entry, State};
use super::versions::{
    group_current, order_in, version_entry, versions_page, KeyGroups, Pick, VersionEntry,
    VERSIONS_PREFIX,
};
use super::{mpu, ListItem, Store};

/// The least string greater than every string that starts with `prefix`,
/// or None if there is none (`prefix` is empty or all U+10FFFF).
///
/// Keys compare byte-wise, which for UTF-8 is code-point order, so the
/// successor is `prefix` with its last character replaced by the next
/// code point (skipping surrogates), after dropping trailing U+10FFFF.
/// Appending `char::MAX` instead (the old rule) is not an upper bound:
/// `"dir/\u{10FFFF}x"` sorts after `"dir/\u{10FFFF}"`, and a listing
/// that resumed there found the same common prefix forever.
pub fn prefix_successor(prefix: &str) -> Option<String> {
    let mut s = prefix.to_string();
    while let Some(last) = s.pop() {
        let next = match last as u32 + 1 {
            0xD800 => Some('\u{E000}'),
            n => char::from_u32(n),
        };
        if let Some(c) = next {
            s.push(c);
            debug_assert!(s.as_str() > prefix && !s.starts_with(prefix));
            return Some(s);
        }
    }
    None
}

/// Keys a listing page passes over because their current version is a
/// delete marker before it ends with `ListItem::Skipped`.
pub const LIST_HIDDEN_MAX: usize = 10_000;

/// Where a listing of `prefix` after `start_after` starts (`resume`: at
/// `start_after` itself, within its versions); None: nothing is left.
fn first_bound(
    prefix: &str,
    start_after: &str,
    delimiter: Option<&str>,
    resume: bool,
) -> Option<Bound<String>> {
    let mut lower: Bound<String> = if resume {
        Bound::Included(start_after.to_string())
    } else if start_after >= prefix {
        Bound::Excluded(start_after.to_string())
    } else {
        Bound::Included(prefix.to_string())
    };
    // A continuation that ends on a common prefix resumes after all of it.
    if let Some(d) = delimiter.filter(|d| !d.is_empty()) {
        if let Some(rest) = start_after.strip_prefix(prefix) {
            if rest.ends_with(d) && !rest.is_empty() {
                lower = Bound::Included(prefix_successor(start_after)?);
            }
        }
    }
    // Keys starting with NUL are internal (multipart state, versions),
    // never listed. Applied last, so that no bound computed above (from a
    // token holding a NUL, say) can reach into them.
    if matches!(&lower, Bound::Included(p) | Bound::Excluded(p) if p.starts_with('\0') || p.is_empty())
    {
        lower = Bound::Included("\u{1}".to_string());
    }
    Some(lower)
}

/// Whether a listing may end on a `Skipped` cursor at `key`: markers stay
/// until removed, so the number a page passes over is bounded, not only
/// the bucket. With a delimiter, never at a key inside a common prefix: a
/// listing resumed there would list that prefix again after its cursor
/// (or, at a key ending with the delimiter, pass over all of it). Hidden
/// keys inside one common prefix are therefore not bounded per page.
fn resumable(key: &str, prefix: &str, delimiter: Option<&str>) -> bool {
    !delimiter
        .filter(|d| !d.is_empty())
        .is_some_and(|d| key[prefix.len()..].contains(d))
}

/// The versions of `key` (after version `after`), at most `left` of them
/// (less what is taken); None if there are none to list.
fn versions_item(
    keys: &BTreeMap<String, Entry>,
    (key, current): (&str, Option<Option<u64>>),
    after: Option<Pick>,
    left: &mut usize,
) -> Option<ListItem> {
    let (page, complete) = versions_page(keys, key, after, *left);
    // Version ids are unique within a key: the current one is latest,
    // wherever the page starts.
    let versions: Vec<VersionEntry> = page
        .into_iter()
        .map(|(v, e)| version_entry(v, e, current == Some(v), order_in(keys, key, v, e)))
        .collect();
    *left -= versions.len();
    (!versions.is_empty()).then(|| ListItem::Versions {
        key: key.to_string(),
        versions,
        complete,
    })
}

impl Store {
    /// Keys of `bucket` in order, after `start_after`, starting with
    /// `prefix`; with a delimiter, keys sharing the part up to the next
    /// delimiter collapse into one `Prefix` item. At most `limit` items.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: &str,
        delimiter: Option<&str>,
        limit: usize,
    ) -> Vec<ListItem> {
        self.list_keys(bucket, prefix, start_after, delimiter, limit, None)
    }

    /// `list`, or with `versions` every version of each key as
    /// `ListItem::Versions` (keys whose versions are all delete markers
    /// included). `versions: Some(Some(v))` resumes within `start_after`,
    /// after its version `v`. A page holds at most `limit` versions.
    pub fn list_keys(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: &str,
        delimiter: Option<&str>,
        limit: usize,
        versions: Option<Option<Pick>>,
    ) -> Vec<ListItem> {
        let index = self.inner.index.borrow();
        let Some(keys) = index.get(bucket) else {
            return Vec::new();
        };
        let mut items = Vec::new();
        let resume_in = match versions {
            Some(Some(v)) if !start_after.is_empty() && start_after >= prefix => Some(v),
            _ => None,
        };
        let mut versions_left = limit;
        let mut hidden = 0;
        let Some(mut lower) = first_bound(prefix, start_after, delimiter, resume_in.is_some())
        else {
            return items;
        };
        'outer: while items.len() < limit {
            let mut range = KeyGroups::new(keys, &lower);
            loop {
                let Some(group) = range.next() else {
                    break 'outer;
                };
                let key = group.0;
                if !key.starts_with(prefix) {
                    break 'outer;
                }
                debug_assert!(!key.starts_with('\0'));
                if key.starts_with('\0') {
                    continue;
                }
                let current = group_current(&group);
                let info = match current.map(|(_, e)| &e.state) {
                    Some(State::Live(info)) => Some(info),
                    _ if versions.is_some() => None,
                    _ => {
                        // A delete marker is current: not listed.
                        hidden += 1;
                        if hidden >= LIST_HIDDEN_MAX && resumable(key, prefix, delimiter) {
                            items.push(ListItem::Skipped(key.to_string()));
                            break 'outer;
                        }
                        continue;
                    }
                };
                if let Some(d) = delimiter.filter(|d| !d.is_empty()) {
                    if let Some(pos) = key[prefix.len()..].find(d) {
                        let common = key[..prefix.len() + pos + d.len()].to_string();
                        let next = prefix_successor(&common);
                        // Every later item sorts after this one: a page
                        // can never hold the same prefix twice.
                        debug_assert!(next.as_deref().is_none_or(|n| n > key));
                        items.push(ListItem::Prefix(common));
                        match next {
                            Some(next) => lower = Bound::Included(next),
                            None => break 'outer,
                        }
                        continue 'outer;
                    }
                }
                if versions.is_some() {
                    let after = resume_in.filter(|_| key == start_after);
                    let current = current.map(|(v, _)| v);
                    let item = versions_item(keys, (key, current), after, &mut versions_left);
                    let cut = matches!(
                        &item,
                        Some(ListItem::Versions {
                            complete: false,
                            ..
                        })
                    );
                    items.extend(item);
                    if cut || versions_left == 0 {
                        break 'outer;
                    }
                } else if let Some(info) = info {
                    items.push(ListItem::Object {
                        key: key.to_string(),
                        size_bytes: info.size_bytes,
                        etag: info.etag.clone(),
                        mtime_ms: info.mtime_ms,
                    });
                }
                if items.len() >= limit {
                    break 'outer;
                }
            }
        }
        items
    }

    /// Versions (objects and delete markers) in `bucket` on this shard:
    /// a bucket holding any is not empty. Multipart uploads and parts are
    /// not objects: DeleteBucket discards them.
    pub fn object_count(&self, bucket: &str) -> usize {
        let index = self.inner.index.borrow();
        index.get(bucket).map_or(0, |keys| {
            keys.iter()
                .filter(|(k, e)| {
                    e.state.is_version()
                        && (!mpu::is_internal_key(k) || k.starts_with(VERSIONS_PREFIX))
                })
                .count()
        })
    }

    /// Keys whose current version is a live object, on this shard, all
    /// buckets (noncurrent versions are not counted).
    pub fn objects_total(&self) -> usize {
        let index = self.inner.index.borrow();
        let first_key = Bound::Included("\u{1}".to_string());
        index
            .iter()
            .filter(|(b, _)| {
                ![BUCKETS_NAMESPACE, CONFIG_NAMESPACE, USERS_NAMESPACE].contains(&b.as_str())
            })
            .map(|(_, keys)| {
                KeyGroups::new(keys, &first_key)
                    .filter(|g| {
                        group_current(g).is_some_and(|(_, e)| matches!(e.state, State::Live(_)))
                    })
                    .count()
            })
            .sum()
    }
}

/// One key of a replication digest (`Store::digest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestItem {
    pub bucket: String,
    pub key: String,
    /// The version's or tombstone's replication stamp.
    pub stamp: u64,
    /// The ETag of a live object; None for a tombstone.
    pub etag: Option<String>,
}

/// Keys a digest examines per call at most (kept or not), so that a
/// shard is not held by one call over a large index.
pub const DIGEST_EXAMINED_MAX: usize = 16_384;

/// A delete marker's ETag in replication digests (`Store::digest`): no
/// client ETag holds a NUL, and a marker is a version that exists, so
/// catch-ups, repairs and drops compare, copy and drop it as they do a
/// live version (a tombstone has none).
pub const MARKER_DIGEST_ETAG: &str = "\0marker";

/// Whether a stored key is replicated (`cluster::replicate`): a client's
/// object key (its null version) or a real version's index key
/// (`\0v/KEY\0ID`, whose KEY is one); not a bucket, configuration or
/// user record, nor an upload or part record (keys starting with a NUL,
/// which no client key holds, other than versions').
#[must_use]
pub fn is_replicated_key(bucket: &str, key: &str) -> bool {
    let plain = match super::versions::split_version_key(key) {
        Some((k, _)) => k,
        None => key,
    };
    !bucket.is_empty() && !bucket.starts_with('\u{1}') && !plain.is_empty() && !plain.contains('\0')
}

impl Store {
    /// The replication digest of replicated keys (`is_replicated_key`:
    /// null versions and real versions, each its own) after `after`, in (bucket,
    /// key) order: those `keep` accepts, at most `limit`, examining at
    /// most `DIGEST_EXAMINED_MAX`. Returns the items and where to resume
    /// (None: the end of the index was reached).
    pub fn digest(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
        keep: impl Fn(&str, &str) -> bool,
    ) -> (Vec<DigestItem>, Option<(String, String)>) {
        let index = self.inner.index.borrow();
        let mut items = Vec::new();
        let mut last = None;
        for (examined, (b, k, e)) in index.walk_after(after).enumerate() {
            if items.len() >= limit.max(1) || examined >= DIGEST_EXAMINED_MAX {
                return (items, last);
            }
            last = Some((b.clone(), k.clone()));
            if !is_replicated_key(b, k) || !keep(b, k) {
                continue;
            }
            let (stamp, etag) = match &e.state {
                State::Live(info) => (info.stamp, Some(info.etag.to_string())),
                State::Deleted { stamp } => (*stamp, None),
                State::Marker { mtime_ms } => (*mtime_ms, Some(MARKER_DIGEST_ETAG.to_string())),
            };
            items.push(DigestItem {
                bucket: b.clone(),
                key: k.clone(),
                stamp,
                etag,
            });
        }
        (items, None)
    }
}
