//! Configuration: CLI flags > environment > TOML file > defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

pub const ACCESS_KEY_DEFAULT: &str = "percore";
pub const SECRET_KEY_DEFAULT: &str = "percore-secret";
pub const S3_ADDR_DEFAULT: &str = "127.0.0.1:9000";
pub const NATIVE_ADDR_DEFAULT: &str = "127.0.0.1:9100";
pub const ADMIN_ADDR_DEFAULT: &str = "127.0.0.1:9300";
pub const DATA_DIR_DEFAULT: &str = "./percore-data";

/// `percore serve` flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Data directory (default ./percore-data).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// S3 endpoint address (default 127.0.0.1:9000).
    #[arg(long, value_name = "ADDR:PORT")]
    pub s3: Option<SocketAddr>,
    /// Native protocol address of shard 0 (default 127.0.0.1:9100); shard i listens on port + i (port 0: ephemeral ports, reported in the Hello reply).
    #[arg(long, value_name = "ADDR:PORT")]
    pub native: Option<SocketAddr>,
    /// Admin (health) address (default 127.0.0.1:9300).
    #[arg(long, value_name = "ADDR:PORT")]
    pub admin: Option<SocketAddr>,
    /// Number of shards (default: one per physical core).
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,
    /// CPUs to pin shards to, e.g. 0-3,8 (default: the first hardware thread of each core).
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Do not pin shards to CPUs (lets tests run more shards than cores).
    #[arg(long)]
    pub unpinned: bool,
    /// Serve virtual-hosted-style requests (Host: BUCKET.DOMAIN) for this
    /// domain, besides path-style ones.
    #[arg(long, value_name = "DOMAIN")]
    pub s3_domain: Option<String>,
    /// Log one line per S3 request (tracing target percore::access).
    #[arg(long)]
    pub access_log: bool,
    /// Serve GETs with the copy path only: no per-shard io_uring data ring
    /// (READ_FIXED into registered buffers, SEND_ZC).
    #[arg(long)]
    pub no_data_ring: bool,
    /// Memory for the object cache (hot objects served without a device
    /// read), MiB for the whole node, split among the shards; 0 turns it
    /// off (default: a quarter of the RAM).
    #[arg(long, value_name = "MIB")]
    pub object_cache_mb: Option<u64>,
    /// TOML configuration file (flags override it).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Join the cluster in these etcd endpoints (http://HOST:PORT,...);
    /// without it percore is a single node.
    #[arg(long, value_name = "URLS")]
    pub cluster: Option<String>,
    /// This node's name in the cluster (kept across restarts).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// This node's failure domain (rack, room): replicas go to distinct
    /// zones where possible (default: the node's name).
    #[arg(long, value_name = "ZONE")]
    pub zone: Option<String>,
    /// The cluster's name in etcd (default percore).
    #[arg(long, value_name = "NAME")]
    pub cluster_name: Option<String>,
}

