//! Recovery: rebuild the index by scanning every segment.
//!
//! - Headers are always verified (their CRC also covers the payload's block
//!   CRCs). A header that fails ends the segment's valid data: a torn tail.
//! - Segments without a Seal record (the one being written at a crash, or one
//!   abandoned after a write error) also have every payload verified; a record
//!   whose payload fails is dropped, as is an object whose extents failed.
//! - Per key the highest sequence number wins; every other record of the key
//!   is counted in `older_on_disk` so that tombstones outlive what they hide.
//! - Unsealed segments are then sealed at their valid end and the garbage
//!   after it is cut off.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Instant;

use super::file::{SegFile, WRITE_ALIGN_BYTES};
use super::record::{self, Body, DecodeError, Header, Kind};
use super::{
    parse_segment_name, Entry, Loc, ObjectInfo, RecoveryReport, Result, Segment, State, Store,
    StoreError,
};

/// Bytes read per scan I/O.
const SCAN_WINDOW_BYTES: usize = 4 << 20;

pub(super) struct Scanned {
    pub offset: u64,
    pub header_bytes: u32,
    pub header: Header,
}

pub(super) struct ScanResult {
    pub records: Vec<Scanned>,
    /// End of the last valid record.
    pub valid_end: u64,
    pub sealed: bool,
    pub bytes_scanned: u64,
}

/// Reads a segment's record headers in order until a Seal record, an invalid
/// header or the end of the file.
pub(super) async fn scan_segment(file: &SegFile, size_bytes: u64) -> Result<ScanResult> {
    let mut records = Vec::new();
    let mut offset = 0u64;
    let mut window_start = 0u64;
    let mut window = glommio::io::ReadResult::default();
    let mut valid_end = 0u64;
    let mut sealed = false;
    let mut bytes_scanned = 0u64;
    while offset + record::FIXED_HEADER_BYTES as u64 <= size_bytes {
        let mut need = record::FIXED_HEADER_BYTES;
        let header = loop {
            let at = offset.wrapping_sub(window_start);
            let have = if offset >= window_start && at < window.len() as u64 {
                window.len() as u64 - at
            } else {
                0
            };
            if have < need as u64 {
                let len = SCAN_WINDOW_BYTES
                    .max(need)
                    .min((size_bytes - offset) as usize);
                if len < need {
                    break Err(DecodeError::Short(need));
                }
                window = file.read_at(offset, len).await?;
                bytes_scanned += window.len() as u64;
                window_start = offset;
                if window.len() < need {
                    break Err(DecodeError::Short(need));
                }
                continue;
            }
            match record::decode_header(&window[at as usize..]) {
                // Always asks for more than `have`, so this loop ends.
                Err(DecodeError::Short(n)) => need = n,
                other => break other,
            }
        };
        match header {
            Ok((header, header_bytes)) => {
                let span = record::record_span_bytes(header_bytes as u64, header.payload_bytes);
                if offset + span > size_bytes {
                    break; // payload cut short: torn tail
                }
                let kind = header.kind();
                if kind == Kind::Seal {
                    sealed = true;
                    valid_end = offset + span;
                    break;
                }
                records.push(Scanned {
                    offset,
                    header_bytes: header_bytes as u32,
                    header,
                });
                offset += span;
                valid_end = offset;
            }
            Err(DecodeError::Padding) => offset = (offset + 1).next_multiple_of(WRITE_ALIGN_BYTES),
            Err(_) => break,
        }
    }
    Ok(ScanResult {
        records,
        valid_end,
        sealed,
        bytes_scanned,
    })
}

