//! Per-shard counters and latency histograms. Each shard owns its own (plain
//! `Cell`s, no atomics, no sharing); a scrape asks every shard for a
//! snapshot over the shard channels and renders the Prometheus text format
//! with a `shard` label.

pub mod catalogue;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Bucket upper bounds are 2^i microseconds, i = 0..BUCKETS-1 (1 µs ..
/// about 67 s), plus +Inf.
pub const BUCKETS: usize = 27;

#[derive(Default)]
pub struct Histogram {
    counts: [Cell<u64>; BUCKETS + 1],
    sum_us: Cell<u64>,
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        // Smallest i with us <= 2^i.
        let i = if us <= 1 {
            0
        } else {
            (64 - (us - 1).leading_zeros()) as usize
        };
        let c = &self.counts[i.min(BUCKETS)];
        c.set(c.get() + 1);
        self.sum_us.set(self.sum_us.get().saturating_add(us));
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self.counts.iter().map(Cell::get).collect(),
            sum_us: self.sum_us.get(),
        }
    }
}

/// Plain values, `Send`: crosses to the scraping shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Per bucket (not cumulative), the last one is +Inf.
    pub counts: Vec<u64>,
    pub sum_us: u64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Latency stages of a request, each a histogram per shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// A forwarded operation waiting in the owner's channel.
    Queue,
    /// A cross-shard call, sent to answered (seen from the caller).
    Hop,
    /// One group-commit batch: writes plus fdatasync.
    DeviceWrite,
    /// One read from a segment file (O_DIRECT), CRC check included.
    DeviceRead,
    /// A GET body written to the socket.
    Send,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::Queue,
        Stage::Hop,
        Stage::DeviceWrite,
        Stage::DeviceRead,
        Stage::Send,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::Hop => "cross_shard_hop",
            Stage::DeviceWrite => "device_write",
            Stage::DeviceRead => "device_read",
            Stage::Send => "send",
        }
    }
}

/// The shard's own counters (S3 front door and cross-shard layer).
#[derive(Default)]
pub struct ShardMetrics {
    /// (operation, status) -> count.
    requests: RefCell<BTreeMap<(&'static str, u16), u64>>,
    request_latency: RefCell<BTreeMap<&'static str, Histogram>>,
    stages: [Histogram; 5],
    pub bytes_in: Cell<u64>,
    pub bytes_out: Cell<u64>,
    pub connections_refused: Cell<u64>,
    pub connections_open: Cell<u64>,
    pub connections_accepted: Cell<u64>,
    pub requests_in_flight: Cell<u64>,
    /// Native protocol: (message kind, status) -> count, and latency.
    native_requests: RefCell<BTreeMap<(&'static str, u16), u64>>,
    native_latency: RefCell<BTreeMap<&'static str, Histogram>>,
    pub native_connections_open: Cell<u64>,
    pub native_connections_accepted: Cell<u64>,
    pub native_bad_frames: Cell<u64>,
    pub native_auth_failures: Cell<u64>,
    pub native_bytes_in: Cell<u64>,
    pub native_bytes_out: Cell<u64>,
    /// Lifecycle runner: objects expired, uploads aborted, passes run.
    pub lifecycle_expired: Cell<u64>,
    pub lifecycle_aborted: Cell<u64>,
    pub lifecycle_passes: Cell<u64>,
    /// Cluster routing (`frontend::s3::cluster`).
    pub cluster_forwarded: Cell<u64>,
    pub cluster_relayed: Cell<u64>,
    pub cluster_fanned_out: Cell<u64>,
    pub cluster_node_requests: Cell<u64>,
    pub cluster_node_refused: Cell<u64>,
    /// Node-to-node requests sent on a connection kept from an earlier
    /// one (`peer_http::pool_take`).
    pub cluster_kept_connections_used: Cell<u64>,
    /// Replication (`cluster::replicate`): writes whose copies the
    /// replicas took (acknowledged), writes refused for want of them, and
    /// copies this node's replicas took from others.
    pub cluster_replicated: Cell<u64>,
    pub cluster_replication_failed: Cell<u64>,
    pub cluster_replicas_skipped: Cell<u64>,
    pub cluster_copies_taken: Cell<u64>,
    pub cluster_copies_refused: Cell<u64>,
    /// Copies of keys of groups this node no longer holds, dropped once
    /// the groups' replicas all hold them (`replicate::start_drop_copies`).
    pub cluster_copies_dropped: Cell<u64>,
    /// Per replica (node id): the writes this shard acknowledged as a
    /// primary without that node's copy since it was last seen up and
    /// synced (`replicate::note_missed`; at most one entry per node in
    /// the map).
    pub replica_missed: RefCell<BTreeMap<u32, Missed>>,
}

/// Writes acknowledged without one replica's copy (`ShardMetrics::replica_missed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    /// How many.
    pub writes: u64,
    /// When the oldest was acknowledged (`cluster::control::mono_ms`).
    pub since_ms: u64,
    /// The map the latest was copied under: the entry goes once a newer
    /// map shows the node up and synced (it caught up since).
    pub epoch: u64,
}

impl ShardMetrics {
    pub fn record_request(&self, op: &'static str, status: u16, d: Duration) {
        *self.requests.borrow_mut().entry((op, status)).or_default() += 1;
        self.request_latency
            .borrow_mut()
            .entry(op)
            .or_default()
            .record(d);
    }