/// The TOML file; every key optional, unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data: Option<PathBuf>,
    pub s3: Option<SocketAddr>,
    pub native: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub shards: Option<usize>,
    pub cpus: Option<String>,
    pub unpinned: Option<bool>,
    pub region: Option<String>,
    pub s3_domain: Option<String>,
    pub access_log: Option<bool>,
    pub data_ring: Option<bool>,
    pub ring_sqpoll_idle_ms: Option<u32>,
    pub ring_sqpoll_cpus: Option<String>,
    pub ring_submit_batch: Option<usize>,
    pub ring_send_zc_min_bytes: Option<usize>,
    pub segment_bytes_max: Option<u64>,
    pub object_cache_mb: Option<u64>,
    pub scrub_interval_s: Option<u64>,
    pub scrub_mb_per_sec: Option<u64>,
    pub lifecycle_interval_s: Option<u64>,
    pub lifecycle_actions_per_sec: Option<u64>,
    pub lifecycle_day_s: Option<u64>,
    pub connections_per_shard_max: Option<usize>,
    pub header_timeout_s: Option<u64>,
    pub idle_timeout_s: Option<u64>,
    pub body_timeout_s: Option<u64>,
    pub admin_open_writes: Option<bool>,
    pub cross_shard_timeout_s: Option<u64>,
    pub session_idle_timeout_s: Option<u64>,
    pub native_put_data_timeout_s: Option<u64>,
    pub cluster: Option<String>,
    pub node: Option<String>,
    pub zone: Option<String>,
    pub cluster_name: Option<String>,
    pub cluster_lease_ttl_s: Option<u64>,
    pub cluster_backfill_mib_s: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub data: PathBuf,
    pub s3: SocketAddr,
    pub native: SocketAddr,
    pub admin: SocketAddr,
    pub shards: Option<usize>,
    pub cpus: Option<Vec<usize>>,
    pub unpinned: bool,
    pub region: String,
    pub s3_domain: Option<String>,
    pub access_log: bool,
    pub data_ring: bool,
    /// Data ring tuning: SQPOLL (None: off), SQEs per submit, SEND_ZC size.
    pub ring_sqpoll_idle_ms: Option<u32>,
    /// CPUs for the SQPOLL threads, shard i on the (i mod n)-th; None: the
    /// kernel chooses.
    pub ring_sqpoll_cpus: Option<Vec<usize>>,
    pub ring_submit_batch: usize,
    pub ring_send_zc_min_bytes: usize,
    pub segment_bytes_max: u64,
    /// Memory for the object cache, MiB for the whole node (split evenly
    /// among the shards); 0 turns it off. Default: a quarter of the RAM.
    pub object_cache_mb: u64,
    /// Seconds between background scrub passes (0: off).
    pub scrub_interval_s: u64,
    /// Scrub read rate, MB/s.
    pub scrub_mb_per_sec: u64,
    /// Seconds between lifecycle passes on each shard (0: off).
    pub lifecycle_interval_s: u64,
    /// Lifecycle deletes and aborts per second per shard.
    pub lifecycle_actions_per_sec: u64,
    /// Length of a lifecycle day in seconds (86,400; shorter in tests).
    pub lifecycle_day_s: u64,
    /// Open connections per shard and front door (S3, native); past it a
    /// new connection is closed at once.
    pub connections_per_shard_max: usize,
    /// S3: first byte of a request head to its end; waiting for the next
    /// request on a kept-alive connection.
    pub header_timeout_s: u64,
    pub idle_timeout_s: u64,
    /// S3: longest wait for the next bytes of a request body (or for the
    /// client to take the next bytes of a response); past it 408.
    pub body_timeout_s: u64,
    /// Longest wait for another shard to answer a forwarded operation.
    pub cross_shard_timeout_s: u64,
    /// A streamed GET/PUT session held for another shard is closed after
    /// this long without an operation.
    pub session_idle_timeout_s: u64,
    /// Native: longest wait for the next PutData frame of a Put; past it
    /// the upload is aborted.
    pub native_put_data_timeout_s: u64,
    pub access_key: String,
    pub secret_key: String,
    pub default_credentials: bool,
    /// Admin writes (PUT /log/level) without `Authorization: Bearer
    /// <secret key>`; off by default.
    pub admin_open_writes: bool,
    /// `--cluster`: this node joins a cluster.
    pub cluster: Option<crate::cluster::control::ClusterSettings>,
}

/// Environment names that were renamed to match their file key, as
/// (old, new). The old ones are still read, with a warning, when the new one
/// is not set.
pub const ENV_ALIASES: &[(&str, &str)] = &[
    ("PERCORE_RING_SQPOLL_MS", "PERCORE_RING_SQPOLL_IDLE_MS"),
    ("PERCORE_RING_BATCH", "PERCORE_RING_SUBMIT_BATCH"),
    ("PERCORE_RING_ZC_MIN", "PERCORE_RING_SEND_ZC_MIN_BYTES"),
    (
        "PERCORE_CONNECTIONS_MAX",
        "PERCORE_CONNECTIONS_PER_SHARD_MAX",
    ),
];

/// The environment name of a setting: `PERCORE_` and its file key in
/// upper case (`ring_submit_batch` -> `PERCORE_RING_SUBMIT_BATCH`).
pub fn env_name(key: &str) -> String {
    format!("PERCORE_{}", key.to_ascii_uppercase())
}

/// A value read from the environment (the file's values are typed by serde).
pub trait EnvValue: Sized {
    fn parse_env(text: &str) -> Result<Self, String>;
}

macro_rules! env_value_from_str {
    ($($t:ty),*) => {$(
        impl EnvValue for $t {
            fn parse_env(text: &str) -> Result<Self, String> {
                text.parse::<$t>().map_err(|e| e.to_string())
            }
        }
    )*};
}
env_value_from_str!(u32, u64, usize, String, PathBuf, SocketAddr);

impl EnvValue for bool {
    /// 1/true/yes/on or 0/false/no/off, any case.
    fn parse_env(text: &str) -> Result<Self, String> {
        match text.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err("expected 1 or 0 (true or false)".into()),
        }
    }
}

