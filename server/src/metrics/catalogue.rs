//! The catalogue of per-shard metrics: every counter and gauge a shard
//! reports, with its Prometheus name, help text and type, and the named
//! field of the shard's, store's or ring's statistics it reads.
//!
//! A shard gathers its raw statistics into a [`ShardRaw`] (plain values,
//! named fields) and hands them to [`shard_snapshot`]; nothing else in the
//! server spells a metric name. The order of the tables is the order of the
//! families in the `/metrics` output (a family appears where its first
//! sample does), so keep new entries at the end of their table.

use crate::metrics::{HistogramSnapshot, ShardMetrics, ShardSnapshot, Stage};
use crate::ring::RingStats;
use crate::store::StoreStats;

/// One catalogue entry: name, help text, and how to read its value from `T`.
type Entry<T> = (&'static str, &'static str, fn(&T) -> u64);

/// Native-protocol counters of the shard's own metrics.
const NATIVE_COUNTERS: &[Entry<ShardMetrics>] = &[
    (
        "percore_native_bytes_in_total",
        "Object bytes received by the native endpoint (PUT payloads).",
        |m| m.native_bytes_in.get(),
    ),
    (
        "percore_native_bytes_out_total",
        "Object bytes sent by the native endpoint (Chunk payloads).",
        |m| m.native_bytes_out.get(),
    ),
    (
        "percore_native_connections_accepted_total",
        "Native connections accepted by this shard's listener.",
        |m| m.native_connections_accepted.get(),
    ),
    (
        "percore_native_bad_frames_total",
        "Native frames refused (bad header, unknown kind, failed verification).",
        |m| m.native_bad_frames.get(),
    ),
    (
        "percore_native_auth_failures_total",
        "Native Hello messages with a wrong key or MAC.",
        |m| m.native_auth_failures.get(),
    ),
];

/// Cluster routing counters of the S3 door (zero on a single node).
const CLUSTER_COUNTERS: &[Entry<ShardMetrics>] = &[
    (
        "percore_cluster_s3_forwarded_total",
        "S3 requests forwarded to the node that owns their key.",
        |m| m.cluster_forwarded.get(),
    ),
    (
        "percore_cluster_s3_relayed_total",
        "S3 forwards sent through another node because the key's owner could not be reached from this one.",
        |m| m.cluster_relayed.get(),
    ),
    (
        "percore_cluster_s3_fanned_out_total",
        "S3 bucket changes recorded in the cluster's bucket catalog (etcd) and applied on every serving node.",
        |m| m.cluster_fanned_out.get(),
    ),
    (
        "percore_cluster_node_requests_total",
        "Node-to-node requests whose node header verified (forwarded S3 requests, internal listings and deletes; an internal one may still be refused for its body hash or as a replay).",
        |m| m.cluster_node_requests.get(),
    ),
    (
        "percore_cluster_node_refused_total",
        "Node-to-node headers that did not verify (wrong secret, stale time, forged).",
        |m| m.cluster_node_refused.get(),
    ),
    (
        "percore_cluster_kept_connections_used_total",
        "Node-to-node requests (copies to replicas, forwarded GETs and HEADs) sent on a connection kept open from an earlier one instead of a new connection.",
        |m| m.cluster_kept_connections_used.get(),
    ),
    (
        "percore_cluster_writes_replicated_total",
        "Writes this node ordered as a placement group's primary that a majority of the group took, and every other up replica too or was recorded in etcd as having missed (acknowledged).",
        |m| m.cluster_replicated.get(),
    ),
    (
        "percore_cluster_writes_unreplicated_total",
        "Writes this node ordered as a primary that were answered 503 because their copies did not reach a majority, or a missed copy could not be recorded in etcd (not acknowledged; alert on a rate).",
        |m| m.cluster_replication_failed.get(),
    ),
    (
        "percore_cluster_writes_replica_skipped_total",
        "Acknowledged writes whose copy failed on an up replica (down but not yet marked, cut off, sick): each was recorded in etcd first, and that replica catches up before it leads (alert on a rate).",
        |m| m.cluster_replicas_skipped.get(),
    ),
    (
        "percore_cluster_copies_taken_total",
        "Copies of keys (versions and tombstones) this node took as a replica from a primary.",
        |m| m.cluster_copies_taken.get(),
    ),
    (
        "percore_cluster_copies_refused_total",
        "Copies this node refused as a replica: from a node that is not the key's primary in its map, sent under an older map than a catch-up read, or with bytes that did not match their state.",
        |m| m.cluster_copies_refused.get(),
    ),
    (
        "percore_cluster_copies_dropped_total",
        "Live copies of keys of placement groups this node no longer holds or leads, dropped once each of the groups' replicas is up and synced (the space is freed by compaction).",
        |m| m.cluster_copies_dropped.get(),
    ),
];

