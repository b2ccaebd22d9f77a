//! Recovery: rebuild the index by scanning every segment.
//!
//! - Headers are always verified (their CRC also covers the payload's block
//!   CRCs, and from version 2 binds the header to its place). Bytes that are
//!   not a valid record are skipped and reported (see `scan`): in a sealed
//!   segment they are damage and only the damaged records are lost.
//! - Segments without a Seal record (the one being written at a crash, or one
//!   abandoned after a write error) also have every payload verified; a record
//!   whose payload fails is dropped, as is an object whose extents failed.
//! - Per key the highest sequence number wins; every other record of the key
//!   is counted in `older_on_disk` so that tombstones outlive what they hide.
//! - Unsealed segments are then sealed after their last valid record and
//!   the garbage after it is cut off (a version-1 segment other than the
//!   newest, whose scan stopped at damage, is left as it is).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Instant;

use super::file::{SegFile, WRITE_ALIGN_BYTES};
use super::record::{self, Body, Header, Kind, SegKey};
pub(super) use super::scan::{ScanResult, Scanned};
use super::scan::{Scanner, Step};
use super::{
    index::{Entry, State},
    segments::{parse_segment_name, Segment},
    Loc, ObjectInfo, RecoveryReport, Result, Store, StoreError,
};

/// Reads a segment's records in order (see `scan` for the rules).
///
/// A window the device cannot read (EIO: a bad sector) is read again one
/// 4 KiB block at a time; blocks that still fail are scanned as zeros and
/// reported as damaged ranges, so one bad sector costs the records on it,
/// not the shard.
pub(super) async fn scan_segment(
    store: &Store,
    file: &SegFile,
    size_bytes: u64,
    key: SegKey,
) -> Result<ScanResult> {
    let mut scanner = Scanner::new(key, size_bytes);
    let mut unreadable: Vec<(u64, u64)> = Vec::new();
    let mut step = scanner.feed(&[], 0);
    while let Step::Read { offset, len } = step {
        let window = match read_segment(store, file, key.segment_id, offset, len).await {
            Ok(w) => w.to_vec(),
            Err(_) => {
                read_blockwise(store, file, key.segment_id, offset, len, &mut unreadable).await
            }
        };
        step = scanner.feed(&window, offset);
        // A long scan must not hold the shard's executor.
        glommio::yield_if_needed().await;
    }
    let mut result = scanner.finish();
    if !unreadable.is_empty() {
        result.damaged.extend(unreadable.iter().copied());
        result.damaged.sort_unstable();
        result.unreadable = unreadable;
    }
    Ok(result)
}

/// Reads `len` bytes at `offset` block by block, zeros for blocks that fail.
async fn read_blockwise(
    store: &Store,
    file: &SegFile,
    segment_id: u64,
    offset: u64,
    len: usize,
    unreadable: &mut Vec<(u64, u64)>,
) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut at = offset;
    let end = offset + len as u64;
    while at < end {
        let next = ((at + 1).next_multiple_of(WRITE_ALIGN_BYTES)).min(end);
        let n = (next - at) as usize;
        let from = (at - offset) as usize;
        match read_segment(store, file, segment_id, at, n).await {
            Ok(b) if b.len() == n => out[from..from + n].copy_from_slice(&b),
            _ => {
                tracing::error!(
                    offset = at,
                    len = n,
                    "unreadable segment block; scanned as zeros"
                );
                unreadable.push((at, next));
            }
        }
        at = next;
    }
    out
}

/// A read of segment bytes for a scan or a check, through the fault hook.
async fn read_segment(
    store: &Store,
    file: &SegFile,
    segment_id: u64,
    offset: u64,
    len: usize,
) -> std::io::Result<glommio::io::ReadResult> {
    store.fault(super::file::FaultPoint::Read { segment_id, offset })?;
    file.read_at(offset, len).await
}

