//! `percore put|get|cat|ls|rm|stat|mb`: the command-line client over the
//! native protocol (percore-client on a small tokio runtime; the server
//! itself never starts one).

use std::io::Write;
use std::time::Duration;

use clap::{Args, Subcommand};
use percore_client::{Client, Config, Range};

#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// Native endpoint of any shard (host:port).
    #[arg(long, env = "PERCORE_ENDPOINT", default_value = "127.0.0.1:9100")]
    pub endpoint: String,
    #[arg(
        long,
        env = "PERCORE_ACCESS_KEY",
        default_value = "percore",
        hide_env_values = true
    )]
    pub access_key: String,
    /// The secret key (one that starts with `-`, as a generated one may,
    /// is taken as the value).
    #[arg(
        long,
        env = "PERCORE_SECRET_KEY",
        default_value = "percore-secret",
        hide_env_values = true,
        allow_hyphen_values = true
    )]
    pub secret_key: String,
    /// Per-request deadline in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// No progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

// Parsed once per process: the size of the bench variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Upload a file (or - for stdin, which needs --size) as bucket/key.
    Put {
        #[command(flatten)]
        conn: ClientArgs,
        file: String,
        target: String,
        #[arg(long)]
        content_type: Option<String>,
        /// Bytes to read from stdin (required with -).
        #[arg(long)]
        size: Option<u64>,
    },
    /// Download bucket/key to a file (default: the key's last component; - for stdout).
    Get {
        #[command(flatten)]
        conn: ClientArgs,
        source: String,
        file: Option<String>,
        /// START-END (inclusive) or START- ; repeat for several ranges,
        /// written one after another.
        #[arg(long = "range", value_parser = parse_range)]
        ranges: Vec<Range>,
    },
    /// Write bucket/key (or its --range parts) to stdout.
    Cat {
        #[command(flatten)]
        conn: ClientArgs,
        source: String,
        #[arg(long = "range", value_parser = parse_range)]
        ranges: Vec<Range>,
    },
    /// List buckets (no argument) or keys under bucket[/prefix].
    Ls {
        #[command(flatten)]
        conn: ClientArgs,
        path: Option<String>,
        /// All keys under the prefix, not grouped at '/'.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Delete objects.
    Rm {
        #[command(flatten)]
        conn: ClientArgs,
        #[arg(required = true)]
        targets: Vec<String>,
    },
    /// Show an object's size, ETag, CRC32C, type, time and owner shard.
    Stat {
        #[command(flatten)]
        conn: ClientArgs,
        target: String,
    },
    /// Load generator (warp-style): get, put, stat, delete, list, mixed,
    /// range and batch over S3 or the native protocol; prints a table row
    /// (and JSON with --json). See bench/README.md.
    Bench(BenchArgs),
    /// Make a bucket.
    Mb {
        #[command(flatten)]
        conn: ClientArgs,
        bucket: String,
    },
}

fn parse_range(s: &str) -> Result<Range, String> {
    let bad = || format!("'{s}' is not a range; use START-END (inclusive, bytes) or START-");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let offset: u64 = a.trim().parse().map_err(|_| bad())?;
    if b.trim().is_empty() {
        return Ok(Range { offset, length: 0 });
    }
    let end: u64 = b.trim().parse().map_err(|_| bad())?;
    if end < offset {
        return Err(format!("'{s}': END is before START"));
    }
    Ok(Range {
        offset,
        length: end - offset + 1,
    })
}

fn split_target(t: &str) -> Result<(String, String), String> {
    let t = t.trim_start_matches("percore://").trim_start_matches('/');
    match t.split_once('/') {
        Some((b, k)) if !b.is_empty() && !k.is_empty() => Ok((b.to_string(), k.to_string())),
        _ => Err(format!("'{t}' is not bucket/key")),
    }
}