/// Lifecycle runner counters of the shard's own metrics.
const LIFECYCLE_COUNTERS: &[Entry<ShardMetrics>] = &[
    (
        "percore_lifecycle_expired_objects_total",
        "Objects deleted by lifecycle Expiration rules.",
        |m| m.lifecycle_expired.get(),
    ),
    (
        "percore_lifecycle_aborted_uploads_total",
        "Multipart uploads aborted by AbortIncompleteMultipartUpload rules.",
        |m| m.lifecycle_aborted.get(),
    ),
    (
        "percore_lifecycle_passes_total",
        "Lifecycle passes run.",
        |m| m.lifecycle_passes.get(),
    ),
];

/// S3 front-door counters of the shard's own metrics.
const S3_COUNTERS: &[Entry<ShardMetrics>] = &[
    (
        "percore_s3_bytes_in_total",
        "Request body bytes received by the S3 endpoint.",
        |m| m.bytes_in.get(),
    ),
    (
        "percore_s3_bytes_out_total",
        "Response body bytes sent by the S3 endpoint.",
        |m| m.bytes_out.get(),
    ),
    (
        "percore_connections_accepted_total",
        "S3 connections accepted by this shard's listener (CPU steering shows here).",
        |m| m.connections_accepted.get(),
    ),
    (
        "percore_connections_refused_total",
        "Connections closed at accept because the per-shard limit was reached.",
        |m| m.connections_refused.get(),
    ),
];

/// The data ring's counters (shards with a data ring only).
const RING_COUNTERS: &[Entry<RingRaw>] = &[
    ("percore_ring_sends_zero_copy_total", "SEND_ZC sends the kernel completed without copying.", |r| r.stats.sends_zero_copy),
    ("percore_ring_sends_copied_total", "SEND_ZC sends the kernel reported as copied (always so on loopback and veth).", |r| r.stats.sends_copied),
    ("percore_ring_sends_plain_total", "Plain sends from registered buffers (below the SEND_ZC threshold, SEND_ZC unsupported, or declined).", |r| r.stats.sends_plain),
    ("percore_ring_sends_zc_declined_total", "Plain sends at SEND_ZC sizes on sockets whose earlier SEND_ZC the kernel copied (loopback, veth).", |r| r.stats.sends_zc_declined),
    ("percore_ring_reads_fixed_total", "READ_FIXED reads into registered buffers.", |r| r.stats.reads_fixed),
    ("percore_ring_writes_fixed_total", "WRITE_FIXED batch pieces written from registered buffers.", |r| r.stats.writes_fixed),
    ("percore_ring_sq_full_total", "Times the submission queue was full and had to be submitted early.", |r| r.stats.sq_full),
    ("percore_ring_submit_calls_total", "io_uring_enter calls for submission.", |r| r.stats.submit_calls),
    ("percore_ring_sqes_submitted_total", "SQEs submitted.", |r| r.stats.submitted),
    ("percore_ring_cq_overflow_total", "Completions the kernel could not post because the completion queue was full.", |r| r.cq_overflow),
];

/// The data ring's gauges.
const RING_GAUGES: &[Entry<RingRaw>] = &[(
    "percore_ring_files_registered",
    "Segment files in the ring's registered-file table.",
    |r| r.files_registered,
)];

/// The ring's buffer pool (rings with a pool only): (gauge, counter).
const POOL_GAUGE: Entry<PoolRaw> = (
    "percore_ring_buffers_in_use",
    "Registered buffers held by reads and sends in flight.",
    |p| p.buffers_in_use,
);
const POOL_COUNTER: Entry<PoolRaw> = (
    "percore_ring_buffer_waits_total",
    "Times the pool had no free buffer (a GET waited for one, or a batch write used an unregistered buffer).",
    |p| p.buffer_waits,
);

