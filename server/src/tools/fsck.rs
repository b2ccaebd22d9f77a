//! `percore fsck`: an offline, read-only check of a data directory.
//!
//! It shares the record format and the segment scanner (`store::scan`, a
//! pure function fuzzed on its own) with the store, not the recovery code
//! that decides what wins. Run it on a stopped server (or a copy of its
//! data directory).
//!
//! Per shard directory, every segment file in id order:
//! * every record header is decoded and its CRC checked; every payload is
//!   read and checked block by block against its CRC32C;
//! * damaged bytes inside a segment (the scanner resynchronises after them)
//!   are reported as corruption with their range; an unsealed segment may
//!   end in a torn tail (what a crash leaves; recovery cuts it);
//! * the newest record of each key wins, as at recovery; a live object
//!   whose extents are missing or damaged is reported.
//!
//! Exit status: 0 clean, 1 damage found, 2 the check could not run.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::store::record::{self, Body, Kind};
use crate::store::{scan, segments};

const ALIGN: u64 = crate::store::file::WRITE_ALIGN_BYTES;
const VERIFY_PIECE_BYTES: u64 = 16 * record::BLOCK_BYTES_MAX;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub shard: String,
    pub segment: String,
    pub offset: u64,
    pub bucket: String,
    pub key: String,
    pub what: String,
    /// Damage (exit 1), or a note on what recovery will do (torn tails).
    pub corruption: bool,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct FsckReport {
    pub shards: u64,
    pub segments: u64,
    pub sealed_segments: u64,
    pub records: u64,
    pub bytes_checked: u64,
    pub live_objects: u64,
    pub live_bytes: u64,
    pub problems: Vec<Problem>,
    pub elapsed_ms: u64,
}

impl FsckReport {
    pub fn corrupt(&self) -> bool {
        self.problems.iter().any(|p| p.corruption)
    }
}

struct Newest {
    seq: u64,
    header: record::Header,
    ok: bool,
    at: (String, u64),
}