/// Checks a record's payload against its block CRCs; an error if it could
/// not be read.
pub(super) async fn verify_payload(
    store: &Store,
    file: &SegFile,
    segment_id: u64,
    r: &Scanned,
) -> Result<bool> {
    let mut verified = 0u64;
    let step = 16 * record::BLOCK_BYTES_MAX;
    let block_bytes = r.header.block_bytes();
    while verified < r.header.payload_bytes {
        let len = step.min(r.header.payload_bytes - verified);
        let at = r.offset + u64::from(r.header_bytes) + verified;
        let data = read_segment(store, file, segment_id, at, len as usize).await?;
        let first_block = (verified / block_bytes) as usize;
        if data.len() as u64 != len
            || !record::verify_blocks(&r.header.block_crcs, block_bytes, first_block, &data)
        {
            return Ok(false);
        }
        verified += len;
    }
    Ok(true)
}

struct Candidate {
    entry: Option<Entry>,
    records_on_disk: u32,
}

/// What recovery carries from segment to segment.
struct Recovery<'a> {
    store: &'a Store,
    report: RecoveryReport,
    /// Per key: the newest servable record found, and how many records of
    /// the key are on disk.
    candidates: HashMap<(String, String), Candidate>,
    /// Extents known good: (segment, offset).
    extents_ok: HashSet<(u64, u64)>,
    max_seq: u64,
    /// Every shard secret seen (see `segment_keys`).
    secrets: Vec<u64>,
    /// The newest segment: damage in it without a seal is a torn batch.
    newest: Option<u64>,
}

/// A segment file opened for recovery, with the key its header gives (or
/// a guess, when `header_ok` is false).
struct Opened {
    segment_id: u64,
    file: SegFile,
    size_bytes: u64,
    guess: SegKey,
    header_ok: bool,
}

