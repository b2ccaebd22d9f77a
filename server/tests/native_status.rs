//! Native statuses the real server answers at its edges, against the real
//! binary: ShuttingDown for a new request while draining (the Put in
//! flight still completes), the native connection limit, and NoSpace on a
//! full (loop-mounted, 48 MiB) file system. Busy and PreconditionFailed:
//! see the note at the end.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream as StdTcp;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use percore_client::{Client, Config, Error};
use percore_protocol::native::{self as proto, Status};
use tokio::io::AsyncWriteExt;

/// `percore serve` on `data` (one shard, ephemeral ports), killed on drop.
struct Proc {
    child: Child,
    native: u16,
    admin: u16,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Proc {
    fn start(data: &Path, env: &[(&str, &str)], args: &[&str]) -> Proc {
        let admin = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_percore"));
        cmd.args(["serve", "--unpinned", "--shards", "1"])
            .arg("--data")
            .arg(data)
            .args(["--s3", &format!("127.0.0.1:{}", free_port())])
            .args(["--admin", &format!("127.0.0.1:{admin}")])
            .args(["--native", "127.0.0.1:0"])
            .args(args)
            .env_remove("PERCORE_ACCESS_KEY")
            .env_remove("PERCORE_SECRET_KEY")
            .env("PERCORE_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn percore serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut native = 0;
        let mut ready = false;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("native endpoint: 127.0.0.1:") {
                native = rest.split_whitespace().next().unwrap().parse().unwrap();
            }
            if line.contains("percore: ready") {
                ready = true;
                break;
            }
        }
        assert!(ready && native > 0, "the server did not start");
        std::thread::spawn(move || for _ in lines {});
        Proc {
            child,
            native,
            admin,
        }
    }

    fn config(&self) -> Config {
        let mut c = Config::new(
            format!("127.0.0.1:{}", self.native),
            "percore",
            "percore-secret",
        );
        c.attempts = 1;
        c.timeout = Duration::from_secs(20);
        c
    }

    /// (status, body) of a GET on the admin port (which keeps the
    /// connection open: read the head, then Content-Length bytes).
    fn admin_get(&self, path: &str) -> (u16, String) {
        let mut c = StdTcp::connect(("127.0.0.1", self.admin)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut rd = BufReader::new(c);
        let (mut status, mut len) = (0, 0);
        loop {
            let mut line = String::new();
            rd.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
                status = rest[..3].parse().unwrap();
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; len];
        rd.read_exact(&mut body).unwrap();
        (status, String::from_utf8(body).unwrap())
    }

    fn metric(&self, name: &str) -> u64 {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200);
        body.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn draining_answers_shutting_down_and_finishes_the_put_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Proc::start(dir.path(), &[], &[]);
    let cfg = server.config();
    let data = pattern(1, 3 << 20);
    let pid = server.child.id() as i32;
    rt().block_on(async {
        let a = Client::connect(cfg.clone()).await.unwrap();
        a.create_bucket("data").await.unwrap();
        a.put("data", "old", Bytes::from_static(b"old"))
            .await
            .unwrap();
        // B: a streamed Put, its first 1 MiB frame sent, the rest held back.
        let b = Client::connect(cfg.clone()).await.unwrap();
        let (mut w, mut r) = tokio::io::duplex(64 << 10);
        let len = data.len() as u64;
        let put = tokio::spawn(async move {
            b.put_stream("data", "inflight", len, "", &mut r, &mut |_| {})
                .await
        });
        w.write_all(&data[..1 << 20]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;

        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, body) = server.admin_get("/health/ready");
            if status == 503 {
                assert_eq!(body, "draining: shutting down\n");
                break;
            }
            assert!(Instant::now() < deadline, "never saw draining");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A new request on an open connection: ShuttingDown, not served.
        match a.stat("data", "old").await {
            Err(e) => assert_eq!(e.status(), Some(Status::ShuttingDown), "{e}"),
            Ok(s) => panic!("a new request was served while draining: {s:?}"),
        }
        // And that connection is closed; new connections are refused.
        assert!(a.stat("data", "old").await.is_err());
        assert!(Client::connect(cfg.clone()).await.is_err());

        // The Put in flight completes.
        w.write_all(&data[1 << 20..]).await.unwrap();
        drop(w);
        let st = put
            .await
            .unwrap()
            .expect("the Put in flight completes while draining");
        assert_eq!(st.size, len);
        assert_eq!(st.crc32c, proto::crc32c(&data));
    });
    assert_eq!(server.wait_exit(Duration::from_secs(30)), Some(0));
    drop(server);
    // Restarted on the same directory: the Put acknowledged while draining is there.
    let server = Proc::start(dir.path(), &[], &[]);
    rt().block_on(async {
        let c = Client::connect(server.config()).await.unwrap();
        let o = c.get("data", "inflight", &[]).await.unwrap();
        assert_eq!(&o.ranges[0].1[..], &data[..]);
    });
}

#[test]
fn the_native_connection_limit_refuses_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let server = Proc::start(dir.path(), &[("PERCORE_CONNECTIONS_MAX", "2")], &[]);
    let cfg = server.config();
    rt().block_on(async {
        let a = Client::connect(cfg.clone()).await.unwrap();
        let b = Client::connect(cfg.clone()).await.unwrap();
        a.create_bucket("data").await.unwrap();
        let refused_before = server.metric("percore_connections_refused_total");
        match Client::connect(cfg.clone()).await {
            Err(Error::Io(..)) => {}
            Err(e) => panic!("expected the connection to be closed, got {e}"),
            Ok(_) => panic!("a third connection was served with a limit of 2"),
        }
        assert_eq!(
            server.metric("percore_connections_refused_total"),
            refused_before + 1
        );
        // The connections within the limit keep working.
        b.put("data", "k", Bytes::from_static(b"v")).await.unwrap();
        assert_eq!(a.stat("data", "k").await.unwrap().size, 1);
        // A slot freed is a slot available.
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(5);
        let c = loop {
            match Client::connect(cfg.clone()).await {
                Ok(c) => break c,
                Err(e) => {
                    assert!(Instant::now() < deadline, "no slot after a close: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        assert_eq!(c.stat("data", "k").await.unwrap().size, 1);
    });
}

/// A loop-mounted ext4 file system of `mib` MiB, unmounted on drop.
struct SmallFs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    fn new(mib: u64) -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let ok = |c: &mut Command| c.output().map(|o| o.status.success()).unwrap_or(false);
        if !ok(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img))
            || !ok(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&img)
                .arg(&mnt))
        {
            return None;
        }
        Some(SmallFs { mnt, _dir: dir })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

#[test]
fn a_full_disk_is_no_space_and_the_server_keeps_serving() {
    let Some(fs) = SmallFs::new(48) else {
        // Needs root, mkfs.ext4 and loop devices (CI has them; so does
        // tests/python/test_enospc.py).
        if std::env::var_os("PERCORE_NO_LOOP_DEVICES").is_some() {
            eprintln!(
                "SKIPPED: cannot loop-mount a small file system (PERCORE_NO_LOOP_DEVICES set)"
            );
            return;
        }
        panic!("cannot loop-mount a small ext4 file system (needs root, mkfs.ext4, loop devices); set PERCORE_NO_LOOP_DEVICES=1 to skip");
    };
    let data = fs.mnt.join("data");
    let conf = fs.mnt.join("percore.toml");
    std::fs::write(&conf, "segment_bytes_max = 4194304\n").unwrap();
    let server = Proc::start(&data, &[], &["--config", conf.to_str().unwrap()]);
    rt().block_on(async {
        let c = Client::connect(server.config()).await.unwrap();
        c.create_bucket("data").await.unwrap();
        let mut stored = Vec::new();
        let mut refused = None;
        for i in 0..100u64 {
            let body = Bytes::from(pattern(i, 1 << 20));
            match c.put("data", &format!("k{i:03}"), body.clone()).await {
                Ok(st) => {
                    assert_eq!(st.crc32c, proto::crc32c(&body));
                    stored.push((i, body));
                }
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let e = refused.expect("48 MiB filled without an error");
        assert_eq!(e.status(), Some(Status::NoSpace), "{e}");
        assert!(e.to_string().contains("out of disk space"), "{e}");
        assert!(stored.len() >= 10, "only {} MiB stored", stored.len());
        // Full, the server still serves what it acknowledged.
        for (i, body) in &stored {
            let o = c.get("data", &format!("k{i:03}"), &[]).await.unwrap();
            assert_eq!(&o.ranges[0].1, body, "k{i:03}");
        }
        let page = c.list("data", "", "", "", 1000).await.unwrap();
        assert_eq!(page.entries.len(), stored.len());
        // And refuses the next write the same way, without dying.
        let again = c
            .put("data", "again", Bytes::from(pattern(999, 1 << 20)))
            .await
            .unwrap_err();
        assert_eq!(again.status(), Some(Status::NoSpace), "{again}");
    });
    drop(server);
    drop(fs);
}

// Not tested here, and why:
// - Busy: the server answers it when a cross-shard call times out
//   (cross_shard_timeout_s, at least 1 s, with the owner shard stalled) or
//   a shard holds SESSIONS_MAX (4096) streamed sessions; neither can be
//   provoked from outside without hooks. The client's handling of Busy
//   (retries with backoff, then the error) is tested against a fake peer in
//   tools/client/tests/fake_peer.rs.
// - PreconditionFailed: no native request carries a condition (the Put
//   message has no If-Match / If-None-Match), so the server cannot answer
//   it; conditional writes are tested over S3 (test_s3_features.py).