    pub fn record_native(&self, op: &'static str, status: u16, d: Duration) {
        *self
            .native_requests
            .borrow_mut()
            .entry((op, status))
            .or_default() += 1;
        self.native_latency
            .borrow_mut()
            .entry(op)
            .or_default()
            .record(d);
    }

    pub fn stage(&self, s: Stage) -> &Histogram {
        &self.stages[s as usize]
    }

    pub fn add(cell: &Cell<u64>, n: u64) {
        cell.set(cell.get().wrapping_add(n));
    }
}

/// Everything one shard reports to a scrape.
#[derive(Debug, Clone, Default)]
pub struct ShardSnapshot {
    pub shard: usize,
    pub requests: Vec<(&'static str, u16, u64)>,
    pub request_latency: Vec<(&'static str, HistogramSnapshot)>,
    pub native_requests: Vec<(&'static str, u16, u64)>,
    pub native_latency: Vec<(&'static str, HistogramSnapshot)>,
    pub stages: Vec<(&'static str, HistogramSnapshot)>,
    pub counters: Vec<(&'static str, &'static str, u64)>,
    pub gauges: Vec<(&'static str, &'static str, u64)>,
    /// (kind, bytes): live and garbage bytes of the shard's segments.
    pub segment_bytes: Vec<(&'static str, u64)>,
    /// (node id, writes, oldest's `mono_ms`): writes acknowledged without
    /// a replica's copy (`ShardMetrics::replica_missed`).
    pub replica_missed: Vec<(u32, u64, u64)>,
}

impl ShardMetrics {
    /// Requests, latencies and stages; the counters are read by
    /// `catalogue::own_snapshot`.
    pub fn snapshot_into(&self, out: &mut ShardSnapshot) {
        out.requests = self
            .requests
            .borrow()
            .iter()
            .map(|(&(op, status), &n)| (op, status, n))
            .collect();
        out.request_latency = self
            .request_latency
            .borrow()
            .iter()
            .map(|(&op, h)| (op, h.snapshot()))
            .collect();
        out.native_requests = self
            .native_requests
            .borrow()
            .iter()
            .map(|(&(op, status), &n)| (op, status, n))
            .collect();
        out.native_latency = self
            .native_latency
            .borrow()
            .iter()
            .map(|(&op, h)| (op, h.snapshot()))
            .collect();
        out.stages = Stage::ALL
            .iter()
            .map(|&s| (s.name(), self.stage(s).snapshot()))
            .collect();
    }
}

fn le_label(i: usize) -> String {
    if i >= BUCKETS {
        "+Inf".into()
    } else {
        // 2^i microseconds in seconds.
        let us = 1u64 << i;
        format!("{}", us as f64 / 1e6)
    }
}

fn render_histogram(out: &mut String, name: &str, labels: &str, h: &HistogramSnapshot) {
    let mut cumulative = 0;
    for (i, c) in h.counts.iter().enumerate() {
        cumulative += c;
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
            le_label(i)
        );
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
}

/// Prometheus text exposition (version 0.0.4) of all shards' snapshots.
pub fn render(shards: &[ShardSnapshot]) -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str("# HELP percore_s3_requests_total S3 requests by operation and HTTP status.\n# TYPE percore_s3_requests_total counter\n");
    for s in shards {
        for (op, status, n) in &s.requests {
            let _ = writeln!(
                out,
                "percore_s3_requests_total{{shard=\"{}\",op=\"{op}\",status=\"{status}\"}} {n}",
                s.shard
            );
        }
    }
    out.push_str("# HELP percore_s3_request_seconds S3 request latency, head read to response written, by operation.\n# TYPE percore_s3_request_seconds histogram\n");
    for s in shards {
        for (op, h) in &s.request_latency {
            let labels = format!("shard=\"{}\",op=\"{op}\"", s.shard);
            render_histogram(&mut out, "percore_s3_request_seconds", &labels, h);
        }
    }
    out.push_str("# HELP percore_native_requests_total Native protocol requests by message kind and status (0 = Ok; see docs/native.md).\n# TYPE percore_native_requests_total counter\n");
    for s in shards {
        for (op, status, n) in &s.native_requests {
            let _ = writeln!(
                out,
                "percore_native_requests_total{{shard=\"{}\",op=\"{op}\",status=\"{status}\"}} {n}",
                s.shard
            );
        }
    }
    out.push_str("# HELP percore_native_request_seconds Native request latency, frame read to final reply queued, by message kind.\n# TYPE percore_native_request_seconds histogram\n");
    for s in shards {
        for (op, h) in &s.native_latency {
            let labels = format!("shard=\"{}\",op=\"{op}\"", s.shard);
            render_histogram(&mut out, "percore_native_request_seconds", &labels, h);
        }
    }
    out.push_str("# HELP percore_stage_seconds Latency per stage: queue (forwarded op waiting on its owner), cross_shard_hop (forwarded call round trip), device_write (group-commit batch incl. fdatasync), device_read (segment read incl. CRC), send (GET body to socket).\n# TYPE percore_stage_seconds histogram\n");
    for s in shards {
        for (stage, h) in &s.stages {
            let labels = format!("shard=\"{}\",stage=\"{stage}\"", s.shard);
            render_histogram(&mut out, "percore_stage_seconds", &labels, h);
        }
    }
    let mut names: Vec<(&str, &str)> = Vec::new();
    for s in shards {
        for (n, help, _) in &s.counters {
            if !names.iter().any(|(m, _)| m == n) {
                names.push((n, help));
            }
        }
    }
    for (name, help) in names {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for s in shards {
            for (n, _, v) in s.counters.iter().filter(|(n, _, _)| *n == name) {
                let _ = writeln!(out, "{n}{{shard=\"{}\"}} {v}", s.shard);
            }
        }
    }
    let mut names: Vec<(&str, &str)> = Vec::new();
    for s in shards {
        for (n, help, _) in &s.gauges {
            if !names.iter().any(|(m, _)| m == n) {
                names.push((n, help));
            }
        }
    }
    for (name, help) in names {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for s in shards {
            for (n, _, v) in s.gauges.iter().filter(|(n, _, _)| *n == name) {
                let _ = writeln!(out, "{n}{{shard=\"{}\"}} {v}", s.shard);
            }
        }
    }
    out.push_str("# HELP percore_segment_bytes Bytes of the shard's segment files that the index references (live) or not (garbage).\n# TYPE percore_segment_bytes gauge\n");
    for s in shards {
        for (kind, v) in &s.segment_bytes {
            let _ = writeln!(
                out,
                "percore_segment_bytes{{shard=\"{}\",kind=\"{kind}\"}} {v}",
                s.shard
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_powers_of_two_microseconds() {
        let h = Histogram::default();
        for us in [0, 1, 2, 3, 4, 5, 1000, 1024, 1025] {
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::from_secs(1000));
        let s = h.snapshot();
        assert_eq!(s.counts[0], 2); // 0, 1
        assert_eq!(s.counts[1], 1); // 2
        assert_eq!(s.counts[2], 2); // 3, 4
        assert_eq!(s.counts[3], 1); // 5
        assert_eq!(s.counts[10], 2); // 1000, 1024
        assert_eq!(s.counts[11], 1); // 1025
        assert_eq!(s.counts[BUCKETS], 1); // +Inf
        assert_eq!(s.count(), 10);
    }

    #[test]
    fn render_is_cumulative_and_labelled() {
        let h = Histogram::default();
        h.record(Duration::from_micros(3));
        h.record(Duration::from_micros(100));
        let snap = ShardSnapshot {
            shard: 2,
            requests: vec![("GetObject", 200, 7)],
            request_latency: vec![("GetObject", h.snapshot())],
            ..Default::default()
        };
        let text = render(&[snap]);
        assert!(text.contains(
            "percore_s3_requests_total{shard=\"2\",op=\"GetObject\",status=\"200\"} 7\n"
        ));
        assert!(text.contains(
            "percore_s3_request_seconds_bucket{shard=\"2\",op=\"GetObject\",le=\"0.000004\"} 1\n"
        ));
        assert!(text.contains(
            "percore_s3_request_seconds_bucket{shard=\"2\",op=\"GetObject\",le=\"0.000128\"} 2\n"
        ));
        assert!(text.contains(
            "percore_s3_request_seconds_bucket{shard=\"2\",op=\"GetObject\",le=\"+Inf\"} 2\n"
        ));
        assert!(text.contains("percore_s3_request_seconds_count{shard=\"2\",op=\"GetObject\"} 2\n"));
    }
}