/// Whether the admin port's writes are open without the bearer token: a
/// security decision, so it keeps its own, strict reading of the
/// environment (not the layered helper's 1/true/yes/on, trimmed, empty =
/// unset): only the exact values `1` and `true` open writes; any other value
/// that is set, the empty string included, keeps them closed and overrides
/// the file.
fn admin_open_writes(env: &dyn Fn(&str) -> Option<String>, file: Option<bool>) -> bool {
    match env("PERCORE_ADMIN_OPEN_WRITES") {
        Some(v) => v == "1" || v == "true",
        None => file.unwrap_or(false),
    }
}

/// The layers under a setting's flag: the environment (the file's value is
/// passed per setting). Resolves every setting the same way:
/// flag > environment > file > default.
struct Layers<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Layers<'_> {
    /// The environment's value for `key`, trimmed, with the name it was
    /// found under: its own name, else an old alias. Empty counts as unset.
    fn env_text(&self, key: &str) -> Option<(String, String)> {
        let name = env_name(key);
        let found = |n: &str| {
            (self.env)(n)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if let Some(v) = found(&name) {
            return Some((name, v));
        }
        let (old, _) = ENV_ALIASES.iter().find(|(_, new)| *new == name)?;
        let v = found(old)?;
        warn_alias_once(old, &name);
        Some((old.to_string(), v))
    }

    /// flag > environment > file; None when no layer sets `key`.
    fn get<T: EnvValue>(
        &self,
        key: &str,
        flag: Option<T>,
        file: Option<T>,
    ) -> Result<Option<T>, String> {
        if flag.is_some() {
            return Ok(flag);
        }
        match self.env_text(key) {
            Some((name, v)) => T::parse_env(&v)
                .map(Some)
                .map_err(|e| format!("{key} ({name}): '{v}' is not valid: {e}")),
            None => Ok(file),
        }
    }

    /// flag > environment > file > default.
    fn setting<T: EnvValue>(
        &self,
        key: &str,
        flag: Option<T>,
        file: Option<T>,
        default: T,
    ) -> Result<T, String> {
        Ok(self.get(key, flag, file)?.unwrap_or(default))
    }

    /// `setting`, refused outside `range` with the setting's name.
    fn bounded<T>(
        &self,
        key: &str,
        (flag, file): (Option<T>, Option<T>),
        default: T,
        range: std::ops::RangeInclusive<T>,
    ) -> Result<T, String>
    where
        T: EnvValue + PartialOrd + std::fmt::Display,
    {
        let v = self.setting(key, flag, file, default)?;
        if !range.contains(&v) {
            return Err(format!(
                "{key} must be between {} and {} (got {v})",
                range.start(),
                range.end()
            ));
        }
        Ok(v)
    }
}

/// Warns once per process about each old environment name in use.
fn warn_alias_once(old: &str, new: &str) {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !warned.iter().any(|w| w == old) {
        warned.push(old.to_string());
        tracing::warn!("{old} is deprecated: set {new} instead (same meaning)");
    }
}