fn read_exact_at(f: &File, len: usize, offset: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

fn payload_ok(f: &File, offset: u64, header_bytes: u64, h: &record::Header) -> bool {
    let mut done = 0u64;
    let block_bytes = h.block_bytes();
    while done < h.payload_bytes {
        let len = VERIFY_PIECE_BYTES.min(h.payload_bytes - done);
        let Ok(data) = read_exact_at(f, len as usize, offset + header_bytes + done) else {
            return false;
        };
        if !record::verify_blocks(
            &h.block_crcs,
            block_bytes,
            (done / block_bytes) as usize,
            &data,
        ) {
            return false;
        }
        done += len;
    }
    true
}

fn segment_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(id) = segments::parse_segment_name(&name) {
            out.push((id, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// One segment file of a shard: (shard directory, id, path, size).
type SegmentFile = (PathBuf, u64, PathBuf, u64);

/// What a shard's check carries from segment to segment.
#[derive(Default)]
struct ShardCheck {
    /// The shard directory's name.
    shard: String,
    /// The newest object or tombstone record of each key, as at recovery.
    newest: HashMap<(String, String), Newest>,
    /// Extents whose payload verified: (segment, offset).
    extents_ok: HashSet<(u64, u64)>,
    /// Records whose payload failed, with seq and kind: damage only if
    /// they are what a key serves, decided once the whole shard is read.
    damaged: Vec<(Problem, u64, Kind)>,
}

/// Checks every shard directory under `data`. `progress(bytes_done,
/// bytes_total)` is called after each segment.
pub fn check(data: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<FsckReport, String> {
    let started = std::time::Instant::now();
    let shards = shard_dirs(data)?;
    let mut report = FsckReport::default();
    let mut all: Vec<SegmentFile> = Vec::new();
    for s in &shards {
        for (id, path) in segment_files(s)? {
            let size = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
            all.push((s.clone(), id, path, size));
        }
    }
    let total: u64 = all.iter().map(|a| a.3).sum();
    let mut done = 0u64;
    for shard_dir in &shards {
        report.shards += 1;
        let mut shard = ShardCheck {
            shard: shard_dir
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            ..Default::default()
        };
        let segs: Vec<&SegmentFile> = all.iter().filter(|a| &a.0 == shard_dir).collect();
        let keys = segment_keys_of(&segs);
        for (_, id, path, size) in segs.iter().copied() {
            let key = *keys.get(id).expect("a key per segment");
            check_segment(&mut shard, &mut report, *id, path, *size, key)?;
            done += size;
            progress(done, total);
        }
        report_damaged_payloads(&mut shard, &mut report);
        report_live_objects(&shard, &mut report);
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// The `shard-*` directories under `data`, in order; an error if none.
fn shard_dirs(data: &Path) -> Result<Vec<PathBuf>, String> {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(data)
        .map_err(|e| format!("cannot read the data directory {}: {e}", data.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("shard-"))
        .map(|e| e.path())
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(format!(
            "{} has no shard-NNN directories: is it a percore data directory (percore serve --data)?",
            data.display()
        ));
    }
    Ok(shards)
}

/// Each segment's key (version, shard secret), as recovery finds it.
fn segment_keys_of(segs: &[&SegmentFile]) -> HashMap<u64, record::SegKey> {
    let heads: Vec<Option<Vec<u8>>> = segs
        .iter()
        .map(|(_, _, path, size)| {
            let f = File::open(path).ok()?;
            read_exact_at(&f, (*size).min(ALIGN) as usize, 0).ok()
        })
        .collect();
    let head_refs: Vec<(u64, Option<&[u8]>)> = segs
        .iter()
        .zip(&heads)
        .map(|(a, h)| (a.1, h.as_deref()))
        .collect();
    segs.iter()
        .map(|a| a.1)
        .zip(scan::segment_keys(&head_refs).1.into_iter().map(|(k, _)| k))
        .collect()
}

/// Scans one segment file: damaged ranges, its tail, its header record,
/// then every record's payload; keeps the newest record of each key.
fn check_segment(
    shard: &mut ShardCheck,
    report: &mut FsckReport,
    id: u64,
    path: &Path,
    size: u64,
    key: record::SegKey,
) -> Result<(), String> {
    let segment = path.file_name().unwrap().to_string_lossy().into_owned();
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    report.segments += 1;
    let shard_name = shard.shard.clone();
    let problem = |offset: u64, h: Option<&record::Header>, what: String, corruption| Problem {
        shard: shard_name.clone(),
        segment: segment.clone(),
        offset,
        bucket: h.map(|h| h.bucket.clone()).unwrap_or_default(),
        key: h.map(|h| h.key.clone()).unwrap_or_default(),
        what,
        corruption,
    };
    let scan = scan::scan_with(key, size, |offset, len| read_exact_at(&f, len, offset))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let sealed = scan.sealed;
    for &(from, to) in &scan.damaged {
        report.problems.push(problem(
            from,
            None,
            format!("{} damaged bytes (to offset {to}) inside the segment: the record(s) there are lost; recovery keeps every record after them", to - from),
            true,
        ));
    }
    if let Some(from) = scan.tail_bad_from {
        let (what, corruption) = if key.version == record::VERSION_1 {
            (format!("unreadable record header in a version-1 segment ({} bytes to the end): records after it, if any, cannot be found safely; recovery keeps the segment as it is", size - from), true)
        } else {
            (format!("unreadable bytes from here to the end ({} bytes): a torn tail, which recovery cuts", size - from), false)
        };
        report.problems.push(problem(from, None, what, corruption));
    }
    if scan
        .records
        .first()
        .is_some_and(|r| r.offset == 0 && r.header.kind() != Kind::SegmentHeader)
        || scan.records.first().is_none_or(|r| r.offset != 0)
    {
        report.problems.push(problem(
            0,
            None,
            "no readable segment header record".into(),
            size > 0,
        ));
    }
    for r in scan.records {
        let (offset, n, h) = (r.offset, r.header_bytes as u64, r.header);
        report.records += 1;
        report.bytes_checked += n + h.payload_bytes;
        let ok = payload_ok(&f, offset, n, &h);
        if !ok {
            shard.damaged.push((
                problem(offset, Some(&h), "payload fails its CRC32C".into(), false),
                h.seq,
                h.kind(),
            ));
        }
        match h.kind() {
            Kind::Extent if ok => {
                shard.extents_ok.insert((id, offset));
            }
            Kind::Object | Kind::Tombstone | Kind::DeleteMarker => {
                let k = (h.bucket.clone(), h.key.clone());
                if shard.newest.get(&k).is_none_or(|e| e.seq < h.seq) {
                    shard.newest.insert(
                        k,
                        Newest {
                            seq: h.seq,
                            header: h,
                            ok,
                            at: (segment.clone(), offset),
                        },
                    );
                }
            }
            _ => {}
        }
    }
    if sealed {
        report.sealed_segments += 1;
    }
    Ok(())
}

/// Records whose payload failed: damage when a key serves them.
fn report_damaged_payloads(shard: &mut ShardCheck, report: &mut FsckReport) {
    for (mut p, seq, kind) in std::mem::take(&mut shard.damaged) {
        let served = kind == Kind::Object
            && shard
                .newest
                .get(&(p.bucket.clone(), p.key.clone()))
                .is_some_and(|n| n.seq == seq);
        if served {
            p.corruption = true;
            p.what
                .push_str(": the key's current version; GETs of it fail");
        } else if kind == Kind::Extent {
            p.what
                .push_str(" (an extent: damage if a live object uses it, reported below)");
        } else {
            p.what
                .push_str(" (an older version, not served; compaction drops it)");
        }
        report.problems.push(p);
    }
}

/// Counts live objects, and reports those whose extents are missing or
/// damaged.
fn report_live_objects(shard: &ShardCheck, report: &mut FsckReport) {
    for ((bucket, key), n) in &shard.newest {
        if let Body::Object { meta, extents } = &n.header.body {
            if !n.ok {
                continue; // reported above
            }
            for x in extents.iter() {
                if !shard.extents_ok.contains(&(x.segment_id, x.record_offset)) {
                    report.problems.push(Problem {
                        shard: shard.shard.clone(),
                        segment: n.at.0.clone(),
                        offset: n.at.1,
                        bucket: bucket.clone(),
                        key: key.clone(),
                        what: format!(
                            "extent at segment {:016x} offset {} is missing or damaged",
                            x.segment_id, x.record_offset
                        ),
                        corruption: true,
                    });
                }
            }
            report.live_objects += 1;
            report.live_bytes += meta.size_bytes;
        }
    }
}

/// `percore fsck`: runs the check with a progress line on a terminal and
/// prints the report; returns the exit status.
pub fn run_cli(data: &Path, json: bool) -> i32 {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut last = std::time::Instant::now();
    let mut progress = |done: u64, total: u64| {
        if tty && (last.elapsed().as_millis() > 200 || done == total) {
            eprint!(
                "\rfsck: {} / {} MiB checked",
                done >> 20,
                (total >> 20).max(1)
            );
            last = std::time::Instant::now();
        }
    };
    let report = match check(data, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("percore fsck: error: {e}");
            return 2;
        }
    };
    if tty {
        eprintln!();
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
    } else {
        println!(
            "{}: {} shards, {} segments ({} sealed), {} records, {} MiB checked, {} live objects ({} MiB) in {} ms",
            data.display(),
            report.shards,
            report.segments,
            report.sealed_segments,
            report.records,
            report.bytes_checked >> 20,
            report.live_objects,
            report.live_bytes >> 20,
            report.elapsed_ms
        );
        for p in &report.problems {
            println!(
                "{} {}/{} @{}{}: {}",
                if p.corruption { "DAMAGE" } else { "note  " },
                p.shard,
                p.segment,
                p.offset,
                if p.key.is_empty() {
                    String::new()
                } else {
                    format!(" ({}/{})", p.bucket, p.key)
                },
                p.what
            );
        }
        if report.corrupt() {
            println!("damage found: the records above are not served (GETs fail their CRC). Restore the named objects from another copy; `percore serve` keeps serving everything else.");
        } else {
            println!("clean");
        }
    }
    i32::from(report.corrupt())
}