fn progress_bar(total: u64, hidden: bool) -> indicatif::ProgressBar {
    // Large transfers only, and only on a terminal (indicatif hides itself
    // when stderr is not one).
    if hidden || total < 4 << 20 {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    conn: ClientArgs,
    /// s3 or native.
    #[arg(long, default_value = "native")]
    mode: String,
    /// get, put, stat, delete, list, mixed, range, batch.
    #[arg(long, default_value = "get")]
    op: String,
    /// S3 endpoint for --mode s3.
    #[arg(long, default_value = "127.0.0.1:9000")]
    s3: String,
    #[arg(long, default_value = "bench")]
    bucket: String,
    #[arg(long, default_value = "obj/")]
    prefix: String,
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Object size in bytes (accepts K, M suffixes: 64K, 1M).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    size: u64,
    /// Random sizes in [size, size-max].
    #[arg(long, value_parser = parse_size)]
    size_max: Option<u64>,
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Stop after this many operations.
    #[arg(long)]
    ops: Option<u64>,
    /// range: ranges per operation, bytes per range, object size.
    #[arg(long, default_value_t = 16)]
    ranges: usize,
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    range_size: u64,
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    large_size: u64,
    /// range: ranges come in runs of this many adjacent ones (rows of a
    /// column chunk read together; 1: every range at its own random place).
    #[arg(long, default_value_t = 1)]
    range_run: usize,
    /// batch: objects per operation.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// The objects exist already (from an earlier run with the same sizes).
    #[arg(long)]
    no_prepare: bool,
    /// get: read each prepared object once, then stop (cold-read runs).
    #[arg(long)]
    each_once: bool,
    /// Server process ids: their CPU time is reported per unit and per GB.
    #[arg(long, value_delimiter = ',')]
    server_pid: Vec<u32>,
    /// Load-generator threads (default: all CPUs this process may use).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long, default_value = "")]
    label: String,
    /// Append the report as one JSON line to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Print the table header before the row.
    #[arg(long)]
    header: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("'{s}' is not a size (bytes, or with K, M, G)"))
}