/// The store's counters.
const STORE_COUNTERS: &[Entry<StoreStats>] = &[
    ("percore_store_flushes_total", "Group-commit batches made durable (write + fdatasync).", |s| s.flushes),
    ("percore_store_records_written_total", "Records appended to segments.", |s| s.records_written),
    ("percore_store_bytes_written_total", "Bytes written to segments (records and padding).", |s| s.bytes_written),
    ("percore_store_write_errors_total", "Batches whose write or fdatasync failed (disk errors, ENOSPC).", |s| s.write_errors),
    ("percore_store_corrupt_reads_total", "Reads that failed a CRC check: never served.", |s| s.corrupt_reads),
    ("percore_store_crc_cache_hits_total", "Extent block-CRC lookups answered from the shard's cache (no header read).", |s| s.crc_cache_hits),
    ("percore_store_crc_cache_misses_total", "Extent block-CRC lookups that read the extent's header from disk.", |s| s.crc_cache_misses),
    ("percore_store_header_cache_hits_total", "Opens of extent-stored objects whose header came from the shard's cache.", |s| s.header_cache_hits),
    ("percore_store_header_cache_misses_total", "Opens of extent-stored objects that read the object's header from disk.", |s| s.header_cache_misses),
    ("percore_object_cache_hits_total", "Object payloads (small objects, extents) served from the shard's object cache, without a device read.", |s| s.object_cache.hits),
    ("percore_object_cache_misses_total", "Object cache lookups that found nothing (the payload was read from the device).", |s| s.object_cache.misses),
    ("percore_object_cache_inserts_total", "Payloads admitted into the object cache.", |s| s.object_cache.inserts),
    ("percore_object_cache_evictions_total", "Payloads evicted from the object cache to make room (S3-FIFO).", |s| s.object_cache.evictions),
    ("percore_object_cache_invalidations_total", "Cached payloads dropped because their record stopped being current (overwrite, delete, compaction, cache drop).", |s| s.object_cache.invalidations),
    ("percore_object_cache_declined_total", "Payloads not copied into the cache on their first miss (their key is remembered; a second miss admits them).", |s| s.object_cache.declined),
    ("percore_compaction_segments_total", "Segments compacted and deleted.", |s| s.segments_compacted),
    ("percore_compaction_bytes_copied_total", "Bytes of live records copied by compaction.", |s| s.compaction_bytes_copied),
    ("percore_compaction_bytes_freed_total", "Bytes of segment files deleted by compaction.", |s| s.compaction_bytes_freed),
    ("percore_store_damaged_regions_total", "Ranges of segment bytes that recovery, compaction or the scrubber could not read as records (damaged records; see the error log and percore fsck).", |s| s.damaged_regions),
    ("percore_compaction_skipped_damaged_total", "Compactions refused because the segment holds damage (it is kept for repair).", |s| s.compaction_skipped_damaged),
    ("percore_scrub_passes_total", "Background scrub passes over the sealed segments completed.", |s| s.scrub_passes),
    ("percore_scrub_bytes_total", "Bytes read and checked by the scrubber.", |s| s.scrub_bytes),
    ("percore_scrub_corrupt_records_total", "Records the scrubber found failing their CRC (see the error log for segment, offset and key).", |s| s.scrub_corrupt_records),
];

/// The store's gauges (object cache, scrub).
const STORE_GAUGES: &[Entry<StoreStats>] = &[
    (
        "percore_object_cache_bytes",
        "Bytes the shard's object cache holds (buffers plus entry overhead).",
        |s| s.object_cache.bytes,
    ),
    (
        "percore_object_cache_bytes_max",
        "The shard's object cache budget (object_cache_mb split among the shards).",
        |s| s.object_cache.bytes_max,
    ),
    (
        "percore_object_cache_entries",
        "Payloads in the shard's object cache.",
        |s| s.object_cache.entries,
    ),
    (
        "percore_scrub_last_pass_timestamp_seconds",
        "Unix time the last scrub pass ended (0: none since start).",
        |s| s.scrub_last_pass_unix_ms / 1000,
    ),
    (
        "percore_scrub_last_pass_corrupt_records",
        "Damaged records the last scrub pass found (each pass counts them again).",
        |s| s.scrub_last_pass_corrupt,
    ),
];

/// Gauges of the shard as a whole (index, segments, connections, sessions).
const SHARD_GAUGES: &[Entry<ShardRaw>] = &[
    ("percore_objects", "Objects in the shard's index.", |r| {
        r.objects
    }),
    ("percore_segments", "Segment files of the shard.", |r| {
        r.segments.count
    }),
    (
        "percore_connections_open",
        "Open S3 connections accepted by the shard.",
        |r| r.connections_open,
    ),
    (
        "percore_native_connections_open",
        "Open native-protocol connections accepted by the shard.",
        |r| r.native_connections_open,
    ),
    (
        "percore_requests_in_flight",
        "S3 and native requests being served by the shard.",
        |r| r.requests_in_flight,
    ),
    (
        "percore_cross_shard_sessions",
        "Streamed GET/PUT sessions held for other shards.",
        |r| r.cross_shard.sessions_open,
    ),
    (
        "percore_cross_shard_calls_pending",
        "Calls to other shards awaiting a reply.",
        |r| r.cross_shard.calls_pending,
    ),
];

