//! The lifecycle runner: every `interval` each shard walks the buckets
//! whose lifecycle rules it has (see `bucket_config`), expires the objects
//! it owns that a rule says are due, and aborts multipart uploads it owns
//! that were started too long ago. Deletes and aborts are paced at
//! `actions_per_sec` per shard, so a rule that matches millions of keys
//! does not starve the request path.
//!
//! An object is deleted only if it is still the version that was judged
//! (`Store::delete_if_current`): a PUT that lands meanwhile is never undone.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::buckets::WriteInProgress;
use super::Shard;
use crate::bucket_config::lifecycle::{Expiration, Lifecycle, Rule};
use crate::bucket_config::tagging::{TagSet, OBJECT_TAGS_HEADER};
use crate::store::versions::{Pick, VersionEntry, Versioning};
use crate::store::{now_ms, ListItem};

/// Where a key's versions stand when a page ends within them: its last
/// version listed, and how many noncurrent versions came before.
struct Carry {
    key: String,
    last: VersionEntry,
    noncurrent: usize,
}

/// The noncurrent versions among `versions` (newest first; `newer`, the
/// version before them, listed on the page before after `seen` noncurrent
/// ones) that became noncurrent (the next newer one was written) at least
/// the rule's NoncurrentDays ago, are not among the NewerNoncurrentVersions
/// newest noncurrent ones, and match the rule's prefix and size. Returns
/// them and how many noncurrent versions the page held.
fn noncurrent_due(
    rule: &Rule,
    key: &str,
    newer: Option<&VersionEntry>,
    seen: usize,
    versions: &[VersionEntry],
    now: u64,
    day_ms: u64,
) -> (Vec<Option<u64>>, usize) {
    let Some(days) = rule.noncurrent_days else {
        return (Vec::new(), 0);
    };
    let age_ms = u64::from(days).saturating_mul(day_ms);
    let keep = rule.newer_noncurrent.map_or(0, |k| k as usize);
    let newers = newer.into_iter().chain(versions);
    let olders = versions.iter().skip(usize::from(newer.is_none()));
    let mut ordinal = seen;
    let mut due = Vec::new();
    for (newer, v) in newers.zip(olders) {
        if v.latest {
            continue;
        }
        ordinal += 1;
        let size = v.object.as_ref().map_or(0, |(size, _)| *size);
        if ordinal > keep
            && newer.mtime_ms.saturating_add(age_ms) <= now
            && rule.filter.matches(key, size)
        {
            due.push(v.version);
        }
    }
    (due, ordinal - seen)
}

/// The pick that names `version` (None: the null version).
fn pick_of(version: Option<u64>) -> Pick {
    version.map_or(Pick::Null, Pick::Id)
}

/// Keys examined per listing page.
const PAGE_KEYS: usize = 1000;

#[derive(Debug, Clone, Copy)]
pub struct LifecycleSettings {
    /// Time between passes; zero turns the runner off.
    pub interval: Duration,
    /// Deletes plus aborts per second on one shard.
    pub actions_per_sec: u64,
    /// A lifecycle day: 86,400 s but in tests.
    pub day_ms: u64,
    /// A cluster node: the key for copying expiries to the replicas
    /// (`cluster::replicate`; None on a single node).
    pub cluster_key: Option<[u8; 32]>,
}

/// One bucket's rules, as a pass found them.
struct Pass {
    bucket: String,
    created_ms: u64,
    lifecycle: Rc<Lifecycle>,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub expired: u64,
    pub aborted: u64,
}

/// Paces actions to a rate per second.
struct Pacer {
    per_sec: u64,
    window: Instant,
    used: u64,
}

impl Pacer {
    async fn take(&mut self) {
        if self.used >= self.per_sec {
            let elapsed = self.window.elapsed();
            if elapsed < Duration::from_secs(1) {
                glommio::timer::sleep(Duration::from_secs(1) - elapsed).await;
            }
            self.window = Instant::now();
            self.used = 0;
        }
        self.used += 1;
    }
}