impl FileConfig {
    /// The file at `path`, or all keys unset without one.
    pub fn load(path: Option<&std::path::Path>) -> Result<FileConfig, String> {
        let Some(path) = path else {
            return Ok(FileConfig::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        toml::from_str::<FileConfig>(&text)
            .map_err(|e| format!("config file {}: {e}", path.display()))
    }
}

/// (access key, secret key, built-in defaults?): from the environment only.
fn credentials(env: &dyn Fn(&str) -> Option<String>) -> Result<(String, String, bool), String> {
    match (env("PERCORE_ACCESS_KEY"), env("PERCORE_SECRET_KEY")) {
        // The built-in secret is public: set explicitly, it is still the
        // default (accepted from loopback only).
        (Some(a), Some(s)) if !a.is_empty() && !s.is_empty() => {
            let default = s == SECRET_KEY_DEFAULT;
            Ok((a, s, default))
        }
        (None, None) => Ok((
            ACCESS_KEY_DEFAULT.to_string(),
            SECRET_KEY_DEFAULT.to_string(),
            true,
        )),
        _ => {
            Err("set both PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY (non-empty), or neither".into())
        }
    }
}

/// A CPU list setting (`cpus`, `ring_sqpoll_cpus`), parsed and checked to
/// fit the kernel's 32-bit CPU numbers.
fn cpu_list(key: &str, text: Option<String>) -> Result<Option<Vec<usize>>, String> {
    let Some(text) = text else {
        return Ok(None);
    };
    let cpus = crate::boot::topology::parse_cpu_list(&text).map_err(|e| format!("{key}: {e}"))?;
    if let Some(cpu) = cpus.iter().find(|&&c| u32::try_from(c).is_err()) {
        return Err(format!(
            "{key}: CPU {cpu} is past the largest CPU number ({})",
            u32::MAX
        ));
    }
    Ok(Some(cpus))
}

/// The S3 virtual-host domain: lower case, no outer dots, a DNS name.
fn s3_domain(text: Option<String>) -> Result<Option<String>, String> {
    let domain = text
        .map(|d| d.trim().trim_matches('.').to_ascii_lowercase())
        .filter(|d| !d.is_empty());
    if let Some(d) = &domain {
        if !d
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        {
            return Err(format!(
                "s3_domain '{d}' is not a DNS name (letters, digits, '.', '-')"
            ));
        }
    }
    Ok(domain)
}

/// The shard count, when set: 1..=SHARD_COUNT_MAX.
fn shard_count(shards: Option<usize>) -> Result<Option<usize>, String> {
    let max = percore_protocol::routing::SHARD_COUNT_MAX;
    if shards.is_some_and(|n| n == 0 || n > max) {
        return Err(format!("shards must be between 1 and {max}"));
    }
    Ok(shards)
}

/// The object cache's size for the node, MiB.
fn object_cache_mb(l: &Layers, args: &ServeArgs, file: Option<u64>) -> Result<u64, String> {
    let default = object_cache_mb_default();
    l.setting("object_cache_mb", args.object_cache_mb, file, default)
}

/// A quarter of the memory this process may use, in MiB: the machine's RAM
/// or the cgroup's limit (a container), whichever is less (1 GiB if
/// neither can be read).
fn object_cache_mb_default() -> u64 {
    let cgroup_bytes = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .filter_map(|v| v.trim().parse::<u64>().ok())
    .min()
    .unwrap_or(u64::MAX);
    ram_mb_default().min(cgroup_bytes / 4 / (1 << 20))
}

/// A quarter of the machine's RAM, in MiB (1 GiB if it cannot be read).
fn ram_mb_default() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(4 << 20);
    total_kib / 1024 / 4
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("built-in address")
}

impl ServerConfig {
    /// Resolves flags, environment and file into one validated config:
    /// each setting through `Layers` (flag > env > file > default).
    pub fn resolve(
        args: &ServeArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ServerConfig, String> {
        let f = FileConfig::load(args.config.as_deref())?;
        let l = Layers { env };
        let shards = shard_count(l.get("shards", args.shards, f.shards)?)?;
        let segment_bytes_max =
            l.setting("segment_bytes_max", None, f.segment_bytes_max, 256 << 20)?;
        if !(4 << 20..=16 << 30).contains(&segment_bytes_max) {
            return Err("segment_bytes_max must be between 4 MiB and 16 GiB".into());
        }
        let scrub_mb_per_sec = l.setting("scrub_mb_per_sec", None, f.scrub_mb_per_sec, 64)?;
        if scrub_mb_per_sec == 0 {
            return Err(
                "scrub_mb_per_sec must be at least 1 (scrub_interval_s = 0 turns scrubbing off)"
                    .into(),
            );
        }
        let (access_key, secret_key, default_credentials) = credentials(env)?;
        let (lifecycle_interval_s, lifecycle_actions_per_sec, lifecycle_day_s) = lifecycle(&l, &f)?;
        let cluster = cluster_settings(&l, args, &f)?;
        let (cross_shard_timeout_s, session_idle_timeout_s, native_put_data_timeout_s) =
            shard_timeouts(&l, &f)?;
        Ok(ServerConfig {
            data: l.setting("data", args.data.clone(), f.data, DATA_DIR_DEFAULT.into())?,
            s3: l.setting("s3", args.s3, f.s3, addr(S3_ADDR_DEFAULT))?,
            native: l.setting("native", args.native, f.native, addr(NATIVE_ADDR_DEFAULT))?,
            admin: l.setting("admin", args.admin, f.admin, addr(ADMIN_ADDR_DEFAULT))?,
            shards,
            cpus: cpu_list("cpus", l.get("cpus", args.cpus.clone(), f.cpus)?)?,
            unpinned: l.setting("unpinned", args.unpinned.then_some(true), f.unpinned, false)?,
            region: l.setting("region", None, f.region, "us-east-1".into())?,
            s3_domain: s3_domain(l.get("s3_domain", args.s3_domain.clone(), f.s3_domain)?)?,
            access_log: l.setting(
                "access_log",
                args.access_log.then_some(true),
                f.access_log,
                false,
            )?,
            data_ring: l.setting(
                "data_ring",
                args.no_data_ring.then_some(false),
                f.data_ring,
                true,
            )?,
            ring_sqpoll_idle_ms: l.get("ring_sqpoll_idle_ms", None, f.ring_sqpoll_idle_ms)?,
            ring_sqpoll_cpus: cpu_list(
                "ring_sqpoll_cpus",
                l.get("ring_sqpoll_cpus", None, f.ring_sqpoll_cpus)?,
            )?,
            ring_submit_batch: l.bounded(
                "ring_submit_batch",
                (None, f.ring_submit_batch),
                64,
                1..=4096,
            )?,
            ring_send_zc_min_bytes: l.setting(
                "ring_send_zc_min_bytes",
                None,
                f.ring_send_zc_min_bytes,
                16 * 1024,
            )?,
            segment_bytes_max,
            object_cache_mb: object_cache_mb(&l, args, f.object_cache_mb)?,
            scrub_interval_s: l.setting("scrub_interval_s", None, f.scrub_interval_s, 24 * 3600)?,
            scrub_mb_per_sec,
            lifecycle_interval_s,
            lifecycle_actions_per_sec,
            lifecycle_day_s,
            connections_per_shard_max: l.bounded(
                "connections_per_shard_max",
                (None, f.connections_per_shard_max),
                4096,
                1..=1 << 20,
            )?,
            header_timeout_s: l.bounded(
                "header_timeout_s",
                (None, f.header_timeout_s),
                10,
                1..=3600,
            )?,
            idle_timeout_s: l.bounded("idle_timeout_s", (None, f.idle_timeout_s), 60, 1..=86400)?,
            body_timeout_s: l.bounded("body_timeout_s", (None, f.body_timeout_s), 30, 1..=3600)?,
            cross_shard_timeout_s,
            session_idle_timeout_s,
            native_put_data_timeout_s,
            access_key,
            secret_key,
            default_credentials,
            admin_open_writes: admin_open_writes(env, f.admin_open_writes),
            cluster,
        })
    }
}

/// Cross-shard call, idle session and native PutData timeouts.
fn shard_timeouts(l: &Layers, f: &FileConfig) -> Result<(u64, u64, u64), String> {
    Ok((
        l.bounded(
            "cross_shard_timeout_s",
            (None, f.cross_shard_timeout_s),
            60,
            1..=3600,
        )?,
        l.bounded(
            "session_idle_timeout_s",
            (None, f.session_idle_timeout_s),
            300,
            1..=86400,
        )?,
        l.bounded(
            "native_put_data_timeout_s",
            (None, f.native_put_data_timeout_s),
            30,
            1..=3600,
        )?,
    ))
}

/// `--cluster` and the settings that go with it.
fn cluster_settings(
    l: &Layers,
    args: &ServeArgs,
    f: &FileConfig,
) -> Result<Option<crate::cluster::control::ClusterSettings>, String> {
    let node = l.get("node", args.node.clone(), f.node.clone())?;
    let zone = l.get("zone", args.zone.clone(), f.zone.clone())?;
    let cluster = l.setting(
        "cluster_name",
        args.cluster_name.clone(),
        f.cluster_name.clone(),
        "percore".into(),
    )?;
    let Some(urls) = l.get("cluster", args.cluster.clone(), f.cluster.clone())? else {
        if node.is_some() || zone.is_some() {
            return Err("node and zone (--node, --zone, PERCORE_NODE, PERCORE_ZONE or the config file) need cluster: --cluster URLS, PERCORE_CLUSTER or `cluster` in the config file (the etcd endpoints)".into());
        }
        return Ok(None);
    };
    let node = node.ok_or(
        "cluster needs this node's name: --node NAME, PERCORE_NODE or `node` in the config file",
    )?;
    crate::cluster::map::check_name("node name", &node)?;
    let zone = zone.unwrap_or_else(|| node.clone());
    crate::cluster::map::check_name("zone", &zone)?;
    crate::cluster::map::check_name("cluster name", &cluster)?;
    Ok(Some(crate::cluster::control::ClusterSettings {
        urls,
        cluster,
        node,
        zone,
        lease_ttl_s: l.bounded(
            "cluster_lease_ttl_s",
            (None, f.cluster_lease_ttl_s),
            10,
            3..=3600,
        )?,
        backfill_mib_s: l.bounded(
            "cluster_backfill_mib_s",
            (None, f.cluster_backfill_mib_s),
            256,
            0..=1_000_000,
        )?,
    }))
}

/// The lifecycle runner's settings: interval (0: off), actions per second
/// per shard, and the length of a day in seconds (shorter only in tests).
fn lifecycle(l: &Layers, f: &FileConfig) -> Result<(u64, u64, u64), String> {
    Ok((
        l.setting("lifecycle_interval_s", None, f.lifecycle_interval_s, 3600)?,
        l.bounded(
            "lifecycle_actions_per_sec",
            (None, f.lifecycle_actions_per_sec),
            1000,
            1..=1_000_000,
        )?,
        l.bounded(
            "lifecycle_day_s",
            (None, f.lifecycle_day_s),
            86_400,
            1..=86_400,
        )?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults() {
        let c = ServerConfig::resolve(&ServeArgs::default(), &no_env).unwrap();
        assert_eq!(c.s3.to_string(), S3_ADDR_DEFAULT);
        assert_eq!(c.admin.to_string(), ADMIN_ADDR_DEFAULT);
        assert!(c.default_credentials);
        assert_eq!(c.data, PathBuf::from(DATA_DIR_DEFAULT));
    }

    /// The built-in secret is public: set explicitly, it still counts as
    /// the default (loopback only).
    #[test]
    fn explicit_default_secret_is_still_the_default() {
        let env = |a: &'static str, s: &'static str| {
            move |k: &str| match k {
                "PERCORE_ACCESS_KEY" => Some(a.to_string()),
                "PERCORE_SECRET_KEY" => Some(s.to_string()),
                _ => None,
            }
        };
        assert!(credentials(&env("ops", SECRET_KEY_DEFAULT)).unwrap().2);
        assert!(
            credentials(&env(ACCESS_KEY_DEFAULT, SECRET_KEY_DEFAULT))
                .unwrap()
                .2
        );
        assert!(
            !credentials(&env(ACCESS_KEY_DEFAULT, "another-secret"))
                .unwrap()
                .2
        );
        assert!(credentials(&|_: &str| None).unwrap().2);
    }

    #[test]
    fn precedence_flag_over_env_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "s3 = \"127.0.0.1:1\"\nshards = 3\nregion = \"eu-west-1\"\n",
        )
        .unwrap();
        let mut args = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        let env = |k: &str| (k == "PERCORE_S3").then(|| "127.0.0.1:2".to_string());
        let c = ServerConfig::resolve(&args, &env).unwrap();
        assert_eq!(
            (c.s3.port(), c.shards, c.region.as_str()),
            (2, Some(3), "eu-west-1")
        );
        args.s3 = Some("127.0.0.1:3".parse().unwrap());
        assert_eq!(ServerConfig::resolve(&args, &env).unwrap().s3.port(), 3);
        assert_eq!(ServerConfig::resolve(&args, &no_env).unwrap().s3.port(), 3);
    }

    #[test]
    fn sample_config_in_docs_is_valid() {
        let text = include_str!("../../../docs/percore.toml");
        let file: FileConfig = toml::from_str(text).expect("docs/percore.toml parses");
        assert_eq!(file.region.as_deref(), Some("us-east-1"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        let args = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        let c = ServerConfig::resolve(&args, &no_env).unwrap();
        assert_eq!(c.s3.port(), 9000);
        assert!(!c.access_log);
    }

    #[test]
    fn ring_tuning_from_env_and_validation() {
        let env = |k: &str| match k {
            "PERCORE_RING_SQPOLL_MS" => Some("500".to_string()),
            "PERCORE_RING_SQPOLL_CPUS" => Some("4-5,9".to_string()),
            "PERCORE_RING_BATCH" => Some("16".to_string()),
            _ => None,
        };
        let c = ServerConfig::resolve(&ServeArgs::default(), &env).unwrap();
        assert_eq!(c.ring_sqpoll_idle_ms, Some(500));
        assert_eq!(c.ring_sqpoll_cpus, Some(vec![4, 5, 9]));
        assert_eq!(c.ring_submit_batch, 16);
        let bad = |k: &str| (k == "PERCORE_RING_BATCH").then(|| "0".to_string());
        assert!(ServerConfig::resolve(&ServeArgs::default(), &bad).is_err());
        let bad = |k: &str| (k == "PERCORE_RING_SQPOLL_CPUS").then(|| "x".to_string());
        assert!(ServerConfig::resolve(&ServeArgs::default(), &bad).is_err());
    }

    #[test]
    fn env_sets_domain_and_access_log() {
        let env = |k: &str| match k {
            "PERCORE_S3_DOMAIN" => Some("S3.Example.COM.".to_string()),
            "PERCORE_ACCESS_LOG" => Some("1".to_string()),
            _ => None,
        };
        let c = ServerConfig::resolve(&ServeArgs::default(), &env).unwrap();
        assert_eq!(c.s3_domain.as_deref(), Some("s3.example.com"));
        assert!(c.access_log);
        let bad = |k: &str| (k == "PERCORE_S3_DOMAIN").then(|| "a b".to_string());
        assert!(ServerConfig::resolve(&ServeArgs::default(), &bad).is_err());
    }

    #[test]
    fn admin_writes_need_auth_unless_opened() {
        let c = ServerConfig::resolve(&ServeArgs::default(), &no_env).unwrap();
        assert!(!c.admin_open_writes);
        let env = |k: &str| (k == "PERCORE_ADMIN_OPEN_WRITES").then(|| "1".to_string());
        let c = ServerConfig::resolve(&ServeArgs::default(), &env).unwrap();
        assert!(c.admin_open_writes);
    }

    #[test]
    fn admin_writes_open_only_for_exactly_1_or_true() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "admin_open_writes = true\n").unwrap();
        let with_file = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        for (value, open) in [
            ("1", true),
            ("true", true),
            ("yes", false),
            ("on", false),
            ("TRUE", false),
            (" 1", false),
            ("", false),
            ("0", false),
        ] {
            let env = |k: &str| (k == "PERCORE_ADMIN_OPEN_WRITES").then(|| value.to_string());
            for args in [&ServeArgs::default(), &with_file] {
                let c = ServerConfig::resolve(args, &env).unwrap();
                assert_eq!(c.admin_open_writes, open, "{value:?}");
            }
        }
        // Unset: the file decides.
        assert!(
            ServerConfig::resolve(&with_file, &no_env)
                .unwrap()
                .admin_open_writes
        );
    }

    #[test]
    fn validation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "shard = 3\n").unwrap();
        let args = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        assert!(ServerConfig::resolve(&args, &no_env)
            .unwrap_err()
            .contains("unknown field"));
        let only_access = |k: &str| (k == "PERCORE_ACCESS_KEY").then(|| "a".to_string());
        assert!(ServerConfig::resolve(&ServeArgs::default(), &only_access).is_err());
        let args = ServeArgs {
            shards: Some(0),
            ..Default::default()
        };
        assert!(ServerConfig::resolve(&args, &no_env).is_err());
    }