/// Checks a record's payload against its block CRCs.
pub(super) async fn verify_payload(file: &SegFile, r: &Scanned) -> Result<bool> {
    let mut verified = 0u64;
    let step = 16 * record::BLOCK_BYTES;
    while verified < r.header.payload_bytes {
        let len = step.min(r.header.payload_bytes - verified);
        let at = r.offset + u64::from(r.header_bytes) + verified;
        let data = file.read_at(at, len as usize).await?;
        let first_block = (verified / record::BLOCK_BYTES) as usize;
        if data.len() as u64 != len
            || !record::verify_blocks(&r.header.block_crcs, first_block, &data)
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

pub(super) async fn recover(store: &Store) -> Result<RecoveryReport> {
    let started = Instant::now();
    let cfg = &store.inner.cfg;
    let mut ids = Vec::new();
    for dirent in std::fs::read_dir(&cfg.dir)? {
        let dirent = dirent?;
        if let Some(id) = dirent.file_name().to_str().and_then(parse_segment_name) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    let mut report = RecoveryReport {
        segments: ids.len() as u64,
        ..Default::default()
    };
    let mut candidates: HashMap<(String, String), Candidate> = HashMap::new();
    // Extents known good: (segment, offset) -> span bytes.
    let mut extents_ok: HashSet<(u64, u64)> = HashSet::new();
    let mut max_seq = 0u64;
    for &segment_id in &ids {
        let path = super::segment_path(&cfg.dir, segment_id);
        let file = SegFile::open(&path, cfg.direct_io).await?;
        let size_bytes = file.size_bytes().await?;
        let scan = scan_segment(&file, size_bytes).await?;
        report.bytes_scanned += scan.bytes_scanned;
        check_segment_header(&scan, cfg.shard_id, segment_id)?;
        let mut dropped_here = false;
        for r in &scan.records {
            report.records += 1;
            // Its seq is taken even if the record is dropped, so that no later
            // write reuses it and ties with it at a later recovery.
            max_seq = max_seq.max(r.header.seq);
            if !scan.sealed && r.header.payload_bytes > 0 && !verify_payload(&file, r).await? {
                report.corrupt_records += 1;
                dropped_here = true;
                count_record(&mut candidates, &r.header, None);
                tracing::warn!(
                    shard = cfg.shard_id,
                    segment_id,
                    offset = r.offset,
                    "dropping record whose payload fails its CRC"
                );
                continue;
            }
            let loc = Loc {
                segment_id,
                offset: r.offset,
                header_bytes: r.header_bytes,
                payload_bytes: r.header.payload_bytes,
            };
            if r.header.kind() == Kind::Extent {
                extents_ok.insert((segment_id, r.offset));
                continue;
            }
            let Some(state) = keyed_state(&r.header, &extents_ok) else {
                if r.header.kind() == Kind::Object {
                    report.corrupt_records += 1;
                }
                count_record(&mut candidates, &r.header, None);
                continue;
            };
            let entry = Entry {
                seq: r.header.seq,
                loc,
                state,
                older_on_disk: 0,
            };
            count_record(&mut candidates, &r.header, Some(entry));
        }
        let mut end_bytes = scan.valid_end;
        let mut sealed = scan.sealed;
        if !scan.sealed {
            let cut_at = scan.valid_end.next_multiple_of(WRITE_ALIGN_BYTES);
            if size_bytes > cut_at {
                report.torn_tails_cut += 1;
                tracing::warn!(
                    shard = cfg.shard_id,
                    segment_id,
                    cut_at,
                    size_bytes,
                    "cutting torn tail"
                );
            }
            if dropped_here {
                // Stay unsealed, so every later recovery verifies payloads
                // here again and keeps rejecting the dropped records.
                if size_bytes > cut_at {
                    if let Err(e) = file.truncate(cut_at).await {
                        tracing::warn!(
                            shard = cfg.shard_id,
                            segment_id,
                            "could not cut torn tail: {e}"
                        );
                    }
                }
            } else if let Some(seal_end) = seal_segment(store, &file, segment_id, cut_at).await {
                end_bytes = seal_end;
                sealed = true;
            }
        }
        store.inner.segments.borrow_mut().insert(
            segment_id,
            Segment {
                file: Rc::new(file),
                end_bytes,
                live_bytes: 0,
                sealed,
            },
        );
    }
    for ((bucket, key), c) in candidates {
        if let Some(mut entry) = c.entry {
            entry.older_on_disk = c.records_on_disk - 1;
            store.install(&bucket, &key, entry);
        }
    }
    report.objects = store.objects_total() as u64;
    store.inner.next_seq.set(max_seq + 1);
    store
        .inner
        .next_segment_id
        .set(ids.last().map_or(1, |id| id + 1));
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
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
                extents: extents.clone().into(),
            }))
        }
        Body::Bucket { created_ms } => Some(State::Live(ObjectInfo {
            size_bytes: 0,
            etag: "".into(),
            mtime_ms: *created_ms,
            extents: Box::new([]),
        })),
        Body::Tombstone { .. } | Body::BucketDelete { .. } => Some(State::Deleted),
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
async fn seal_segment(store: &Store, file: &SegFile, segment_id: u64, offset: u64) -> Option<u64> {
    match store.write_seal(file, segment_id, offset, true).await {
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