/// The MD5 engine's counters (uploads' ETags).
const MD5_COUNTERS: &[Entry<crate::digest::engine::Md5EngineStats>] = &[
    ("percore_md5_runs_total", "Runs of the shard's MD5 engine (each hashes the queued bytes of every upload).", |m| m.runs),
    ("percore_md5_queues_total", "Upload queues hashed by those runs (divided by runs: the mean SIMD lanes busy).", |m| m.jobs),
    ("percore_md5_lane_bytes_total", "Upload bytes hashed in SIMD lanes together with other uploads' bytes.", |m| m.lane_bytes),
    ("percore_md5_scalar_bytes_total", "Upload bytes hashed one stream at a time (short appends, a lone upload, CPUs without AVX-512).", |m| m.scalar_bytes),
];

/// Counters of the cross-shard layer.
const CROSS_SHARD_COUNTERS: &[Entry<CrossShardRaw>] = &[
    (
        "percore_cross_shard_calls_timed_out_total",
        "Calls to other shards that got no reply within cross_shard_timeout_s.",
        |c| c.calls_timed_out,
    ),
    (
        "percore_cross_shard_orphaned_sessions_closed_total",
        "Sessions another shard opened for a call that had given up, closed again.",
        |c| c.orphaned_sessions_closed,
    ),
    (
        "percore_cross_shard_sessions_expired_total",
        "Sessions held for other shards closed after session_idle_timeout_s without use.",
        |c| c.sessions_expired,
    ),
];

/// The data ring's statistics at the scrape.
#[derive(Debug, Clone, Default)]
pub struct RingRaw {
    pub stats: RingStats,
    pub cq_overflow: u64,
    pub files_registered: u64,
    /// None when the ring has no registered-buffer pool.
    pub pool: Option<PoolRaw>,
}

/// The ring's registered-buffer pool at the scrape.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolRaw {
    pub buffers_in_use: u64,
    pub buffer_waits: u64,
}

/// The shard's segment files, summed.
#[derive(Debug, Clone, Copy, Default)]
pub struct SegmentUsage {
    /// Segment files.
    pub count: u64,
    /// Bytes up to each segment's end.
    pub total_bytes: u64,
    /// Bytes the index references.
    pub live_bytes: u64,
}

impl SegmentUsage {
    /// Sums the store's segment table, rows of (segment id, end bytes, live
    /// bytes, sealed) as `Store::segment_table` returns them.
    pub fn from_table(table: &[(u64, u64, u64, bool)]) -> SegmentUsage {
        let mut usage = SegmentUsage {
            count: table.len() as u64,
            ..SegmentUsage::default()
        };
        for &(_id, end_bytes, live_bytes, _sealed) in table {
            usage.total_bytes += end_bytes;
            usage.live_bytes += live_bytes;
        }
        usage
    }
}

/// The cross-shard layer's state at the scrape.
#[derive(Debug, Clone, Copy, Default)]
pub struct CrossShardRaw {
    pub sessions_open: u64,
    pub calls_pending: u64,
    pub calls_timed_out: u64,
    pub orphaned_sessions_closed: u64,
    pub sessions_expired: u64,
}

/// Everything a shard hands to the catalogue besides its own `ShardMetrics`.
#[derive(Debug, Clone, Default)]
pub struct ShardRaw {
    /// The store's device latencies (they replace the shard's own stages).
    pub device_write: HistogramSnapshot,
    pub device_read: HistogramSnapshot,
    /// None when the shard serves without a data ring.
    pub ring: Option<RingRaw>,
    pub store: StoreStats,
    pub segments: SegmentUsage,
    pub objects: u64,
    pub connections_open: u64,
    pub native_connections_open: u64,
    pub requests_in_flight: u64,
    pub cross_shard: CrossShardRaw,
    pub md5: crate::digest::engine::Md5EngineStats,
}

fn push<T>(out: &mut Vec<(&'static str, &'static str, u64)>, table: &[Entry<T>], from: &T) {
    out.extend(
        table
            .iter()
            .map(|(name, help, read)| (*name, *help, read(from))),
    );
}

/// The shard's own counters (requests, latencies, stages, front doors).
pub fn own_snapshot(metrics: &ShardMetrics, out: &mut ShardSnapshot) {
    metrics.snapshot_into(out);
    push(&mut out.counters, NATIVE_COUNTERS, metrics);
    push(&mut out.counters, S3_COUNTERS, metrics);
    push(&mut out.counters, LIFECYCLE_COUNTERS, metrics);
    push(&mut out.counters, CLUSTER_COUNTERS, metrics);
}

