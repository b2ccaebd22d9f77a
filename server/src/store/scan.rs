//! Reading a segment's records in order, without I/O of its own: recovery,
//! compaction and the scrubber drive it with glommio reads, `percore fsck`
//! and the recovery fuzz property with plain reads of a file or a buffer.
//!
//! Rules (docs/design.md, "Recovery"):
//! - A version-2 segment is scanned to its seal or its end. Bytes that are
//!   neither a valid record nor zero padding are damage: the scan steps on
//!   8 bytes at a time (records start 8-byte aligned) until a header
//!   verifies again, and reports the damaged range. A header verifies only
//!   at the place it was written (the CRC is bound to the shard secret,
//!   segment and offset), so a header planted in a payload is never taken
//!   for a record. The only records lost to damage are the damaged ones.
//! - A version-1 segment (written before record version 2) cannot be
//!   resynchronised safely (its CRCs are not bound to a place, so a user
//!   payload may hold a valid-looking header): its scan stops at the first
//!   bad header, as version 1 did, and the caller decides whether that is
//!   a torn tail (the newest segment) or damage to keep (any other).

use super::record::{self, DecodeError, Header, Kind, SegKey};

/// Bytes asked for per read.
pub const SCAN_WINDOW_BYTES: usize = 4 << 20;

/// A record found by a scan.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub offset: u64,
    pub header_bytes: u32,
    pub header: Header,
}

#[derive(Debug, Clone, Default)]
pub struct ScanResult {
    pub records: Vec<Scanned>,
    /// End of the last valid record (the seal's, in a sealed segment).
    pub valid_end: u64,
    pub sealed: bool,
    pub bytes_scanned: u64,
    /// Byte ranges between valid records that hold neither records nor
    /// padding: damage (or, in an unsealed segment, a batch torn at a
    /// crash whose later pieces landed).
    pub damaged: Vec<(u64, u64)>,
    /// Start of unreadable bytes after the last valid record of a segment
    /// without a seal: a torn tail (or, in version 1, where the scan gave up).
    pub tail_bad_from: Option<u64>,
    /// Blocks the device could not read (also in `damaged`): what they
    /// hold is unknown, so they are never taken for a torn batch.
    pub unreadable: Vec<(u64, u64)>,
}

impl ScanResult {
    /// The scan could not account for every byte before the segment's end.
    pub fn is_damaged(&self, version: u8) -> bool {
        !self.damaged.is_empty() || (version == record::VERSION_1 && self.tail_bad_from.is_some())
    }
}

/// What the scanner needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Bytes of the file from `offset`, `len` of them (fewer at its end).
    Read {
        offset: u64,
        len: usize,
    },
    Done,
}

pub struct Scanner {
    key: SegKey,
    size_bytes: u64,
    offset: u64,
    need: usize,
    /// The read the scanner asked for last: a window from there that is
    /// still too short means the file ends (or shrank) inside a record.
    asked_at: Option<u64>,
    bad_from: Option<u64>,
    done: bool,
    result: ScanResult,
}

impl Scanner {
    pub fn new(key: SegKey, size_bytes: u64) -> Scanner {
        Scanner {
            key,
            size_bytes,
            offset: 0,
            need: record::FIXED_HEADER_BYTES,
            asked_at: None,
            bad_from: None,
            done: false,
            result: ScanResult::default(),
        }
    }

    pub fn key(&self) -> SegKey {
        self.key
    }

    /// Consumes what it can of `window` (the file's bytes from
    /// `window_start`) and says what it needs next.
    pub fn feed(&mut self, window: &[u8], window_start: u64) -> Step {
        self.result.bytes_scanned += window.len() as u64;
        loop {
            if self.done || self.offset + record::FIXED_HEADER_BYTES as u64 > self.size_bytes {
                return self.finish_step();
            }
            let have = match self.offset.checked_sub(window_start) {
                Some(at) if at < window.len() as u64 => window.len() - at as usize,
                _ => 0,
            };
            if have < self.need {
                let avail = self.size_bytes - self.offset;
                let short = (self.need as u64) > avail
                    || (self.asked_at == Some(self.offset) && window_start == self.offset);
                if short {
                    // The file ends inside this record: not a record.
                    self.bad(DecodeError::Short(self.need));
                    continue;
                }
                self.asked_at = Some(self.offset);
                let len = (SCAN_WINDOW_BYTES.max(self.need) as u64).min(avail) as usize;
                return Step::Read {
                    offset: self.offset,
                    len,
                };
            }
            let at = (self.offset - window_start) as usize;
            let buf = &window[at..];
            match record::decode_header(buf, &self.key, self.offset) {
                Err(DecodeError::Short(n)) if n > self.need => self.need = n,
                Ok((header, header_bytes)) => self.found(header, header_bytes),
                Err(DecodeError::Padding) => self.padding(buf),
                Err(e) => self.bad(e),
            }
        }
    }

    fn finish_step(&mut self) -> Step {
        self.done = true;
        if let Some(from) = self.bad_from.take() {
            self.result.tail_bad_from = Some(from);
        }
        Step::Done
    }

    fn advance(&mut self, to: u64) {
        debug_assert!(to > self.offset);
        self.offset = to;
        self.need = record::FIXED_HEADER_BYTES;
    }