    #[test]
    fn connection_bounds_and_timeouts() {
        let c = ServerConfig::resolve(&ServeArgs::default(), &no_env).unwrap();
        assert_eq!(
            (
                c.connections_per_shard_max,
                c.header_timeout_s,
                c.idle_timeout_s
            ),
            (4096, 10, 60)
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "connections_per_shard_max = 8
idle_timeout_s = 5
",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        let env = |k: &str| (k == "PERCORE_IDLE_TIMEOUT_S").then(|| "7".to_string());
        let c = ServerConfig::resolve(&args, &env).unwrap();
        assert_eq!((c.connections_per_shard_max, c.idle_timeout_s), (8, 7));
        for (k, v) in [
            ("PERCORE_CONNECTIONS_MAX", "0"),
            ("PERCORE_HEADER_TIMEOUT_S", "0"),
            ("PERCORE_IDLE_TIMEOUT_S", "x"),
            ("PERCORE_BODY_TIMEOUT_S", "0"),
        ] {
            let env = move |name: &str| (name == k).then(|| v.to_string());
            assert!(
                ServerConfig::resolve(&ServeArgs::default(), &env).is_err(),
                "{k}={v}"
            );
        }
    }

    #[test]
    fn cross_shard_timeouts() {
        let c = ServerConfig::resolve(&ServeArgs::default(), &no_env).unwrap();
        assert_eq!(
            (c.cross_shard_timeout_s, c.session_idle_timeout_s),
            (60, 300)
        );
        assert_eq!(c.native_put_data_timeout_s, 30);
        let env = |k: &str| match k {
            "PERCORE_CROSS_SHARD_TIMEOUT_S" => Some("5".to_string()),
            "PERCORE_SESSION_IDLE_TIMEOUT_S" => Some("20".to_string()),
            _ => None,
        };
        let c = ServerConfig::resolve(&ServeArgs::default(), &env).unwrap();
        assert_eq!((c.cross_shard_timeout_s, c.session_idle_timeout_s), (5, 20));
        for k in [
            "PERCORE_CROSS_SHARD_TIMEOUT_S",
            "PERCORE_SESSION_IDLE_TIMEOUT_S",
            "PERCORE_NATIVE_PUT_DATA_TIMEOUT_S",
        ] {
            let env = move |name: &str| (name == k).then(|| "0".to_string());
            assert!(
                ServerConfig::resolve(&ServeArgs::default(), &env).is_err(),
                "{k}=0"
            );
        }
    }

    #[test]
    fn env_beats_file_and_flag_beats_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "ring_submit_batch = 8\naccess_log = true\nregion = \"eu-west-1\"\nnative = \"127.0.0.1:7\"\n",
        )
        .unwrap();
        let mut args = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        let c = ServerConfig::resolve(&args, &no_env).unwrap();
        assert_eq!((c.ring_submit_batch, c.access_log), (8, true));
        let env = |k: &str| match k {
            "PERCORE_RING_SUBMIT_BATCH" => Some("16".to_string()),
            "PERCORE_ACCESS_LOG" => Some("0".to_string()),
            "PERCORE_REGION" => Some("ap-south-1".to_string()),
            "PERCORE_NATIVE" => Some("127.0.0.1:8".to_string()),
            _ => None,
        };
        let c = ServerConfig::resolve(&args, &env).unwrap();
        assert_eq!((c.ring_submit_batch, c.access_log), (16, false));
        assert_eq!((c.region.as_str(), c.native.port()), ("ap-south-1", 8));
        args.access_log = true;
        args.native = Some("127.0.0.1:9".parse().unwrap());
        let c = ServerConfig::resolve(&args, &env).unwrap();
        assert_eq!((c.access_log, c.native.port()), (true, 9));
    }

    #[test]
    fn old_env_names_still_work() {
        for (old, new) in ENV_ALIASES {
            let env = move |k: &str| (k == *old).then(|| "7".to_string());
            let c = ServerConfig::resolve(&ServeArgs::default(), &env).unwrap();
            let got = match *new {
                "PERCORE_RING_SQPOLL_IDLE_MS" => c.ring_sqpoll_idle_ms.map(u64::from),
                "PERCORE_RING_SUBMIT_BATCH" => Some(c.ring_submit_batch as u64),
                "PERCORE_RING_SEND_ZC_MIN_BYTES" => Some(c.ring_send_zc_min_bytes as u64),
                "PERCORE_CONNECTIONS_PER_SHARD_MAX" => Some(c.connections_per_shard_max as u64),
                other => panic!("alias {old} -> {other} not covered"),
            };
            assert_eq!(got, Some(7), "{old}");
        }
        // The new name wins over the old one.
        let env = |k: &str| match k {
            "PERCORE_RING_BATCH" => Some("7".to_string()),
            "PERCORE_RING_SUBMIT_BATCH" => Some("9".to_string()),
            _ => None,
        };
        let c = ServerConfig::resolve(&ServeArgs::default(), &env).unwrap();
        assert_eq!(c.ring_submit_batch, 9);
    }

    #[test]
    fn out_of_range_values_name_the_setting() {
        for (k, v, setting) in [
            (
                "PERCORE_RING_SQPOLL_IDLE_MS",
                "5000000000",
                "ring_sqpoll_idle_ms",
            ),
            ("PERCORE_RING_SQPOLL_MS", "-1", "ring_sqpoll_idle_ms"),
            ("PERCORE_RING_SUBMIT_BATCH", "4097", "ring_submit_batch"),
            ("PERCORE_CONNECTIONS_MAX", "0", "connections_per_shard_max"),
            ("PERCORE_RING_SQPOLL_CPUS", "4294967296", "ring_sqpoll_cpus"),
            ("PERCORE_IDLE_TIMEOUT_S", "86401", "idle_timeout_s"),
            ("PERCORE_ACCESS_LOG", "maybe", "access_log"),
        ] {
            let env = move |name: &str| (name == k).then(|| v.to_string());
            let err = ServerConfig::resolve(&ServeArgs::default(), &env).unwrap_err();
            assert!(err.contains(setting), "{k}={v}: {err}");
        }
    }

    /// Every renamed variable's new name is `PERCORE_` + a real file key.
    #[test]
    fn env_names_match_file_keys() {
        assert_eq!(env_name("ring_submit_batch"), "PERCORE_RING_SUBMIT_BATCH");
        for (old, new) in ENV_ALIASES {
            let key = new.strip_prefix("PERCORE_").unwrap().to_ascii_lowercase();
            assert_eq!(env_name(&key), *new);
            let parsed = toml::from_str::<FileConfig>(&format!("{key} = 1"));
            if let Err(e) = parsed {
                assert!(
                    !e.to_string().contains("unknown field"),
                    "{old} -> {new}: {e}"
                );
            }
        }
    }
}