/// One shard's full snapshot for a scrape: its own metrics plus `raw`.
pub fn shard_snapshot(shard: usize, metrics: &ShardMetrics, raw: &ShardRaw) -> ShardSnapshot {
    let mut out = ShardSnapshot {
        shard,
        ..Default::default()
    };
    own_snapshot(metrics, &mut out);
    for (name, h) in out.stages.iter_mut() {
        if *name == Stage::DeviceWrite.name() {
            *h = raw.device_write.clone();
        } else if *name == Stage::DeviceRead.name() {
            *h = raw.device_read.clone();
        }
    }
    if let Some(ring) = &raw.ring {
        push(&mut out.counters, RING_COUNTERS, ring);
        push(&mut out.gauges, RING_GAUGES, ring);
        if let Some(pool) = &ring.pool {
            push(&mut out.gauges, std::slice::from_ref(&POOL_GAUGE), pool);
            push(&mut out.counters, std::slice::from_ref(&POOL_COUNTER), pool);
        }
    }
    push(&mut out.counters, STORE_COUNTERS, &raw.store);
    push(&mut out.counters, MD5_COUNTERS, &raw.md5);
    push(&mut out.gauges, STORE_GAUGES, &raw.store);
    out.segment_bytes = vec![
        ("live", raw.segments.live_bytes),
        (
            "garbage",
            raw.segments
                .total_bytes
                .saturating_sub(raw.segments.live_bytes),
        ),
    ];
    push(&mut out.gauges, SHARD_GAUGES, raw);
    push(&mut out.counters, CROSS_SHARD_COUNTERS, &raw.cross_shard);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name is unique, a counter ends in `_total` and a gauge does not.
    #[test]
    fn names_are_unique_and_typed_by_suffix() {
        let raw = ShardRaw {
            ring: Some(RingRaw {
                pool: Some(PoolRaw::default()),
                ..RingRaw::default()
            }),
            ..ShardRaw::default()
        };
        let snap = shard_snapshot(0, &ShardMetrics::default(), &raw);
        let mut names: Vec<&str> = snap.counters.iter().map(|c| c.0).collect();
        for (name, _, _) in &snap.counters {
            assert!(name.ends_with("_total"), "{name}");
        }
        for (name, _, _) in &snap.gauges {
            assert!(!name.ends_with("_total"), "{name}");
            names.push(name);
        }
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a metric name appears twice");
        // ... + object cache counters and gauges + MD5 engine counters
        // + lifecycle counters + cluster routing and replication counters.
        assert_eq!(
            count,
            5 + 4 + 10 + 1 + 17 + 3 + 1 + 1 + 2 + 7 + 6 + 3 + 4 + 3 + 12
        );
    }

    /// Values come from the named fields; device stages are the store's.
    #[test]
    fn values_are_read_from_named_fields() {
        let metrics = ShardMetrics::default();
        metrics.bytes_in.set(11);
        let raw = ShardRaw {
            device_write: HistogramSnapshot {
                sum_us: 9,
                ..HistogramSnapshot::default()
            },
            store: StoreStats {
                flushes: 3,
                scrub_last_pass_unix_ms: 7_500,
                ..StoreStats::default()
            },
            segments: SegmentUsage::from_table(&[(1, 100, 40, true), (2, 50, 50, false)]),
            cross_shard: CrossShardRaw {
                sessions_expired: 2,
                ..CrossShardRaw::default()
            },
            ..ShardRaw::default()
        };
        let snap = shard_snapshot(4, &metrics, &raw);
        let value = |name: &str| {
            snap.counters
                .iter()
                .chain(snap.gauges.iter())
                .find(|c| c.0 == name)
                .map(|c| c.2)
        };
        assert_eq!(snap.shard, 4);
        assert_eq!(value("percore_s3_bytes_in_total"), Some(11));
        assert_eq!(value("percore_store_flushes_total"), Some(3));
        assert_eq!(value("percore_scrub_last_pass_timestamp_seconds"), Some(7));
        assert_eq!(value("percore_segments"), Some(2));
        assert_eq!(value("percore_cross_shard_sessions_expired_total"), Some(2));
        assert_eq!(value("percore_ring_sqes_submitted_total"), None);
        assert_eq!(snap.segment_bytes, vec![("live", 90), ("garbage", 60)]);
        let write = snap.stages.iter().find(|s| s.0 == "device_write").unwrap();
        assert_eq!(write.1.sum_us, 9);
    }
}
