//! Background scrubber: re-reads sealed segments and checks every record
//! (header CRC, then each 64 KiB payload block against its CRC), so that
//! data rotting on the device is found while other copies (later: other
//! nodes) can still repair it, not when a client first reads it.
//!
//! A GET never serves bytes that fail their CRC whether or not the scrubber
//! ran; what the scrubber adds is finding the damage early and counting it
//! (`percore_scrub_*` metrics, an error log line naming the segment, offset
//! and key). It reads at most `scrub_bytes_per_sec_max`, one segment at a
//! time, with the segment pinned so compaction cannot delete it meanwhile.

use std::time::{Duration, Instant};

use super::recovery::{scan_segment, verify_payload};
use super::{Result, Store};

/// One damaged record found by a scrub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubFinding {
    pub segment_id: u64,
    pub offset: u64,
    pub bucket: String,
    pub key: String,
    /// The record is the current version of its key (a GET of it fails).
    pub live: bool,
    /// What failed: "payload CRC"; "damaged bytes" for a range the scan
    /// could not read as records (`offset` to `end`); "header" when a
    /// version-1 segment's records end before its seal.
    pub what: &'static str,
    /// End of a damaged range (0 for a record finding).
    pub end: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ScrubReport {
    pub segments: u64,
    pub records: u64,
    pub bytes_read: u64,
    pub findings: Vec<ScrubFinding>,
    pub elapsed_ms: u64,
}

impl Store {
    /// Scrubs one sealed segment. Unsealed ones (the active segment, or one
    /// abandoned after a write error) are skipped: recovery verifies those.
    pub async fn scrub_segment(&self, segment_id: u64) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        let sealed = self
            .inner
            .segs
            .table
            .borrow()
            .get(&segment_id)
            .map(|s| (s.sealed, s.file.clone(), s.key));
        let Some((true, file, seg_key)) = sealed else {
            return Ok(report);
        };
        self.pin(segment_id);
        let result = async {
            let size_bytes = file.size_bytes().await?;
            let scan = scan_segment(self, &file, size_bytes, seg_key).await?;
            report.segments = 1;
            report.bytes_read += scan.bytes_scanned;
            for &(from, to) in &scan.damaged {
                report.findings.push(ScrubFinding {
                    segment_id,
                    offset: from,
                    bucket: String::new(),
                    key: String::new(),
                    live: false,
                    what: "damaged bytes",
                    end: to,
                });
            }
            if !scan.sealed {
                // A sealed segment whose records stop before the seal: some
                // header no longer decodes (version 1 stops there).
                report.findings.push(ScrubFinding {
                    segment_id,
                    offset: scan.tail_bad_from.unwrap_or(scan.valid_end),
                    bucket: String::new(),
                    key: String::new(),
                    live: false,
                    what: "header",
                    end: size_bytes,
                });
            }
            if scan.is_damaged(seg_key.version) || !scan.sealed {
                if let Some(seg) = self.inner.segs.table.borrow_mut().get_mut(&segment_id) {
                    if !seg.damaged {
                        // Counted once per segment, not once per pass.
                        seg.damaged = true;
                        self.inner.stats.borrow_mut().damaged_regions +=
                            scan.damaged.len().max(1) as u64;
                    }
                }
            }
            for r in &scan.records {
                report.records += 1;
                if r.header.payload_bytes == 0 {
                    continue;
                }
                report.bytes_read += r.header.payload_bytes;
                if !verify_payload(self, &file, segment_id, r).await? {
                    let live = self
                        .lookup(&r.header.bucket, &r.header.key)
                        .is_some_and(|e| {
                            e.loc.segment_id == segment_id && e.loc.offset == r.offset
                        })
                        || self.extent_is_live(
                            &(r.header.bucket.clone(), r.header.key.clone()),
                            segment_id,
                            r.offset,
                        );
                    report.findings.push(ScrubFinding {
                        segment_id,
                        offset: r.offset,
                        bucket: r.header.bucket.clone(),
                        key: r.header.key.clone(),
                        live,
                        what: "payload CRC",
                        end: 0,
                    });
                }
                self.scrub_throttle(r.header.payload_bytes).await;
            }
            Ok(())
        }
        .await;
        self.unpin(segment_id);
        result.map(|()| report)
    }

    /// One pass over every sealed segment, oldest first.
    pub async fn scrub_pass(&self) -> Result<ScrubReport> {
        let started = Instant::now();
        let ids: Vec<u64> = self
            .inner
            .segs
            .table
            .borrow()
            .iter()
            .filter(|(_, s)| s.sealed)
            .map(|(id, _)| *id)
            .collect();
        let mut total = ScrubReport::default();
        for id in ids {
            if self.inner.shutting_down.get() {
                break;
            }
            let r = self.scrub_segment(id).await?;
            total.segments += r.segments;
            total.records += r.records;
            total.bytes_read += r.bytes_read;
            for f in r.findings {
                tracing::error!(
                    shard = self.inner.cfg.shard_id,
                    segment_id = f.segment_id,
                    offset = f.offset,
                    bucket = %f.bucket,
                    key = %f.key,
                    live = f.live,
                    "scrub: record failed its {}",
                    f.what
                );
                total.findings.push(f);
            }
        }
        total.elapsed_ms = started.elapsed().as_millis() as u64;
        let mut st = self.inner.stats.borrow_mut();
        st.scrub_passes += 1;
        st.scrub_bytes += total.bytes_read;
        st.scrub_corrupt_records += total.findings.len() as u64;
        st.scrub_last_pass_unix_ms = super::now_ms();
        st.scrub_last_pass_corrupt = total.findings.len() as u64;
        Ok(total)
    }

    async fn scrub_throttle(&self, bytes: u64) {
        let rate = self.inner.cfg.scrub_bytes_per_sec_max;
        if let Some(pause_us) = bytes.saturating_mul(1_000_000).checked_div(rate) {
            if pause_us > 0 {
                glommio::timer::sleep(Duration::from_micros(pause_us)).await;
            }
        }
    }
}
