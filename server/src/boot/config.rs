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
    /// TOML configuration file (flags override it).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    pub scrub_interval_s: Option<u64>,
    pub scrub_mb_per_sec: Option<u64>,
    pub connections_per_shard_max: Option<usize>,
    pub header_timeout_s: Option<u64>,
    pub idle_timeout_s: Option<u64>,
    pub body_timeout_s: Option<u64>,
    pub admin_open_writes: Option<bool>,
    pub cross_shard_timeout_s: Option<u64>,
    pub session_idle_timeout_s: Option<u64>,
    pub native_put_data_timeout_s: Option<u64>,
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
    /// Seconds between background scrub passes (0: off).
    pub scrub_interval_s: u64,
    /// Scrub read rate, MB/s.
    pub scrub_mb_per_sec: u64,
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
}

impl ServerConfig {
    /// Resolves flags, environment and file into one validated config.
    pub fn resolve(
        args: &ServeArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ServerConfig, String> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
                toml::from_str::<FileConfig>(&text)
                    .map_err(|e| format!("config file {}: {e}", path.display()))?
            }
            None => FileConfig::default(),
        };
        let parse_addr = |v: String, what: &str| {
            v.parse::<SocketAddr>()
                .map_err(|_| format!("{what}: '{v}' is not ADDR:PORT"))
        };
        let s3 = match (args.s3, env("PERCORE_S3")) {
            (Some(a), _) => a,
            (None, Some(v)) => parse_addr(v, "PERCORE_S3")?,
            (None, None) => file.s3.unwrap_or_else(|| S3_ADDR_DEFAULT.parse().unwrap()),
        };
        let cpus_text = args.cpus.clone().or(env("PERCORE_CPUS")).or(file.cpus);
        let cpus = cpus_text
            .map(|t| crate::boot::topology::parse_cpu_list(&t))
            .transpose()?;
        let shards = match (args.shards, env("PERCORE_SHARDS")) {
            (Some(n), _) => Some(n),
            (None, Some(v)) => Some(
                v.parse::<usize>()
                    .map_err(|_| format!("PERCORE_SHARDS: '{v}' is not a number"))?,
            ),
            (None, None) => file.shards,
        };
        if let Some(n) = shards {
            if n == 0 || n > percore_protocol::routing::SHARD_COUNT_MAX {
                return Err(format!(
                    "shards must be between 1 and {}",
                    percore_protocol::routing::SHARD_COUNT_MAX
                ));
            }
        }
        let (access_key, secret_key, default_credentials) =
            match (env("PERCORE_ACCESS_KEY"), env("PERCORE_SECRET_KEY")) {
                (Some(a), Some(s)) if !a.is_empty() && !s.is_empty() => (a, s, false),
                (None, None) => (
                    ACCESS_KEY_DEFAULT.to_string(),
                    SECRET_KEY_DEFAULT.to_string(),
                    true,
                ),
                _ => return Err(
                    "set both PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY (non-empty), or neither"
                        .into(),
                ),
            };
        let segment_bytes_max = file.segment_bytes_max.unwrap_or(256 << 20);
        if !(4 << 20..=16 << 30).contains(&segment_bytes_max) {
            return Err("segment_bytes_max must be between 4 MiB and 16 GiB".into());
        }
        let s3_domain = args
            .s3_domain
            .clone()
            .or(env("PERCORE_S3_DOMAIN"))
            .or(file.s3_domain)
            .map(|d| d.trim().trim_matches('.').to_ascii_lowercase())
            .filter(|d| !d.is_empty());
        if let Some(d) = &s3_domain {
            if !d
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
            {
                return Err(format!(
                    "s3_domain '{d}' is not a DNS name (letters, digits, '.', '-')"
                ));
            }
        }
        let env_num = |name: &str| -> Result<Option<u64>, String> {
            env(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| format!("{name}: '{v}' is not a number"))
                })
                .transpose()
        };
        let ring_sqpoll_idle_ms = env_num("PERCORE_RING_SQPOLL_MS")?
            .map(|v| v as u32)
            .or(file.ring_sqpoll_idle_ms);
        let ring_sqpoll_cpus = env("PERCORE_RING_SQPOLL_CPUS")
            .or(file.ring_sqpoll_cpus)
            .map(|t| crate::boot::topology::parse_cpu_list(&t))
            .transpose()
            .map_err(|e| format!("ring_sqpoll_cpus: {e}"))?;
        let ring_submit_batch = env_num("PERCORE_RING_BATCH")?
            .map(|v| v as usize)
            .or(file.ring_submit_batch)
            .unwrap_or(64);
        if !(1..=4096).contains(&ring_submit_batch) {
            return Err("ring_submit_batch must be between 1 and 4096".into());
        }
        let ring_send_zc_min_bytes = env_num("PERCORE_RING_ZC_MIN")?
            .map(|v| v as usize)
            .or(file.ring_send_zc_min_bytes)
            .unwrap_or(16 * 1024);
        let scrub_interval_s = env_num("PERCORE_SCRUB_INTERVAL_S")?
            .or(file.scrub_interval_s)
            .unwrap_or(24 * 3600);
        let scrub_mb_per_sec = env_num("PERCORE_SCRUB_MB_PER_SEC")?
            .or(file.scrub_mb_per_sec)
            .unwrap_or(64);
        if scrub_mb_per_sec == 0 {
            return Err(
                "scrub_mb_per_sec must be at least 1 (scrub_interval_s = 0 turns scrubbing off)"
                    .into(),
            );
        }
        let connections_per_shard_max = env_num("PERCORE_CONNECTIONS_MAX")?
            .map(|v| v as usize)
            .or(file.connections_per_shard_max)
            .unwrap_or(4096);
        if !(1..=1 << 20).contains(&connections_per_shard_max) {
            return Err("connections_per_shard_max must be between 1 and 1048576".into());
        }
        let header_timeout_s = env_num("PERCORE_HEADER_TIMEOUT_S")?
            .or(file.header_timeout_s)
            .unwrap_or(10);
        let idle_timeout_s = env_num("PERCORE_IDLE_TIMEOUT_S")?
            .or(file.idle_timeout_s)
            .unwrap_or(60);
        if !(1..=3600).contains(&header_timeout_s) || !(1..=86400).contains(&idle_timeout_s) {
            return Err(
                "header_timeout_s must be 1..=3600 and idle_timeout_s 1..=86400 seconds".into(),
            );
        }
        let body_timeout_s = env_num("PERCORE_BODY_TIMEOUT_S")?
            .or(file.body_timeout_s)
            .unwrap_or(30);
        if !(1..=3600).contains(&body_timeout_s) {
            return Err("body_timeout_s must be 1..=3600 seconds".into());
        }
        let cross_shard_timeout_s = env_num("PERCORE_CROSS_SHARD_TIMEOUT_S")?
            .or(file.cross_shard_timeout_s)
            .unwrap_or(60);
        let session_idle_timeout_s = env_num("PERCORE_SESSION_IDLE_TIMEOUT_S")?
            .or(file.session_idle_timeout_s)
            .unwrap_or(300);
        if !(1..=3600).contains(&cross_shard_timeout_s)
            || !(1..=86400).contains(&session_idle_timeout_s)
        {
            return Err("cross_shard_timeout_s must be 1..=3600 and session_idle_timeout_s 1..=86400 seconds".into());
        }
        let native_put_data_timeout_s = env_num("PERCORE_NATIVE_PUT_DATA_TIMEOUT_S")?
            .or(file.native_put_data_timeout_s)
            .unwrap_or(30);
        if !(1..=3600).contains(&native_put_data_timeout_s) {
            return Err("native_put_data_timeout_s must be 1..=3600 seconds".into());
        }
        Ok(ServerConfig {
            data: args
                .data
                .clone()
                .or(env("PERCORE_DATA").map(PathBuf::from))
                .or(file.data)
                .unwrap_or_else(|| DATA_DIR_DEFAULT.into()),
            s3,
            native: args
                .native
                .or(file.native)
                .unwrap_or_else(|| NATIVE_ADDR_DEFAULT.parse().unwrap()),
            admin: args
                .admin
                .or(file.admin)
                .unwrap_or_else(|| ADMIN_ADDR_DEFAULT.parse().unwrap()),
            shards,
            cpus,
            unpinned: args.unpinned || file.unpinned.unwrap_or(false),
            region: file.region.unwrap_or_else(|| "us-east-1".into()),
            s3_domain,
            access_log: args.access_log
                || env("PERCORE_ACCESS_LOG").is_some_and(|v| v == "1" || v == "true")
                || file.access_log.unwrap_or(false),
            data_ring: !args.no_data_ring
                && !env("PERCORE_DATA_RING").is_some_and(|v| v == "0" || v == "false")
                && file.data_ring.unwrap_or(true),
            ring_sqpoll_idle_ms,
            ring_sqpoll_cpus,
            ring_submit_batch,
            ring_send_zc_min_bytes,
            segment_bytes_max,
            scrub_interval_s,
            scrub_mb_per_sec,
            connections_per_shard_max,
            header_timeout_s,
            idle_timeout_s,
            body_timeout_s,
            cross_shard_timeout_s,
            session_idle_timeout_s,
            native_put_data_timeout_s,
            access_key,
            secret_key,
            default_credentials,
            admin_open_writes: env("PERCORE_ADMIN_OPEN_WRITES")
                .map(|v| v == "1" || v == "true")
                .or(file.admin_open_writes)
                .unwrap_or(false),
        })
    }
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
}