impl Shard {
    /// Starts this shard's runner (nothing if the interval is zero).
    pub fn start_lifecycle(self: &Rc<Self>, settings: LifecycleSettings) {
        if settings.interval.is_zero() {
            return;
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(settings.interval).await;
                let report = me.lifecycle_pass(&settings).await;
                if report != PassReport::default() {
                    tracing::info!(
                        shard = me.id,
                        expired = report.expired,
                        aborted_uploads = report.aborted,
                        "lifecycle pass"
                    );
                }
            }
        })
        .detach();
    }

    /// One pass over every bucket with lifecycle rules.
    pub async fn lifecycle_pass(self: &Rc<Self>, settings: &LifecycleSettings) -> PassReport {
        let buckets: Vec<Pass> = self
            .buckets
            .borrow()
            .iter()
            .filter_map(|(name, view)| {
                Some(Pass {
                    bucket: name.clone(),
                    created_ms: view.created_ms,
                    lifecycle: view.config.lifecycle.clone()?,
                })
            })
            .collect();
        let mut pacer = Pacer {
            per_sec: settings.actions_per_sec.max(1),
            window: Instant::now(),
            used: 0,
        };
        let mut report = PassReport::default();
        for pass in &buckets {
            for rule in pass.lifecycle.enabled() {
                let now = now_ms();
                if rule.expiration.is_some() {
                    report.expired += self.expire(pass, rule, now, settings, &mut pacer).await;
                }
                if self.versioning(&pass.bucket) != Versioning::Off
                    || self.store.has_versions(&pass.bucket)
                {
                    report.expired += self
                        .expire_versions(pass, rule, now, settings, &mut pacer)
                        .await;
                }
                if let Some(days) = rule.abort_incomplete_days {
                    let age_ms = u64::from(days).saturating_mul(settings.day_ms);
                    report.aborted += self
                        .abort_old_uploads(pass, rule, now, age_ms, &mut pacer)
                        .await;
                }
            }
        }
        let m = self.metrics();
        m.lifecycle_expired
            .set(m.lifecycle_expired.get() + report.expired);
        m.lifecycle_aborted
            .set(m.lifecycle_aborted.get() + report.aborted);
        m.lifecycle_passes.set(m.lifecycle_passes.get() + 1);
        report
    }

    /// Whether the bucket still has the rules this pass runs: a pass can
    /// take hours, and a rule removed or narrowed meanwhile, or a bucket
    /// deleted and created again (perhaps by someone else), stops it.
    fn still_current(&self, pass: &Pass) -> bool {
        self.buckets.borrow().get(&pass.bucket).is_some_and(|b| {
            b.created_ms == pass.created_ms
                && !b.locked
                && b.config
                    .lifecycle
                    .as_ref()
                    .is_some_and(|l| Rc::ptr_eq(l, &pass.lifecycle))
        })
    }

    /// Whether the version `pick` names, of record `seq` (None: any), has
    /// every tag the rule asks for.
    async fn has_rule_tags(
        &self,
        bucket: &str,
        key: &str,
        pick: Pick,
        seq: Option<u64>,
        rule: &Rule,
    ) -> bool {
        let Ok(found) = self.store.version_to_read(bucket, key, pick) else {
            return false;
        };
        let Ok(reader) = self.store.open_read(bucket, &found.index_key).await else {
            return false;
        };
        if seq.is_some_and(|seq| reader.seq != seq) {
            return false; // Rewritten since it was judged: the next pass.
        }
        let tags = reader
            .meta
            .headers
            .iter()
            .find(|(n, _)| n == OBJECT_TAGS_HEADER)
            .and_then(|(_, v)| TagSet::parse_query(v, usize::MAX).ok())
            .unwrap_or_default();
        tags.contains_all(&rule.filter.tags)
    }

    async fn expire(
        self: &Rc<Self>,
        pass: &Pass,
        rule: &Rule,
        now: u64,
        settings: &LifecycleSettings,
        pacer: &mut Pacer,
    ) -> u64 {
        let bucket = pass.bucket.as_str();
        let mut expired = 0;
        let mut after = String::new();
        loop {
            if !self.still_current(pass) {
                return expired;
            }
            let page = self
                .store
                .list(bucket, &rule.filter.prefix, &after, None, PAGE_KEYS);
            let Some(last) = page.last() else {
                break;
            };
            after = last.name().to_string();
            // A pass over millions of keys that are not due must not hold
            // the shard: requests run between pages.
            glommio::yield_if_needed().await;
            for item in page {
                let ListItem::Object { key, .. } = item else {
                    continue;
                };
                // Judged on the current version, read now (the page may
                // be old); deleted only if that version is still current
                // when the tombstone's seq is taken (`delete_if_current`), so
                // a write that lands meanwhile is never undone.
                let Some((seq, mtime_ms, size_bytes)) = self.store.live_version(bucket, &key)
                else {
                    continue;
                };
                // A cluster node expires only keys whose group it leads
                // (the others' primaries do theirs), and copies each
                // expiry like any delete.
                if !matches!(self.ownership(bucket, &key), super::Ownership::Mine) {
                    continue;
                }
                if !rule.filter.matches(&key, size_bytes)
                    || rule
                        .expires_at_ms(mtime_ms, settings.day_ms)
                        .is_none_or(|at| at > now)
                {
                    continue;
                }
                // Reading the tags is a device read: paced like a delete.
                if !rule.filter.tags.is_empty() {
                    pacer.take().await;
                    if !self
                        .has_rule_tags(bucket, &key, Pick::Current, Some(seq), rule)
                        .await
                    {
                        continue;
                    }
                }
                pacer.take().await;
                if !self.still_current(pass) {
                    return expired;
                }
                let mode = self.versioning(bucket);
                // A delete marker is a version: a write for DeleteBucket.
                let _writing =
                    (mode != Versioning::Off).then(|| WriteInProgress::new(self, bucket));
                match self.store.delete_if_current(bucket, &key, seq, mode).await {
                    Ok(Some(written)) => {
                        expired += 1;
                        if let Some(ckey) = &settings.cluster_key {
                            if let Err(e) =
                                crate::cluster::replicate::replicate(self, ckey, bucket, &written)
                                    .await
                            {
                                // The next primary's repair settles it.
                                tracing::warn!(bucket, key, "lifecycle expiry not copied: {e}");
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(
                            shard = self.id,
                            bucket,
                            key,
                            "lifecycle expiry failed: {e}"
                        );
                        return expired;
                    }
                }
            }
        }
        expired
    }

    /// In a versioned bucket: removes for good the noncurrent versions
    /// that became noncurrent (a newer version was written) more than
    /// `NoncurrentDays` ago, and, with `ExpiredObjectDeleteMarker`, delete
    /// markers that are the only version of their key.
    async fn expire_versions(
        self: &Rc<Self>,
        pass: &Pass,
        rule: &Rule,
        now: u64,
        settings: &LifecycleSettings,
        pacer: &mut Pacer,
    ) -> u64 {
        let bucket = pass.bucket.as_str();
        let lone_markers = rule.expiration == Some(Expiration::DeleteMarkersOnly);
        if !lone_markers && rule.noncurrent_days.is_none() {
            return 0;
        }
        let mut removed = 0;
        let (mut after, mut resume) = (String::new(), None);
        // A key cut by the page before: the next page judges its first
        // version against the last one, and goes on counting.
        let mut carry: Option<Carry> = None;
        loop {
            if !self.still_current(pass) {
                return removed;
            }
            let page = self.store.list_keys(
                bucket,
                &rule.filter.prefix,
                &after,
                None,
                PAGE_KEYS,
                Some(resume),
            );
            let Some(last) = page.last() else {
                break;
            };
            let mut cut = match last {
                ListItem::Versions {
                    key,
                    versions,
                    complete: false,
                } => versions.last().map(|v| Carry {
                    key: key.clone(),
                    last: v.clone(),
                    noncurrent: 0,
                }),
                _ => None,
            };
            // By place, not by id: the null version may be gone by then.
            resume = cut.as_ref().map(|c| Pick::Id(c.last.order));
            after = last.name().to_string();
            glommio::yield_if_needed().await;
            for item in page {
                let ListItem::Versions { key, versions, .. } = item else {
                    continue;
                };
                // A cluster node expires only versions of keys whose group
                // it leads, and copies each removal like any delete.
                if !matches!(self.ownership(bucket, &key), super::Ownership::Mine) {
                    carry = None;
                    continue;
                }
                let before = carry.take().filter(|c| {
                    c.key == key && versions.first().is_none_or(|v| v.order < c.last.order)
                });
                let seen = before.as_ref().map_or(0, |c| c.noncurrent);
                let (mut doomed, noncurrent) = noncurrent_due(
                    rule,
                    &key,
                    before.as_ref().map(|c| &c.last),
                    seen,
                    &versions,
                    now,
                    settings.day_ms,
                );
                if let Some(c) = cut.as_mut().filter(|c| c.key == key) {
                    c.noncurrent = seen + noncurrent;
                }
                if lone_markers
                    && versions.len() == 1
                    && versions[0].latest
                    && versions[0].object.is_none()
                    && rule.filter.tags.is_empty()
                    && rule.filter.matches(&key, 0)
                {
                    doomed.push(versions[0].version);
                }
                for version in doomed {
                    let ckey = settings.cluster_key.as_ref();
                    match self
                        .remove_version(pass, rule, (&key, version), ckey, pacer)
                        .await
                    {
                        Some(true) => removed += 1,
                        Some(false) => {}
                        None => return removed,
                    }
                }
            }
            carry = cut;
        }
        removed
    }

    /// Removes `version` of `key` for good if it is still not the current
    /// version (or a lone delete marker) and has the rule's tags. Some:
    /// whether it did; None: stop the pass.
    async fn remove_version(
        self: &Rc<Self>,
        pass: &Pass,
        rule: &Rule,
        (key, version): (&str, Option<u64>),
        cluster_key: Option<&[u8; 32]>,
        pacer: &mut Pacer,
    ) -> Option<bool> {
        let bucket = pass.bucket.as_str();
        let pick = pick_of(version);
        if !rule.filter.tags.is_empty() {
            pacer.take().await;
            if !self.has_rule_tags(bucket, key, pick, None, rule).await {
                return Some(false);
            }
        }
        pacer.take().await;
        if !self.still_current(pass) {
            return None;
        }
        // Never the current version (unless it is a lone marker): a write
        // or a delete since the page was read may have changed which one
        // that is. Checked in the poll that takes the tombstone's seq.
        let current = self.store.resolve(bucket, key, Pick::Current);
        let is_current = current.as_ref().is_some_and(|c| c.version == version);
        let lone = is_current && self.store.versions(bucket, key).len() == 1;
        if is_current && !(lone && current.is_some_and(|c| c.marker.is_some())) {
            return Some(false);
        }
        let mode = self.versioning(bucket);
        match self.store.delete_object(bucket, key, mode, pick).await {
            Ok(done) => {
                if let Some(ckey) = cluster_key {
                    let index_key = match version {
                        Some(id) => crate::store::versions::version_key(key, id),
                        None => key.to_string(),
                    };
                    if let Err(e) =
                        crate::cluster::replicate::replicate(self, ckey, bucket, &index_key).await
                    {
                        // The next primary's repair settles it.
                        tracing::warn!(bucket, key, "lifecycle removal not copied: {e}");
                    }
                }
                Some(done.existed)
            }
            Err(e) => {
                tracing::warn!(shard = self.id, bucket, key, "lifecycle expiry failed: {e}");
                None
            }
        }
    }

    async fn abort_old_uploads(
        &self,
        pass: &Pass,
        rule: &Rule,
        now: u64,
        age_ms: u64,
        pacer: &mut Pacer,
    ) -> u64 {
        let bucket = pass.bucket.as_str();
        let mut aborted = 0;
        let (mut key_marker, mut id_marker) = (String::new(), String::new());
        loop {
            let page = self.store.mpu_list(
                bucket,
                &rule.filter.prefix,
                &key_marker,
                &id_marker,
                PAGE_KEYS,
            );
            let Some(last) = page.last() else {
                break;
            };
            (key_marker, id_marker) = (last.key.clone(), last.upload_id.clone());
            glommio::yield_if_needed().await;
            for u in page {
                if u.initiated_ms.saturating_add(age_ms) > now {
                    continue;
                }
                pacer.take().await;
                if !self.still_current(pass) {
                    return aborted;
                }
                match self.store.mpu_abort(bucket, &u.key, &u.upload_id).await {
                    Ok(()) => aborted += 1,
                    Err(e) => {
                        tracing::debug!(shard = self.id, bucket, key = %u.key, "lifecycle abort skipped: {e}")
                    }
                }
            }
        }
        aborted
    }
}