pub(super) async fn recover(store: &Store) -> Result<RecoveryReport> {
    let started = Instant::now();
    let cfg = &store.inner.cfg;
    let ids = segment_ids(&cfg.dir)?;
    let (opened, secrets) = open_segments(store, &ids).await?;
    let mut r = Recovery {
        store,
        report: RecoveryReport {
            segments: ids.len() as u64,
            ..Default::default()
        },
        candidates: HashMap::new(),
        extents_ok: HashSet::new(),
        max_seq: 0,
        secrets,
        newest: ids.last().copied(),
    };
    for segment in opened {
        r.recover_segment(segment).await?;
    }
    let Recovery {
        mut report,
        candidates,
        max_seq,
        ..
    } = r;
    for ((bucket, key), c) in candidates {
        if let Some(mut entry) = c.entry {
            entry.older_on_disk = c.records_on_disk - 1;
            store.install(&bucket, &key, entry);
        }
    }
    report.objects = store.objects_total() as u64;
    // A record with the largest seq leaves no seq for a later write:
    // writes then fail rather than install below it.
    store.inner.next_seq.set(max_seq.checked_add(1));
    if max_seq == u64::MAX {
        tracing::error!(
            shard = cfg.shard_id,
            "a record carries the largest sequence number; this shard refuses writes"
        );
    }
    store
        .inner
        .segs
        .next_id
        .set(ids.last().map_or(1, |id| id + 1));
    store.inner.stats.borrow_mut().damaged_regions += report.damaged_regions;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Ids of the segment files in `dir`, in order.
fn segment_ids(dir: &std::path::Path) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for dirent in std::fs::read_dir(dir)? {
        let dirent = dirent?;
        if let Some(id) = dirent.file_name().to_str().and_then(parse_segment_name) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Opens every segment and finds its key. Every segment's key first: the
/// shard secret lives in each version-2 segment header, so one damaged
/// header does not cost its segment. Sets the shard secret (writing
/// `shard.secret` if it differs). Returns the segments and every secret
/// some header (or the secret file) carries.
async fn open_segments(store: &Store, ids: &[u64]) -> Result<(Vec<Opened>, Vec<u64>)> {
    let cfg = &store.inner.cfg;
    let mut files = Vec::with_capacity(ids.len());
    let mut heads = Vec::with_capacity(ids.len());
    for &segment_id in ids {
        let path = super::segments::segment_path(&cfg.dir, segment_id);
        let file = cfg.disk.open(&path, cfg.direct_io).await?;
        let size_bytes = file.size_bytes().await?;
        let head = match size_bytes.min(WRITE_ALIGN_BYTES) as usize {
            0 => None,
            n => file.read_at(0, n).await.ok(),
        };
        heads.push(head);
        files.push((file, size_bytes));
    }
    let head_refs: Vec<(u64, Option<&[u8]>)> = ids
        .iter()
        .zip(&heads)
        .map(|(id, h)| (*id, h.as_deref()))
        .collect();
    let (secret, keys) = super::scan::segment_keys(&head_refs);
    // A second home for the secret, for when every segment header that
    // carries it is damaged (one segment, say).
    let secret_file = read_secret_file(&cfg.dir);
    // Every secret some segment header carries: a segment whose own header
    // is damaged is tried with each (and version 1), keeping the key under
    // which its records verify.
    let mut secrets: Vec<u64> = head_refs
        .iter()
        .filter_map(|(id, h)| h.and_then(|b| record::decode_segment_header(b, *id).ok()))
        .map(|(_, _, k)| k)
        .filter(|k| k.version == record::VERSION)
        .map(|k| k.shard_secret)
        .collect();
    secrets.extend(secret_file);
    secrets.sort_unstable();
    secrets.dedup();
    drop(head_refs);
    let secret = secret.or(secret_file).unwrap_or_else(rand::random);
    if secret_file != Some(secret) {
        write_secret_file(&cfg.disk, &cfg.dir, secret)?;
    }
    store.inner.segs.shard_secret.set(secret);
    let opened = ids
        .iter()
        .zip(files)
        .zip(keys)
        .map(
            |((&segment_id, (file, size_bytes)), (guess, header_ok))| Opened {
                segment_id,
                file,
                size_bytes,
                guess,
                header_ok,
            },
        )
        .collect();
    Ok((opened, secrets))
}

impl Recovery<'_> {
    /// Scans one segment, takes its records into the candidates, then cuts
    /// and seals it where that is safe, and adds it to the segment table.
    async fn recover_segment(&mut self, o: Opened) -> Result<()> {
        let store = self.store;
        let cfg = &store.inner.cfg;
        let (segment_id, file, size_bytes, header_ok) =
            (o.segment_id, o.file, o.size_bytes, o.header_ok);
        let (key, mut scan) = if header_ok {
            (
                o.guess,
                scan_segment(store, &file, size_bytes, o.guess).await?,
            )
        } else {
            best_key(store, &file, size_bytes, segment_id, o.guess, &self.secrets).await?
        };
        self.report.bytes_scanned += scan.bytes_scanned;
        check_segment_header(&scan, cfg.shard_id, segment_id)?;
        // A segment whose header failed and in which no key finds a record
        // is left exactly as it is (nothing to cut it with safely), unless
        // it is no bigger than its header block (created, never written).
        let unknown = !header_ok && scan.records.is_empty() && size_bytes > WRITE_ALIGN_BYTES;
        if !header_ok && scan.records.is_empty() && size_bytes <= WRITE_ALIGN_BYTES {
            // Created, never written (a crash before its header was
            // durable): nothing to keep.
            drop(file);
            let path = super::segments::segment_path(&cfg.dir, segment_id);
            cfg.disk.remove_file(&path)?;
            cfg.disk.sync_dir(&cfg.dir)?;
            tracing::warn!(
                shard = cfg.shard_id,
                segment_id,
                "removed an empty segment file without a header"
            );
            return Ok(());
        }
        if !header_ok && size_bytes > 0 {
            tracing::error!(
                shard = cfg.shard_id,
                segment_id,
                version = key.version,
                records = scan.records.len(),
                "segment header unreadable; read with the key its records verify under"
            );
        }
        self.cut_torn_batch(segment_id, key, &mut scan);
        let (dropped_here, unverified_here) = self.take_records(segment_id, &file, &scan).await;
        // A version-1 scan stops at the first bad header, in front of
        // records it cannot find safely (a seal among them, perhaps): the
        // segment is never cut, only reported.
        let v1_damage = self.report_damage(segment_id, key, &scan);
        let damaged = scan.is_damaged(key.version) || unknown || !header_ok || unverified_here;
        let mut end_bytes = scan.valid_end;
        let mut sealed = scan.sealed;
        if unknown {
            self.report.damaged_regions += 1;
        }
        if !scan.sealed && !v1_damage && !unknown && !unverified_here {
            let sealed_at = self
                .cut_and_seal(
                    segment_id,
                    &file,
                    &key,
                    size_bytes,
                    scan.valid_end,
                    dropped_here,
                )
                .await;
            if let Some(seal_end) = sealed_at {
                end_bytes = seal_end;
                sealed = true;
            }
        }
        store.add_segment(
            segment_id,
            Segment {
                file: Rc::new(file),
                key,
                end_bytes,
                sealed,
                damaged,
            },
        );
        Ok(())
    }

    /// In the newest segment without a seal, damage is where a batch tore
    /// at the crash: nothing after it was acknowledged (batches are
    /// acknowledged in order), so that is where its tail is cut: the
    /// records after it are forgotten. (Damage in the header block is not
    /// a torn batch: no batch is written there.) A block the device could
    /// not read is not a torn batch: what it holds is unknown (acknowledged
    /// records, perhaps, on a sector that reads again later), so a segment
    /// with one is neither cut nor sealed (found by the fault test with read
    /// faults in recovery).
    fn cut_torn_batch(&self, segment_id: u64, key: SegKey, scan: &mut ScanResult) {
        let torn_at = scan
            .damaged
            .iter()
            .map(|d| d.0)
            .find(|at| *at >= WRITE_ALIGN_BYTES)
            .filter(|_| scan.unreadable.is_empty());
        let newest_torn = !scan.sealed
            && Some(segment_id) == self.newest
            && key.version == record::VERSION
            && torn_at.is_some();
        if let Some(cut_from) = torn_at.filter(|_| newest_torn) {
            scan.records.retain(|r| r.offset < cut_from);
            scan.valid_end = scan.records.last().map_or(0, |r| {
                r.offset
                    + record::record_span_bytes(u64::from(r.header_bytes), r.header.payload_bytes)
            });
            scan.damaged.retain(|d| d.0 < cut_from);
            scan.tail_bad_from = Some(cut_from);
        }
    }

    /// Takes a segment's records into the candidates, verifying payloads
    /// where the segment has no seal. Returns (a record was dropped for a
    /// bad payload, a payload could not be read).
    async fn take_records(
        &mut self,
        segment_id: u64,
        file: &SegFile,
        scan: &ScanResult,
    ) -> (bool, bool) {
        let store = self.store;
        let cfg = &store.inner.cfg;
        let mut dropped_here = false;
        // Records that could not be read (a block of headers, or a
        // payload): missing for this run, like the records of a damaged
        // header, but the segment is left exactly as it is (never cut,
        // sealed or compacted), so they are back once the device reads
        // them again. (Installing a record whose payload cannot be read
        // would let compaction delete the older version it hides, and
        // that record may be a torn write that never reads again.)
        let mut unverified_here = !scan.unreadable.is_empty();
        for r in &scan.records {
            self.report.records += 1;
            // Its seq is taken even if the record is dropped, so that no later
            // write reuses it and ties with it at a later recovery.
            self.max_seq = self.max_seq.max(r.header.seq);
            let verified = if scan.sealed || r.header.payload_bytes == 0 {
                Ok(true)
            } else {
                verify_payload(store, file, segment_id, r).await
            };
            if let Err(e) = &verified {
                unverified_here = true;
                self.report.damaged_regions += 1;
                count_record(&mut self.candidates, &r.header, None);
                tracing::error!(
                    shard = cfg.shard_id,
                    segment_id,
                    offset = r.offset,
                    "cannot read a record's payload to verify it ({e}): not served in this run; its segment is kept as it is"
                );
                continue;
            }
            if matches!(verified, Ok(false)) {
                self.report.corrupt_records += 1;
                dropped_here = true;
                count_record(&mut self.candidates, &r.header, None);
                tracing::warn!(
                    shard = cfg.shard_id,
                    segment_id,
                    offset = r.offset,
                    "dropping record whose payload fails its CRC"
                );
                continue;
            }
            self.take_record(segment_id, r);
        }
        (dropped_here, unverified_here)
    }

    /// Takes one verified record into the candidates (extents into the
    /// known-good set).
    fn take_record(&mut self, segment_id: u64, r: &Scanned) {
        let loc = Loc {
            segment_id,
            offset: r.offset,
            header_bytes: r.header_bytes,
            payload_bytes: r.header.payload_bytes,
        };
        if r.header.kind() == Kind::Extent {
            self.extents_ok.insert((segment_id, r.offset));
            return;
        }
        let Some(state) = keyed_state(&r.header, &self.extents_ok) else {
            if r.header.kind() == Kind::Object {
                self.report.corrupt_records += 1;
            }
            count_record(&mut self.candidates, &r.header, None);
            return;
        };
        let entry = Entry {
            seq: r.header.seq,
            loc,
            state,
            older_on_disk: 0,
        };
        count_record(&mut self.candidates, &r.header, Some(entry));
    }

    /// Reports the damaged ranges of a scan. Returns whether it is a
    /// version-1 segment whose scan stopped at damage.
    fn report_damage(&mut self, segment_id: u64, key: SegKey, scan: &ScanResult) -> bool {
        let store = self.store;
        let cfg = &store.inner.cfg;
        for &(from, to) in &scan.damaged {
            self.report.damaged_regions += 1;
            tracing::error!(
                shard = cfg.shard_id,
                segment_id,
                from,
                to,
                sealed = scan.sealed,
                "damaged bytes inside the segment: the record(s) there are lost, the records after them are kept"
            );
        }
        let v1_damage = key.version == record::VERSION_1 && scan.tail_bad_from.is_some();
        if v1_damage {
            self.report.damaged_regions += 1;
            tracing::error!(
                shard = cfg.shard_id,
                segment_id,
                at = scan.tail_bad_from,
                "unreadable record header in a version-1 segment: records after it are not served; the segment is kept as it is (see percore fsck)"
            );
        }
        v1_damage
    }

    /// Cuts an unsealed segment after its last valid record and seals it
    /// (unless records were dropped from it). Returns the end of the seal.
    async fn cut_and_seal(
        &mut self,
        segment_id: u64,
        file: &SegFile,
        key: &SegKey,
        size_bytes: u64,
        valid_end: u64,
        dropped_here: bool,
    ) -> Option<u64> {
        let store = self.store;
        let cfg = &store.inner.cfg;
        // Only bytes after the last valid record are cut: in version 2
        // the scan found every valid record before them. The cut is at
        // the record's exact end, not at the next block: the rest of
        // that block may hold the header of a record torn at the crash
        // (its payload cut short by the file's end, so the scan did not
        // take it), and a seal written after it would extend the file
        // over the missing payload and make the header look whole to
        // every later recovery, which trusts sealed segments (found by
        // the power-loss test). The block's tail reads as zeros, which
        // are padding.
        let cut_ok = if size_bytes > valid_end {
            self.report.torn_tails_cut += 1;
            tracing::warn!(
                shard = cfg.shard_id,
                segment_id,
                cut_at = valid_end,
                size_bytes,
                "cutting torn tail"
            );
            match cut(file, valid_end).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        shard = cfg.shard_id,
                        segment_id,
                        "could not cut torn tail: {e}"
                    );
                    false
                }
            }
        } else {
            true
        };
        // With dropped records the segment stays unsealed, so every
        // later recovery verifies payloads here again and keeps
        // rejecting them; without a durable cut, a seal could cover the
        // torn bytes.
        if dropped_here || !cut_ok {
            return None;
        }
        let seal_at = valid_end.next_multiple_of(WRITE_ALIGN_BYTES);
        seal_segment(store, file, key, seal_at).await
    }
}