pub fn bench(a: BenchArgs) -> Result<(), String> {
    use percore_loadgen::{Mode, Op, Spec};
    let mode = match a.mode.as_str() {
        "s3" => Mode::S3,
        "native" => Mode::Native,
        m => return Err(format!("--mode {m}: use s3 or native")),
    };
    let endpoint = if mode == Mode::S3 {
        a.s3.clone()
    } else {
        a.conn.endpoint.clone()
    };
    let mut spec = Spec::new(mode, Op::parse(&a.op)?, &endpoint);
    spec.access_key = a.conn.access_key.clone();
    spec.secret_key = a.conn.secret_key.clone();
    spec.label = if a.label.is_empty() {
        format!("{}-{}", a.mode, a.op)
    } else {
        a.label.clone()
    };
    spec.bucket = a.bucket.clone();
    spec.prefix = a.prefix.clone();
    spec.objects = a.objects.max(1);
    spec.size = a.size as usize;
    spec.size_max = a.size_max.unwrap_or(0) as usize;
    spec.concurrency = a.concurrency.max(1);
    spec.duration = Duration::from_secs_f64(a.duration.max(0.1));
    spec.warmup = Duration::from_secs_f64(a.warmup.max(0.0));
    spec.ops_max = a.ops;
    spec.ranges = a.ranges.max(1);
    spec.range_bytes = a.range_size.max(1);
    spec.range_run = a.range_run.max(1);
    spec.large_bytes = a.large_size.max(spec.range_bytes);
    spec.batch = a.batch.max(1);
    spec.no_prepare = a.no_prepare;
    spec.each_once = a.each_once;
    spec.server_pids = a.server_pid.clone();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = a.threads {
        rt.worker_threads(t.max(1));
    }
    let rt = rt
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let report = rt.block_on(async {
        percore_loadgen::prepare(&spec).await?;
        percore_loadgen::run(&spec).await
    })?;
    if a.header {
        println!("{}", percore_loadgen::TABLE_HEADER);
    }
    println!("{}", report.table_row());
    if report.errors > 0 {
        eprintln!("{} errors; first: {}", report.errors, report.first_error);
    }
    if let Some(path) = &a.json {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        writeln!(f, "{}", report.json()).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

impl ClientCommand {
    fn conn(&self) -> &ClientArgs {
        match self {
            ClientCommand::Bench(b) => &b.conn,
            ClientCommand::Put { conn, .. }
            | ClientCommand::Get { conn, .. }
            | ClientCommand::Cat { conn, .. }
            | ClientCommand::Ls { conn, .. }
            | ClientCommand::Rm { conn, .. }
            | ClientCommand::Stat { conn, .. }
            | ClientCommand::Mb { conn, .. } => conn,
        }
    }
}

pub fn run(cmd: ClientCommand) -> Result<(), String> {
    let cmd = match cmd {
        ClientCommand::Bench(a) => return bench(a),
        other => other,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the client runtime: {e}"))?;
    rt.block_on(run_async(cmd))
}

async fn run_async(cmd: ClientCommand) -> Result<(), String> {
    let args = cmd.conn().clone();
    let mut cfg = Config::new(
        args.endpoint.clone(),
        args.access_key.clone(),
        args.secret_key.clone(),
    );
    cfg.timeout = Duration::from_secs(args.timeout.max(1));
    let client = Client::connect(cfg).await.map_err(|e| e.to_string())?;
    let e = |e: percore_client::Error| e.to_string();
    match cmd {
        ClientCommand::Mb { bucket, .. } => {
            client.create_bucket(&bucket).await.map_err(e)?;
            println!("made bucket {bucket}");
        }
        ClientCommand::Stat { target, .. } => {
            let (b, k) = split_target(&target)?;
            let s = client.stat(&b, &k).await.map_err(e)?;
            println!("key:          {b}/{k}");
            println!("size:         {}", s.size);
            println!("etag:         {}", s.etag);
            if s.crc32c != 0 {
                println!("crc32c:       {:08x}", s.crc32c);
            }
            println!("content-type: {}", s.content_type);
            println!("modified:     {} (unix ms)", s.mtime_ms);
            println!("owner shard:  {}", s.owner_shard);
        }
        ClientCommand::Rm { targets, .. } => {
            for t in targets {
                let (b, k) = split_target(&t)?;
                let existed = client.delete(&b, &k).await.map_err(e)?;
                println!("{} {b}/{k}", if existed { "deleted" } else { "absent " });
            }
        }
        ClientCommand::Ls { path: None, .. } => {
            for b in client.list_buckets().await.map_err(e)? {
                println!("{:>13}  {}", b.created_ms, b.name);
            }
        }
        ClientCommand::Ls {
            path: Some(path),
            recursive,
            ..
        } => list(&client, &path, recursive).await?,
        ClientCommand::Put {
            file,
            target,
            content_type,
            size,
            ..
        } => {
            upload(
                &client,
                &file,
                &target,
                content_type,
                size,
                args.no_progress,
            )
            .await?
        }
        ClientCommand::Get {
            source,
            file,
            ranges,
            ..
        } => {
            let (b, k) = split_target(&source)?;
            let path = file.unwrap_or_else(|| k.rsplit('/').next().unwrap_or(&k).to_string());
            download(&client, &b, &k, &path, &ranges, args.no_progress).await?;
        }
        ClientCommand::Bench(_) => unreachable!("handled in run"),
        ClientCommand::Cat { source, ranges, .. } => {
            let (b, k) = split_target(&source)?;
            download(&client, &b, &k, "-", &ranges, true).await?;
        }
    }
    Ok(())
}

/// `ls percore://BUCKET/PREFIX`: every page of the listing, to stdout.
async fn list(client: &Client, path: &str, recursive: bool) -> Result<(), String> {
    let e = |e: percore_client::Error| e.to_string();
    let path = path.trim_start_matches("percore://");
    let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
    let delimiter = if recursive { "" } else { "/" };
    let mut after = String::new();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    loop {
        let page = client
            .list(bucket, prefix, &after, delimiter, 1000)
            .await
            .map_err(e)?;
        for en in &page.entries {
            let line = if en.is_prefix {
                format!("{:>12}  {:>13}  {}", "PRE", "", en.key)
            } else {
                format!("{:>12}  {:>13}  {}", en.size, en.mtime_ms, en.key)
            };
            if writeln!(out, "{line}").is_err() {
                return Ok(());
            }
        }
        if !page.truncated {
            break;
        }
        // No-progress guard: a server that hands back the same
        // cursor would make this loop forever.
        if page.next_start_after <= after {
            return Err(format!(
                "the server's listing made no progress after {after:?}; report this as a bug (percore fsck may help)"
            ));
        }
        after = page.next_start_after;
    }
    let _ = out.flush();
    Ok(())
}

/// `put FILE BUCKET/KEY` (FILE `-`: stdin, with `--size`).
async fn upload(
    client: &Client,
    file: &str,
    target: &str,
    content_type: Option<String>,
    size: Option<u64>,
    no_progress: bool,
) -> Result<(), String> {
    let e = |e: percore_client::Error| e.to_string();
    let (b, k) = split_target(target)?;
    let ct = content_type.unwrap_or_default();
    let (size, mut reader): (u64, Box<dyn tokio::io::AsyncRead + Unpin + Send>) = if file == "-" {
        let size = size
            .ok_or("reading stdin needs --size BYTES (the protocol declares the size up front)")?;
        (size, Box::new(tokio::io::stdin()))
    } else {
        let f = tokio::fs::File::open(file)
            .await
            .map_err(|err| format!("cannot open {file}: {err}"))?;
        let len = f
            .metadata()
            .await
            .map_err(|err| format!("{file}: {err}"))?
            .len();
        (len, Box::new(f))
    };
    let pb = progress_bar(size, no_progress);
    let started = std::time::Instant::now();
    let s = client
        .put_stream(&b, &k, size, &ct, &mut reader, &mut |n| pb.set_position(n))
        .await
        .map_err(e)?;
    pb.finish_and_clear();
    eprintln!(
        "put {b}/{k}: {} bytes in {:.2} s, etag {} crc32c {:08x} (shard {})",
        s.size,
        started.elapsed().as_secs_f64(),
        s.etag,
        s.crc32c,
        s.owner_shard
    );
    Ok(())
}

/// Streams each requested range (or the whole object) to `path` (- for
/// stdout), chunk by verified chunk. A file is written under a temporary
/// name and renamed at the end, so a failed download leaves no partial file
/// behind under the final name.
async fn download(
    client: &Client,
    b: &str,
    k: &str,
    path: &str,
    ranges: &[Range],
    no_progress: bool,
) -> Result<(), String> {
    let wanted: Vec<Option<Range>> = if ranges.is_empty() {
        vec![None]
    } else {
        ranges.iter().copied().map(Some).collect()
    };
    // Before the output file exists: a missing key leaves no partial file.
    let total = if ranges.iter().all(|r| r.length > 0) && !ranges.is_empty() {
        ranges.iter().map(|r| r.length).sum()
    } else {
        client.stat(b, k).await.map_err(|e| e.to_string())?.size
    };
    let to_stdout = path == "-";
    let tmp = format!("{path}.percore-partial");
    let mut out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::io::stdout(),
        ))
    } else {
        Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&tmp).map_err(|e| format!("cannot create {tmp}: {e}"))?,
        ))
    };
    let pb = progress_bar(total, no_progress || to_stdout);
    let started = std::time::Instant::now();
    let mut written = 0u64;
    let result = async {
        for r in wanted {
            client
                .get_stream(b, k, r, |_, data| {
                    written += data.len() as u64;
                    pb.set_position(written);
                    out.write_all(data)
                })
                .await
                .map_err(|e| e.to_string())?;
        }
        out.flush().map_err(|e| format!("writing {path}: {e}"))
    }
    .await;
    pb.finish_and_clear();
    drop(out);
    if let Err(msg) = result {
        if !to_stdout {
            let _ = std::fs::remove_file(&tmp);
        }
        return Err(msg);
    }
    if !to_stdout {
        std::fs::rename(&tmp, path).map_err(|e| format!("cannot rename {tmp} to {path}: {e}"))?;
        eprintln!(
            "got {b}/{k} -> {path}: {written} bytes in {:.2} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_targets_parse() {
        assert_eq!(
            parse_range("0-99"),
            Ok(Range {
                offset: 0,
                length: 100
            })
        );
        assert_eq!(
            parse_range("10-"),
            Ok(Range {
                offset: 10,
                length: 0
            })
        );
        assert!(parse_range("9-3").is_err());
        assert!(parse_range("x").is_err());
        assert_eq!(
            split_target("b/a/b.txt"),
            Ok(("b".into(), "a/b.txt".into()))
        );
        assert_eq!(split_target("percore://b/k"), Ok(("b".into(), "k".into())));
        assert!(split_target("b").is_err());
        assert!(split_target("b/").is_err());
    }
}
