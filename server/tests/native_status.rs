//! Native statuses the real server answers at its edges, against the real
//! binary: ShuttingDown for a new request while draining (the Put in
//! flight still completes), the native connection limit, and NoSpace on a
//! full (loop-mounted, 48 MiB) file system, Busy past SESSIONS_MAX
//! streams held for another shard; and the client against the real server:
//! its deadline on a stopped (SIGSTOP) server, its reconnect after a
//! restart. Busy from a cross-shard timeout and PreconditionFailed: see the
//! note at the end.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream as StdTcp;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use percore_client::{Client, Config, Error};
use percore_protocol::native::{self as proto, FrameHeader, Kind, Request, ServerMessage, Status};
use percore_protocol::routing;
use tokio::io::AsyncWriteExt;

mod common;
use common::server::free_port;
use common::{pattern, rt};

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

impl Proc {
    fn start(data: &Path, env: &[(&str, &str)], args: &[&str]) -> Proc {
        Proc::start_shards(data, 1, env, args)
    }

    fn start_shards(data: &Path, shards: usize, env: &[(&str, &str)], args: &[&str]) -> Proc {
        let (child, native, admin) = common::server::spawn(data, shards, env, args);
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
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.metric("percore_requests_in_flight") < 1 {
            assert!(Instant::now() < deadline, "the Put never got in flight");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // SAFETY: kill(2) takes no pointers; `pid` is our child server.
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

/// A raw, authenticated native connection (for requests the client
/// library would not send: thousands of Puts held open).
struct Raw {
    s: StdTcp,
}

impl Raw {
    fn authed(port: u16) -> (Raw, proto::HelloOk) {
        let s = StdTcp::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut r = Raw { s };
        let Some(ServerMessage::Challenge(c)) = r.read() else {
            panic!("no Challenge")
        };
        let cn = [9u8; 32];
        let h = Request::Hello(proto::Hello {
            version: proto::VERSION,
            access_key: "percore".into(),
            client_nonce: cn.to_vec(),
            mac: proto::client_mac("percore-secret", "percore", &c.server_nonce, &cn).to_vec(),
            client_name: "raw".into(),
        });
        r.send(Kind::Hello, 1, false, &h.encode(), &[]);
        let Some(ServerMessage::HelloOk(ok)) = r.read() else {
            panic!("no HelloOk")
        };
        (r, ok)
    }

    fn send(&mut self, kind: Kind, id: u64, more: bool, header: &[u8], payload: &[u8]) {
        let mut f = proto::frame(kind, id, more, header, payload.len());
        f.extend_from_slice(payload);
        self.s.write_all(&f).unwrap();
    }

    /// The next message, or None if none starts within the socket's read
    /// timeout (or the server closed). The socket's timeout only bounds the
    /// wait for a frame's first byte: a frame that arrives in pieces on a
    /// loaded machine is read whole.
    fn read(&mut self) -> Option<ServerMessage> {
        let mut first = [0u8; 1];
        match self.s.peek(&mut first) {
            Ok(n) if n > 0 => {}
            _ => return None,
        }
        let wait = self.s.read_timeout().unwrap();
        self.s
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut h = [0u8; proto::FRAME_HEADER_BYTES];
        self.s.read_exact(&mut h).unwrap();
        let fh = FrameHeader::decode(&h).unwrap();
        let mut header = vec![0; fh.header_len as usize];
        self.s.read_exact(&mut header).unwrap();
        let mut payload = vec![0; fh.payload_len as usize];
        self.s.read_exact(&mut payload).unwrap();
        self.s.set_read_timeout(wait).unwrap();
        Some(proto::decode_server(fh.kind, &header).unwrap())
    }
}

#[test]
fn streams_for_another_shard_past_sessions_max_are_busy() {
    const SESSIONS_MAX: usize = 4096; // percore_server::shard::SESSIONS_MAX
    assert_eq!(SESSIONS_MAX, percore_server::shard::SESSIONS_MAX);
    let per_conn = proto::IN_FLIGHT_MAX as usize;
    let conns = SESSIONS_MAX / per_conn + 1;
    let dir = tempfile::tempdir().unwrap();
    let server = Proc::start_shards(dir.path(), 2, &[], &[]);
    let mut cfg = server.config();
    cfg.shard_aware = false; // everything through shard 0, forwarded
    rt().block_on(async {
        Client::connect(cfg.clone())
            .await
            .unwrap()
            .create_bucket("data")
            .await
            .unwrap()
    });
    // Shard 0's port; keys that shard 1 owns: each Put held open after
    // its first byte is a session on shard 1.
    let (first, ok) = Raw::authed(server.native);
    assert_eq!(ok.shard_id, 0);
    let mut keys = (0u64..)
        .map(|i| format!("k{i}"))
        .filter(|k| routing::owner_shard(ok.hash_seed, 2, b"data", k.as_bytes()) == 1);
    let mut raws = vec![first];
    raws.extend((1..conns).map(|_| Raw::authed(server.native).0));
    for r in raws.iter_mut() {
        for id in 0..per_conn as u64 {
            let put = Request::Put(proto::PutRequest {
                bucket: "data".into(),
                key: keys.next().unwrap(),
                size: 10,
                content_type: String::new(),
                crc32c: None,
            });
            r.send(Kind::Put, 100 + id, true, &put.encode(), b"x");
        }
    }
    // The Puts past the limit are answered at once; the others wait for
    // their PutData (30 s), so they answer nothing meanwhile.
    let expected = conns * per_conn - SESSIONS_MAX;
    let mut busy = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut extra_sweep = true;
    while busy < expected || std::mem::take(&mut extra_sweep) {
        assert!(Instant::now() < deadline, "only {busy} Busy replies");
        for r in raws.iter_mut() {
            r.s.set_read_timeout(Some(Duration::from_millis(5)))
                .unwrap();
            while let Some(msg) = r.read() {
                let ServerMessage::Reply(rep) = msg else {
                    panic!("unexpected {msg:?}")
                };
                assert_eq!(rep.status, Status::Busy.0, "{rep:?}");
                assert!(rep.message.contains("busy"), "{rep:?}");
                busy += 1;
            }
        }
    }
    assert_eq!(busy, conns * per_conn - SESSIONS_MAX);
    // The sessions go with their connections; then a forwarded Put works.
    drop(raws);
    rt().block_on(async {
        let c = Client::connect(cfg).await.unwrap();
        let key = "after-the-flood";
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match c.put("data", key, Bytes::from_static(b"v")).await {
                Ok(st) => break assert_eq!(st.size, 1),
                Err(e) if e.status() == Some(Status::Busy) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
    });
}

#[test]
fn the_client_times_out_on_a_stopped_server_and_reconnects_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let native = format!("127.0.0.1:{}", free_port());
    let mut server = Proc::start(dir.path(), &[], &["--native", &native]);
    let mut cfg = server.config();
    cfg.timeout = Duration::from_millis(400);
    cfg.attempts = 2;
    let pid = server.child.id() as i32;
    rt().block_on(async {
        let c = Client::connect(cfg).await.unwrap();
        c.create_bucket("data").await.unwrap();
        c.put("data", "k", Bytes::from_static(b"value"))
            .await
            .unwrap();
        // A stopped server accepts nothing and answers nothing: each
        // attempt ends at the deadline.
        // SAFETY: kill(2) takes no pointers; `pid` is our child server.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        let started = Instant::now();
        let e = c.stat("data", "k").await.unwrap_err();
        let took = started.elapsed();
        // SAFETY: kill(2) takes no pointers; `pid` is our child server.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(
            took >= Duration::from_millis(800) && took < Duration::from_secs(5),
            "{took:?}"
        );
        // Running again: the same client is served.
        assert_eq!(c.stat("data", "k").await.unwrap().size, 5);

        // Restarted on the same port: the old connection is gone, the
        // client opens a new one by itself.
        // SAFETY: kill(2) takes no pointers; `pid` is our child server.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        assert_eq!(server.wait_exit(Duration::from_secs(30)), Some(0));
        server = Proc::start(dir.path(), &[], &["--native", &native]);
        let o = c.get("data", "k", &[]).await.unwrap();
        assert_eq!(&o.ranges[0].1[..], b"value");
    });
}

// Not tested here, and why:
// - Busy from a cross-shard call that times out (cross_shard_timeout_s,
//   at least 1 s, with the owner shard stalled): a shard cannot be stalled
//   from outside without a hook. Busy from SESSIONS_MAX is tested above;
//   the client's handling of Busy (retries with backoff, then the error) is
//   tested against a fake peer in tools/client/tests/fake_peer.rs.
// - PreconditionFailed: no native request carries a condition (the Put
//   message has no If-Match / If-None-Match), so the server cannot answer
//   it; conditional writes are tested over S3 (test_s3_features.py).