/// Scans a segment whose own header failed with each key it may have
/// (the guess, every shard secret seen, version 1) and keeps the one under
/// which the most records verify.
async fn best_key(
    store: &Store,
    file: &SegFile,
    size_bytes: u64,
    segment_id: u64,
    guess: SegKey,
    secrets: &[u64],
) -> Result<(SegKey, ScanResult)> {
    let mut candidates = vec![guess];
    for s in secrets {
        candidates.push(SegKey::v2(*s, segment_id));
    }
    candidates.push(SegKey::v1(segment_id));
    candidates.dedup();
    let mut best: Option<(SegKey, ScanResult)> = None;
    for key in candidates {
        let scan = scan_segment(store, file, size_bytes, key).await?;
        if best
            .as_ref()
            .is_none_or(|(_, b)| scan.records.len() > b.records.len())
        {
            best = Some((key, scan));
        }
    }
    Ok(best.expect("at least one candidate"))
}

const SECRET_FILE: &str = "shard.secret";

/// The shard secret kept beside the segments (`shard.secret`: 16 hex
/// digits, a space, the CRC32C of those digits as 8 hex digits). None if
/// missing or damaged.
fn read_secret_file(dir: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(SECRET_FILE)).ok()?;
    let (hex, crc) = text.trim().split_once(' ')?;
    let ok =
        hex.len() == 16 && u32::from_str_radix(crc, 16).ok()? == crc32c::crc32c(hex.as_bytes());
    if !ok {
        tracing::error!(dir = %dir.display(), "{SECRET_FILE} is damaged; using the segment headers' secret");
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Writes `shard.secret` durably (temporary file, fsync, rename, fsync of
/// the directory) before any segment is bound with it.
fn write_secret_file(
    disk: &super::file::Disk,
    dir: &std::path::Path,
    secret: u64,
) -> std::io::Result<()> {
    let hex = format!("{secret:016x}");
    let text = format!("{hex} {:08x}\n", crc32c::crc32c(hex.as_bytes()));
    disk.write_file_durably(dir, SECRET_FILE, text.as_bytes())
}

/// Cuts a segment file at `at` and makes the new size durable.
async fn cut(file: &SegFile, at: u64) -> std::io::Result<()> {
    file.truncate(at).await?;
    file.sync().await
}

fn check_segment_header(scan: &ScanResult, shard_id: u32, segment_id: u64) -> Result<()> {
    match scan.records.first().map(|r| &r.header.body) {
        Some(Body::SegmentHeader { shard_id: s, segment_id: id, .. }) if *s == shard_id && *id == segment_id => Ok(()),
        Some(Body::SegmentHeader { shard_id: s, segment_id: id, .. }) => Err(StoreError::Invalid(format!(
            "segment file {segment_id:016x} says it is shard {s} segment {id:016x}; was the data directory moved between shards?"
        ))),
        // A segment whose header never became durable holds nothing acknowledged.
        _ => Ok(()),
    }
}

/// The index state a keyed record stands for; None for records that cannot
/// be served (an object whose extents are missing or failed verification).
fn keyed_state(h: &Header, extents_ok: &HashSet<(u64, u64)>) -> Option<State> {
    match &h.body {
        Body::Object { meta, extents } => {
            if !extents
                .iter()
                .all(|e| extents_ok.contains(&(e.segment_id, e.record_offset)))
            {
                return None;
            }
            Some(State::Live(ObjectInfo {
                size_bytes: meta.size_bytes,
                etag: meta.etag.clone().into(),
                mtime_ms: meta.mtime_ms,
                stamp: super::meta_stamp(meta),
                extents: extents.clone().into(),
            }))
        }
        Body::Bucket { created_ms } => Some(State::Live(ObjectInfo {
            size_bytes: 0,
            etag: "".into(),
            mtime_ms: *created_ms,
            stamp: *created_ms,
            extents: Box::new([]),
        })),
        Body::Tombstone { mtime_ms } | Body::BucketDelete { mtime_ms } => {
            Some(State::Deleted { stamp: *mtime_ms })
        }
        Body::DeleteMarker { mtime_ms } => Some(State::Marker {
            mtime_ms: *mtime_ms,
        }),
        Body::Extent { .. } | Body::Seal | Body::SegmentHeader { .. } => None,
    }
}

fn count_record(
    candidates: &mut HashMap<(String, String), Candidate>,
    h: &Header,
    entry: Option<Entry>,
) {
    if matches!(h.kind(), Kind::SegmentHeader | Kind::Seal | Kind::Extent) {
        return;
    }
    let c = candidates
        .entry((h.bucket.clone(), h.key.clone()))
        .or_insert(Candidate {
            entry: None,
            records_on_disk: 0,
        });
    c.records_on_disk += 1;
    if let Some(new) = entry {
        let better = match &c.entry {
            None => true,
            Some(old) => new.seq > old.seq,
        };
        if better {
            c.entry = Some(new);
        }
    }
}

/// Writes a Seal at `offset` and cuts the file after it. Returns the new end.
async fn seal_segment(store: &Store, file: &SegFile, key: &SegKey, offset: u64) -> Option<u64> {
    let segment_id = key.segment_id;
    match store.write_seal(file, key, offset, true).await {
        Ok(end) => Some(end),
        Err(e) => {
            tracing::warn!(
                shard = store.inner.cfg.shard_id,
                segment_id,
                "could not seal recovered segment: {e}"
            );
            None
        }
    }
}