    fn found(&mut self, header: Header, header_bytes: usize) {
        let span = record::record_span_bytes(header_bytes as u64, header.payload_bytes);
        if span > self.size_bytes - self.offset {
            // The payload runs past the end of the file: torn.
            return self.bad(DecodeError::Short(header_bytes));
        }
        if let Some(from) = self.bad_from.take() {
            self.result.damaged.push((from, self.offset));
        }
        let end = self.offset + span;
        self.result.valid_end = end;
        if header.kind() == Kind::Seal {
            self.result.sealed = true;
            self.done = true;
            return;
        }
        self.result.records.push(Scanned {
            offset: self.offset,
            header_bytes: header_bytes as u32,
            header,
        });
        self.advance(end);
    }

    /// Zeros where a magic was expected: padding to the next batch, a hole
    /// left by a lost write, or the unwritten end of the file.
    // `u64::is_multiple_of` needs Rust 1.87; the workspace declares 1.85.
    #[allow(clippy::manual_is_multiple_of)]
    fn padding(&mut self, buf: &[u8]) {
        if self.key.version == record::VERSION_1 {
            // Version 1 batches start 4 KiB aligned, one right after the
            // other, so padding is followed by a block that starts a batch
            // (or the seal). A whole block of zeros there is the end of the
            // data: anything after it was written after a hole (a batch
            // torn at a crash, never acknowledged), where a version-1 scan
            // could take a header planted in a payload for a record.
            let block = super::file::WRITE_ALIGN_BYTES;
            if self.offset % block == 0 {
                let whole = (block.min(self.size_bytes - self.offset)) as usize;
                if buf.len() < whole {
                    self.need = whole;
                    return;
                }
                if buf[..whole].iter().all(|b| *b == 0) {
                    self.done = true;
                    return;
                }
            }
            let next = (self.offset + 1).next_multiple_of(block);
            return self.advance(next);
        }
        // Step over the zeros 8 bytes at a time: after damage the next
        // record need not start on a 4 KiB boundary.
        let align = record::RECORD_ALIGN_BYTES as usize;
        let mut skip = align;
        while skip + 4 <= buf.len() && buf[skip..skip + 4] == [0; 4] {
            skip += align;
        }
        self.advance(self.offset + skip as u64);
    }

    fn bad(&mut self, _e: DecodeError) {
        if self.key.version == record::VERSION_1 {
            // No safe resync in version 1 (see the module doc).
            self.result.tail_bad_from = Some(self.offset);
            self.done = true;
            return;
        }
        if self.bad_from.is_none() {
            self.bad_from = Some(self.offset);
        }
        self.advance(self.offset + record::RECORD_ALIGN_BYTES);
    }

    pub fn finish(mut self) -> ScanResult {
        if !self.done {
            self.finish_step();
        }
        self.result
    }
}

/// Scans a segment held in memory (fsck reads, the fuzz property).
pub fn scan_bytes(key: SegKey, bytes: &[u8]) -> ScanResult {
    let mut s = Scanner::new(key, bytes.len() as u64);
    let mut step = s.feed(&[], 0);
    while let Step::Read { offset, len } = step {
        let start = offset as usize;
        let end = start.saturating_add(len).min(bytes.len());
        step = s.feed(&bytes[start.min(end)..end], offset);
    }
    s.finish()
}

/// Scans with a synchronous read function (`read(offset, len)`), as
/// `percore fsck` does on files.
pub fn scan_with(
    key: SegKey,
    size_bytes: u64,
    mut read: impl FnMut(u64, usize) -> std::io::Result<Vec<u8>>,
) -> std::io::Result<ScanResult> {
    let mut s = Scanner::new(key, size_bytes);
    let mut step = s.feed(&[], 0);
    while let Step::Read { offset, len } = step {
        let w = read(offset, len)?;
        step = s.feed(&w, offset);
    }
    Ok(s.finish())
}

/// Which key each segment of a shard is read with, from the first bytes of
/// each segment file (`None` where it could not be read), in id order.
///
/// A segment whose own header verifies uses its own key. The shard secret
/// is the one most version-2 segment headers carry (all of them, unless
/// damaged). A segment whose header is damaged is version 2 if it comes
/// after the first intact version-2 segment (a shard moves from version 1
/// to 2 once, at an upgrade), else version 1. Returns the shard secret
/// (None if no version-2 segment exists yet) and one key per segment.
pub fn segment_keys(heads: &[(u64, Option<&[u8]>)]) -> (Option<u64>, Vec<(SegKey, bool)>) {
    let own: Vec<Option<SegKey>> = heads
        .iter()
        .map(|(id, head)| {
            head.and_then(|b| record::decode_segment_header(b, *id).ok())
                .map(|(_, _, key)| key)
        })
        .collect();
    let mut counts: std::collections::BTreeMap<u64, usize> = Default::default();
    for k in own
        .iter()
        .flatten()
        .filter(|k| k.version == record::VERSION)
    {
        *counts.entry(k.shard_secret).or_default() += 1;
    }
    let secret = counts
        .iter()
        .max_by_key(|(secret, n)| (**n, std::cmp::Reverse(**secret)))
        .map(|(s, _)| *s);
    let first_v2 = heads
        .iter()
        .zip(&own)
        .find(|(_, k)| k.is_some_and(|k| k.version == record::VERSION))
        .map(|((id, _), _)| *id);
    let keys = heads
        .iter()
        .zip(own)
        .map(|((id, _), k)| match (k, secret, first_v2) {
            (Some(k), _, _) => (k, true),
            (None, Some(secret), Some(first)) if *id > first => (SegKey::v2(secret, *id), false),
            _ => (SegKey::v1(*id), false),
        })
        .collect();
    (secret, keys)
}
