//! The native protocol against the real server binary (real sockets, real
//! files, real io_uring): every message at 1, 2 and 4 shards, misrouting,
//! pipelining with out-of-order replies, large streamed PUT/GET with
//! checksums, authentication, and bad frames.

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream as StdTcp;
use std::time::{Duration, Instant};

use bytes::Bytes;
use percore_client::{Client, Config, Error, Range};
use percore_protocol::native::{self as proto, FrameHeader, Kind, Request, ServerMessage, Status};

mod common;
use common::server::{start, start_with, Server};
use common::{pattern, rt};

fn config(s: &Server) -> Config {
    Config::new(
        format!("127.0.0.1:{}", s.native),
        "percore",
        "percore-secret",
    )
}

async fn every_message(shards: usize) {
    let server = start(shards);
    let c = Client::connect(config(&server)).await.unwrap();
    assert_eq!(c.shard_count(), shards);
    assert_eq!(c.hello().shard_ports.len(), shards);
    c.create_bucket("data").await.unwrap();
    assert_eq!(
        c.create_bucket("data").await.unwrap_err().status(),
        Some(Status::BucketExists)
    );
    assert_eq!(
        c.create_bucket("Bad_Name").await.unwrap_err().status(),
        Some(Status::InvalidBucketName)
    );
    assert!(c
        .list_buckets()
        .await
        .unwrap()
        .iter()
        .any(|b| b.name == "data"));

    // Puts: small from memory, and a large one streamed in frames.
    let mut keys = Vec::new();
    for i in 0..40u64 {
        let key = format!("dir{}/obj-{i:03}", i % 3);
        let data = pattern(i, (i as usize * 997) % 20_000);
        let st = c
            .put("data", &key, Bytes::from(data.clone()))
            .await
            .unwrap();
        assert_eq!(st.size, data.len() as u64);
        assert_eq!(st.crc32c, proto::crc32c(&data));
        assert_eq!(st.owner_shard as usize, c.owner("data", &key));
        keys.push((key, data));
    }
    let big = pattern(99, 9 * 1024 * 1024 + 12345);
    let mut src: &[u8] = &big;
    let mut seen = 0;
    let st = c
        .put_stream(
            "data",
            "big/blob",
            big.len() as u64,
            "application/x-test",
            &mut src,
            &mut |n| seen = n,
        )
        .await
        .unwrap();
    assert_eq!(seen, big.len() as u64);
    assert_eq!(st.crc32c, proto::crc32c(&big));

    // Get: whole, ranges (clamped at the end, open-ended), empty object.
    for (key, data) in &keys {
        let o = c.get("data", key, &[]).await.unwrap();
        assert_eq!(&o.ranges[0].1[..], &data[..], "{key}");
        assert_eq!(o.size, data.len() as u64);
    }
    let o = c
        .get(
            "data",
            "big/blob",
            &[
                Range {
                    offset: 0,
                    length: 10,
                },
                Range {
                    offset: 5 << 20,
                    length: 3 << 20,
                },
                Range {
                    offset: big.len() as u64 - 7,
                    length: 100,
                },
                Range {
                    offset: 4095,
                    length: 0,
                },
            ],
        )
        .await
        .unwrap();
    assert_eq!(o.content_type, "application/x-test");
    assert_eq!(&o.ranges[0].1[..], &big[..10]);
    assert_eq!(&o.ranges[1].1[..], &big[5 << 20..8 << 20]);
    assert_eq!(&o.ranges[2].1[..], &big[big.len() - 7..]);
    assert_eq!(o.ranges[2].0.length, 7);
    assert_eq!(&o.ranges[3].1[..], &big[4095..]);
    let e = c
        .get(
            "data",
            "big/blob",
            &[Range {
                offset: big.len() as u64,
                length: 1,
            }],
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::InvalidRange));
    let e = c.get("data", "nope", &[]).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::NoSuchKey));
    let e = c.get("nobucket", "k", &[]).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::NoSuchBucket));

    // Streamed get of the large object, chunk by chunk.
    let mut got = Vec::new();
    c.get_stream("data", "big/blob", None, |off, d| {
        assert_eq!(off, got.len() as u64);
        got.extend_from_slice(d);
        Ok(())
    })
    .await
    .unwrap();
    assert!(got == big, "streamed GET differs");

    // BatchGet: many keys across shards, one missing, ranges per item.
    let mut items: Vec<(String, Vec<Range>)> = keys
        .iter()
        .map(|(k, _)| {
            (
                k.clone(),
                vec![Range {
                    offset: 0,
                    length: 16,
                }],
            )
        })
        .collect();
    items.insert(7, ("missing".into(), vec![]));
    let res = c.get_batch("data", &items).await.unwrap();
    assert_eq!(res.len(), items.len());
    for (i, r) in res.iter().enumerate() {
        if i == 7 {
            assert_eq!(r.as_ref().unwrap_err().status(), Some(Status::NoSuchKey));
            continue;
        }
        let data = &keys[if i < 7 { i } else { i - 1 }].1;
        let r = r.as_ref().unwrap();
        assert_eq!(&r.ranges[0].1[..], &data[..data.len().min(16)]);
    }

    // Stat, List (delimiter, pages), Delete.
    let s = c.stat("data", "big/blob").await.unwrap();
    assert_eq!((s.size, s.crc32c), (big.len() as u64, proto::crc32c(&big)));
    let page = c.list("data", "", "", "/", 1000).await.unwrap();
    let names: Vec<_> = page
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.is_prefix))
        .collect();
    assert_eq!(
        names,
        vec![
            ("big/", true),
            ("dir0/", true),
            ("dir1/", true),
            ("dir2/", true)
        ]
    );
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let p = c.list("data", "dir", &after, "", 7).await.unwrap();
        all.extend(p.entries.iter().map(|e| e.key.clone()));
        if !p.truncated {
            break;
        }
        after = p.next_start_after;
    }
    let mut want: Vec<_> = keys.iter().map(|(k, _)| k.clone()).collect();
    want.sort();
    assert_eq!(all, want);
    assert!(c.delete("data", &keys[0].0).await.unwrap());
    assert!(!c.delete("data", &keys[0].0).await.unwrap());
    assert_eq!(
        c.stat("data", &keys[0].0).await.unwrap_err().status(),
        Some(Status::NoSuchKey)
    );
    assert_eq!(c.misrouted.load(std::sync::atomic::Ordering::Relaxed), 0);

    // Misrouting: everything over one connection; the server forwards and
    // names the owner.
    let mut cfg = config(&server);
    cfg.shard_aware = false;
    let one = Client::connect(cfg).await.unwrap();
    let mut foreign = 0;
    for (key, data) in &keys[1..] {
        let o = one.get("data", key, &[]).await.unwrap();
        assert_eq!(&o.ranges[0].1[..], &data[..]);
        assert_eq!(o.owner_shard as usize, one.owner("data", key));
        foreign += usize::from(o.owner_shard != one.hello().shard_id);
        let st = one
            .put("data", key, Bytes::from(data.clone()))
            .await
            .unwrap();
        assert_eq!(st.owner_shard as usize, one.owner("data", key));
    }
    if shards > 1 {
        assert!(foreign > 0, "no key was owned by another shard");
    }
}

#[test]
fn every_message_1_shard() {
    rt().block_on(every_message(1));
}

#[test]
fn every_message_2_shards() {
    rt().block_on(every_message(2));
}

#[test]
fn every_message_4_shards() {
    rt().block_on(every_message(4));
}

// ----------------------------------------------------------------------
// Raw frames
// ----------------------------------------------------------------------

struct Raw {
    s: StdTcp,
}

impl Raw {
    fn connect(port: u16) -> (Raw, Vec<u8>) {
        let s = StdTcp::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut r = Raw { s };
        let (fh, msg, _) = r.read().expect("challenge");
        assert_eq!(fh.kind, Kind::Challenge);
        let ServerMessage::Challenge(c) = msg else {
            panic!()
        };
        (r, c.server_nonce)
    }

    fn authed(port: u16) -> Raw {
        Raw::authed_hello(port).0
    }

    fn authed_hello(port: u16) -> (Raw, proto::HelloOk) {
        let (mut r, nonce) = Raw::connect(port);
        r.hello(&nonce, "percore-secret");
        let (fh, msg, _) = r.read().unwrap();
        assert_eq!(fh.kind, Kind::HelloOk);
        let ServerMessage::HelloOk(ok) = msg else {
            panic!()
        };
        (r, ok)
    }

    fn hello(&mut self, nonce: &[u8], secret: &str) {
        let cn = [7u8; 32];
        let h = Request::Hello(proto::Hello {
            version: 1,
            access_key: "percore".into(),
            client_nonce: cn.to_vec(),
            mac: proto::client_mac(secret, "percore", nonce, &cn).to_vec(),
            client_name: "raw".into(),
        });
        self.send(Kind::Hello, 1, false, &h.encode(), &[]);
    }

    fn send(&mut self, kind: Kind, id: u64, more: bool, header: &[u8], payload: &[u8]) {
        let mut f = proto::frame(kind, id, more, header, payload.len());
        f.extend_from_slice(payload);
        self.s.write_all(&f).unwrap();
    }

    fn read(&mut self) -> Option<(FrameHeader, ServerMessage, Vec<u8>)> {
        let mut h = [0u8; proto::FRAME_HEADER_BYTES];
        self.s.read_exact(&mut h).ok()?;
        let fh = FrameHeader::decode(&h).unwrap();
        let mut header = vec![0; fh.header_len as usize];
        self.s.read_exact(&mut header).unwrap();
        let mut payload = vec![0; fh.payload_len as usize];
        self.s.read_exact(&mut payload).unwrap();
        Some((fh, proto::decode_server(fh.kind, &header).unwrap(), payload))
    }

    fn reply(&mut self) -> (u64, proto::Reply) {
        loop {
            let (fh, msg, _) = self.read().expect("a reply");
            if let ServerMessage::Reply(r) = msg {
                return (fh.request_id, r);
            }
        }
    }

    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn stat_ok(port: u16) {
    let mut r = Raw::authed(port);
    let h = Request::ListBuckets.encode();
    r.send(Kind::ListBuckets, 5, false, &h, &[]);
    let (id, rep) = r.reply();
    assert_eq!((id, rep.status), (5, 0));
}

#[test]
fn pipelined_replies_come_back_out_of_order() {
    let server = start(1);
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        c.create_bucket("pipe").await.unwrap();
        c.put("pipe", "big", Bytes::from(pattern(1, 64 << 20)))
            .await
            .unwrap();
        c.put("pipe", "small", Bytes::from(pattern(2, 100)))
            .await
            .unwrap();
    });
    let mut r = Raw::authed(server.native);
    let get = |key: &str| {
        Request::Get {
            bucket: "pipe".into(),
            item: proto::BatchItem {
                key: key.into(),
                ranges: vec![],
            },
        }
        .encode()
    };
    r.send(Kind::Get, 100, false, &get("big"), &[]);
    r.send(Kind::Get, 200, false, &get("small"), &[]);
    let mut finals = Vec::new();
    let mut big_bytes = 0usize;
    while finals.len() < 2 {
        let (fh, msg, payload) = r.read().unwrap();
        match msg {
            ServerMessage::Reply(rep) => {
                assert_eq!(rep.status, 0);
                finals.push(fh.request_id);
            }
            ServerMessage::Chunk(c) => {
                assert_eq!(c.crc32c, proto::crc32c(&payload));
                if fh.request_id == 100 {
                    big_bytes += payload.len();
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        finals,
        vec![200, 100],
        "the small GET sent second finished first"
    );
    assert_eq!(big_bytes, 64 << 20);
}

#[test]
fn many_requests_in_flight_on_one_connection() {
    let server = start(2);
    rt().block_on(async {
        let mut cfg = config(&server);
        cfg.shard_aware = false;
        let c = std::sync::Arc::new(Client::connect(cfg).await.unwrap());
        c.create_bucket("many").await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..300u64 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("k{i}");
                let data = pattern(i, 1000 + i as usize * 37);
                c.put("many", &key, Bytes::from(data.clone()))
                    .await
                    .unwrap();
                let o = c
                    .get(
                        "many",
                        &key,
                        &[Range {
                            offset: 10,
                            length: 500,
                        }],
                    )
                    .await
                    .unwrap();
                assert_eq!(&o.ranges[0].1[..], &data[10..510]);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

#[test]
fn authentication() {
    let server = start(1);
    // Wrong secret: refused, connection closed.
    let (mut r, nonce) = Raw::connect(server.native);
    r.hello(&nonce, "wrong-secret");
    let (_, rep) = r.reply();
    assert_eq!(rep.status, Status::Unauthenticated.0);
    assert!(r.closed());
    // A request before Hello.
    let (mut r, _) = Raw::connect(server.native);
    r.send(
        Kind::ListBuckets,
        3,
        false,
        &Request::ListBuckets.encode(),
        &[],
    );
    let (_, rep) = r.reply();
    assert_eq!(rep.status, Status::Unauthenticated.0);
    assert!(r.closed());
    // A MAC for another challenge (replay) fails.
    let (mut r, _) = Raw::connect(server.native);
    r.hello(&[0u8; 32], "percore-secret");
    assert_eq!(r.reply().1.status, Status::Unauthenticated.0);
    // The client library reports it clearly.
    rt().block_on(async {
        let mut cfg = config(&server);
        cfg.secret_key = "nope".into();
        let e = Client::connect(cfg).await.err().expect("refused");
        assert!(
            matches!(e, Error::Server { status, .. } if status == Status::Unauthenticated.0),
            "{e}"
        );
    });
    stat_ok(server.native);
}

#[test]
fn bad_frames_get_errors_and_the_server_keeps_serving() {
    let server = start(2);
    let port = server.native;
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        c.create_bucket("bkt").await.unwrap();
    });
    // Bad magic: an error reply, then closed.
    let mut r = Raw::authed(port);
    r.s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(r.reply().1.status, Status::BadFrame.0);
    assert!(r.closed());
    // Unsupported version.
    let mut r = Raw::authed(port);
    let mut f = proto::frame(Kind::ListBuckets, 9, false, &[], 0);
    f[4] = 9;
    r.s.write_all(&f).unwrap();
    assert_eq!(r.reply().1.status, Status::UnsupportedVersion.0);
    assert!(r.closed());
    // Header or payload length beyond the limits: closed without reading it.
    for (at, v) in [(16, proto::HEADER_BYTES_MAX + 1), (20, u32::MAX)] {
        let mut r = Raw::authed(port);
        let mut f = proto::frame(Kind::ListBuckets, 9, false, &[], 0);
        f[at..at + 4].copy_from_slice(&v.to_le_bytes());
        r.s.write_all(&f).unwrap();
        assert_eq!(r.reply().1.status, Status::BadFrame.0);
        assert!(r.closed());
    }
    // Unknown kind: skipped with an error; the connection goes on.
    let mut r = Raw::authed(port);
    let mut f = proto::frame(Kind::ListBuckets, 11, false, &[1, 2, 3], 4);
    f[5] = 0x42;
    f.extend_from_slice(&[9, 9, 9, 9]);
    r.s.write_all(&f).unwrap();
    assert_eq!(
        r.reply(),
        (
            11,
            proto::Reply::error(
                Status::BadFrame,
                "unknown message kind 0x42; this server speaks protocol version 1"
            )
        )
    );
    // A server frame kind from the client.
    r.send(Kind::Reply, 12, false, &[], &[]);
    assert_eq!(r.reply().1.status, Status::BadFrame.0);
    // Flatbuffers that fail verification.
    r.send(Kind::Stat, 13, false, &[0xff; 40], &[]);
    let (id, rep) = r.reply();
    assert_eq!((id, rep.status), (13, Status::InvalidRequest.0));
    // Keys that are not allowed.
    let h = Request::Stat {
        bucket: "bkt".into(),
        key: "x".repeat(2000),
    }
    .encode();
    r.send(Kind::Stat, 14, false, &h, &[]);
    assert_eq!(r.reply().1.status, Status::InvalidRequest.0);
    // PutData without a Put.
    r.send(Kind::PutData, 15, false, &[], b"abc");
    assert_eq!(
        r.reply(),
        (
            15,
            proto::Reply::error(
                Status::InvalidRequest,
                "PutData without an open Put of this request id"
            )
        )
    );
    // Wrong CRC, short body, missing CRC, too large: nothing stored.
    let put = |key: &str, size: u64, crc: Option<u32>| {
        Request::Put(proto::PutRequest {
            bucket: "bkt".into(),
            key: key.into(),
            size,
            content_type: String::new(),
            crc32c: crc,
        })
        .encode()
    };
    r.send(
        Kind::Put,
        16,
        false,
        &put("crc", 3, Some(proto::crc32c(b"abd"))),
        b"abc",
    );
    assert_eq!(r.reply().1.status, Status::ChecksumMismatch.0);
    r.send(
        Kind::Put,
        17,
        false,
        &put("short", 10, Some(proto::crc32c(b"abc"))),
        b"abc",
    );
    assert_eq!(r.reply().1.status, Status::InvalidRequest.0);
    r.send(Kind::Put, 18, false, &put("nocrc", 3, None), b"abc");
    assert_eq!(r.reply().1.status, Status::InvalidRequest.0);
    r.send(Kind::Put, 19, false, &put("huge", 6 << 40, Some(0)), b"");
    assert_eq!(r.reply().1.status, Status::TooLarge.0);
    // Streamed over three frames with the CRC in the last: stored.
    r.send(Kind::Put, 20, true, &put("ok", 9, None), b"abc");
    r.send(Kind::PutData, 20, true, &[], b"def");
    r.send(
        Kind::PutData,
        20,
        false,
        &Request::PutData {
            crc32c: Some(proto::crc32c(b"abcdefghi")),
        }
        .encode(),
        b"ghi",
    );
    let (id, rep) = r.reply();
    assert_eq!((id, rep.status, rep.size), (20, 0, 9));
    // A Put cut off mid-stream by a disconnect leaves nothing visible.
    let mut cut = Raw::authed(port);
    cut.send(
        Kind::Put,
        21,
        true,
        &put("cut", 1 << 20, Some(0)),
        &[1; 1000],
    );
    drop(cut);
    // Truncated frame then disconnect.
    let mut t = Raw::authed(port);
    let f = proto::frame(Kind::Stat, 22, false, &[0; 100], 0);
    t.s.write_all(&f[..50]).unwrap();
    drop(t);
    // Garbage before Hello.
    let (mut g, _) = Raw::connect(port);
    g.s.write_all(&[0u8; 24]).unwrap();
    assert_eq!(g.reply().1.status, Status::BadFrame.0);
    assert!(g.closed());
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        for key in ["crc", "short", "nocrc", "huge", "cut"] {
            assert_eq!(
                c.stat("bkt", key).await.unwrap_err().status(),
                Some(Status::NoSuchKey),
                "{key}"
            );
        }
        let o = c.get("bkt", "ok", &[]).await.unwrap();
        assert_eq!(&o.ranges[0].1[..], b"abcdefghi");
    });
    stat_ok(port);
}

fn rss_bytes(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn a_reader_that_stops_reading_holds_bounded_memory_and_others_are_served() {
    let server = start(1);
    let data = pattern(5, 32 << 20);
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        c.create_bucket("slow").await.unwrap();
        c.put("slow", "big", Bytes::from(data.clone()))
            .await
            .unwrap();
        c.put("slow", "small", Bytes::from_static(b"still here"))
            .await
            .unwrap();
    });
    let before = rss_bytes(server.child.id());
    // 64 GETs of 32 MiB each (2 GiB of replies), never read.
    let mut slow = Raw::authed(server.native);
    let get = Request::Get {
        bucket: "slow".into(),
        item: proto::BatchItem {
            key: "big".into(),
            ranges: vec![],
        },
    }
    .encode();
    for id in 0..64 {
        slow.send(Kind::Get, 1000 + id, false, &get, &[]);
    }
    std::thread::sleep(Duration::from_secs(2));
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        for i in 0..50 {
            let o = c.get("slow", "small", &[]).await.unwrap();
            assert_eq!(&o.ranges[0].1[..], b"still here");
            c.put(
                "slow",
                &format!("n{i}"),
                Bytes::from(vec![i as u8; 100_000]),
            )
            .await
            .unwrap();
        }
        let o = c
            .get(
                "slow",
                "big",
                &[Range {
                    offset: 1 << 20,
                    length: 4 << 20,
                }],
            )
            .await
            .unwrap();
        assert!(o.ranges[0].1[..] == data[1 << 20..5 << 20]);
    });
    let grown = rss_bytes(server.child.id()).saturating_sub(before);
    assert!(
        grown < 96 << 20,
        "server RSS grew by {} MiB with a stalled reader",
        grown >> 20
    );
    drop(slow);
}

// ----------------------------------------------------------------------
// Issue 15: resources an unauthenticated or stalled peer can hold
// ----------------------------------------------------------------------

/// A metric from the server's /metrics, summed over its label sets.
fn metric(s: &Server, name: &str) -> u64 {
    let mut c = StdTcp::connect(("127.0.0.1", s.admin)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    // Head, then Content-Length bytes (the connection may stay open).
    let mut rd = BufReader::new(c);
    let mut len = 0;
    loop {
        let mut line = String::new();
        rd.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0u8; len];
    rd.read_exact(&mut body).unwrap();
    String::from_utf8(body)
        .unwrap()
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A raw connection that read the Challenge and then sends `frame_header`
/// and dribbles bytes after it, one per `every`, from its own thread, until
/// the server closes it.
fn dribbler(port: u16, frame_header: Vec<u8>, every: Duration) -> StdTcp {
    let (r, _) = Raw::connect(port);
    let mut w = r.s.try_clone().unwrap();
    w.write_all(&frame_header).unwrap();
    std::thread::spawn(move || {
        for _ in 0..600 {
            std::thread::sleep(every);
            if w.write_all(&[0]).is_err() {
                break;
            }
        }
    });
    r.s
}

/// A frame header announcing `header_len` and `payload_len` bytes.
fn announce(kind: Kind, header_len: u32, payload_len: u32) -> Vec<u8> {
    let mut f = proto::frame(kind, 77, false, &[], 0);
    f[16..20].copy_from_slice(&header_len.to_le_bytes());
    f[20..24].copy_from_slice(&payload_len.to_le_bytes());
    f
}

/// Item 8: before Hello, a peer announcing a 1 MiB header and a 4 MiB
/// payload and then dribbling took budget and buffers unauthenticated; 64
/// of them exhausted the shard's byte budget and stopped authenticated
/// GETs and PUTs. Now such frames are refused unread and closed.
#[test]
fn pre_auth_connections_announcing_big_frames_do_not_block_authenticated_traffic() {
    let server = start(1);
    let data = pattern(8, 3 << 20);
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        c.create_bucket("preauth").await.unwrap();
        c.put("preauth", "old", Bytes::from(data.clone()))
            .await
            .unwrap();
    });
    let max = (proto::HEADER_BYTES_MAX, proto::PAYLOAD_BYTES_MAX);
    let mut hostile: Vec<(Kind, StdTcp)> = (0..80)
        .map(|i| {
            let kind = if i % 2 == 0 { Kind::Put } else { Kind::Hello };
            let s = dribbler(
                server.native,
                announce(kind, max.0, max.1),
                Duration::from_millis(200),
            );
            (kind, s)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    rt().block_on(async {
        let work = async {
            let c = Client::connect(config(&server)).await.unwrap();
            let o = c.get("preauth", "old", &[]).await.unwrap();
            assert!(o.ranges[0].1[..] == data[..]);
            let st = c
                .put("preauth", "new", Bytes::from(data.clone()))
                .await
                .unwrap();
            assert_eq!(st.size, data.len() as u64);
            let o = c.get("preauth", "new", &[]).await.unwrap();
            assert!(o.ranges[0].1[..] == data[..]);
        };
        tokio::time::timeout(Duration::from_secs(8), work)
            .await
            .expect("authenticated GET/PUT blocked by unauthenticated connections");
    });
    // Each was refused at once with the status that says why, and closed.
    for (kind, s) in hostile.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = Raw {
            s: s.try_clone().unwrap(),
        };
        let (id, rep) = r.reply();
        let want = if *kind == Kind::Hello {
            Status::BadFrame
        } else {
            Status::Unauthenticated
        };
        assert_eq!((id, rep.status), (77, want.0), "{kind:?}: {}", rep.message);
        assert!(r.closed());
    }
    stat_ok(server.native);
}

/// Item 8: before Hello only a small Hello without payload is read.
#[test]
fn a_pre_auth_frame_with_payload_is_refused() {
    let server = start(1);
    // A well-formed Hello, with a payload: refused, not authenticated.
    let (mut r, nonce) = Raw::connect(server.native);
    let cn = [7u8; 32];
    let h = Request::Hello(proto::Hello {
        version: 1,
        access_key: "percore".into(),
        client_nonce: cn.to_vec(),
        mac: proto::client_mac("percore-secret", "percore", &nonce, &cn).to_vec(),
        client_name: "raw".into(),
    });
    r.send(Kind::Hello, 1, false, &h.encode(), &[0u8; 10]);
    let (fh, msg, _) = r.read().expect("a reply");
    let ServerMessage::Reply(rep) = msg else {
        panic!("a Hello with a payload was answered with {:?}", fh.kind)
    };
    assert_eq!((fh.request_id, rep.status), (1, Status::BadFrame.0));
    assert!(r.closed());
    // A Hello announcing more than 4 KiB of header.
    let (mut r, _) = Raw::connect(server.native);
    r.s.write_all(&announce(Kind::Hello, 4097, 0)).unwrap();
    assert_eq!(r.reply(), (77, r_err(Status::BadFrame, 4097, 0)));
    assert!(r.closed());
    // A Put with its payload, before Hello.
    let (mut r, _) = Raw::connect(server.native);
    r.send(Kind::Put, 9, false, &[0u8; 64], &[1u8; 1000]);
    let (id, rep) = r.reply();
    assert_eq!((id, rep.status), (9, Status::Unauthenticated.0));
    assert!(r.closed());
    // An unknown kind before Hello is not skipped.
    let (mut r, _) = Raw::connect(server.native);
    let mut f = announce(Kind::Stat, 100, 1000);
    f[5] = 0x42;
    r.s.write_all(&f).unwrap();
    assert_eq!(r.reply().1.status, Status::BadFrame.0);
    assert!(r.closed());
    stat_ok(server.native);
}

fn r_err(status: Status, header_len: u32, payload_len: u32) -> proto::Reply {
    proto::Reply::error(
        status,
        format!("a Hello has no payload and at most 4096 header bytes (got {header_len} and {payload_len}); closing the connection"),
    )
}

/// Item 8: every byte before HelloOk arrives under one deadline (10 s from
/// connecting), however slowly it is dribbled: the frame's message header
/// used to get a fresh 30 s after its frame header.
#[test]
fn a_pre_auth_frame_dribbled_byte_by_byte_is_cut_at_the_hello_deadline() {
    let server = start(1);
    let started = Instant::now();
    let mut s = dribbler(
        server.native,
        announce(Kind::Hello, 4000, 0),
        Duration::from_millis(250),
    );
    s.set_read_timeout(Some(Duration::from_secs(45))).unwrap();
    let mut b = [0u8; 64];
    let n = s.read(&mut b).unwrap_or(0);
    let took = started.elapsed();
    assert_eq!(n, 0, "expected the connection closed");
    assert!(
        took < Duration::from_secs(13),
        "an unauthenticated dribbler kept its connection {took:?}"
    );
    stat_ok(server.native);
}

/// Item 9: a native Put whose client stops sending PutData is aborted after
/// the PutData timeout (its writer dropped, its session on the owner shard
/// closed) and answered with an error; a slow but steady Put is not.
#[test]
fn a_native_put_that_stops_sending_is_aborted_after_the_put_data_timeout() {
    let server = start_with(2, &[("PERCORE_NATIVE_PUT_DATA_TIMEOUT_S", "2")]);
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        c.create_bucket("stall").await.unwrap();
    });
    let (mut r, hello) = Raw::authed_hello(server.native);
    r.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let owner = |k: &str| {
        percore_protocol::routing::owner_shard(hello.hash_seed, 2, b"stall", k.as_bytes()) as u32
    };
    let key_of = |shard: u32| {
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| owner(k) == shard)
            .unwrap()
    };
    let (local, remote) = (key_of(hello.shard_id), key_of(1 - hello.shard_id));
    let put = |key: &str, size: u64| {
        Request::Put(proto::PutRequest {
            bucket: "stall".into(),
            key: key.into(),
            size,
            content_type: String::new(),
            crc32c: None,
        })
        .encode()
    };
    let started = Instant::now();
    r.send(Kind::Put, 1, true, &put(&local, 1 << 20), &[1; 1000]);
    r.send(Kind::Put, 2, true, &put(&remote, 1 << 20), &[2; 1000]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(metric(&server, "percore_cross_shard_sessions"), 1);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (id, rep) = r.reply();
        assert_eq!(rep.status, Status::InvalidRequest.0, "{}", rep.message);
        assert!(rep.message.contains("no PutData"), "{}", rep.message);
        ids.push(id);
    }
    ids.sort();
    assert_eq!(ids, vec![1, 2]);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "{took:?}"
    );
    // Nothing held: no session on the owner, no request in flight.
    assert_eq!(metric(&server, "percore_cross_shard_sessions"), 0);
    assert_eq!(metric(&server, "percore_requests_in_flight"), 0);
    // A Put whose frames come slower than the timeout in total, but each
    // within it, is stored; the connection served it after the aborts.
    let body = pattern(3, 4000);
    r.send(Kind::Put, 3, true, &put(&remote, 4000), &body[..1000]);
    for (i, part) in body[1000..].chunks(1000).enumerate() {
        std::thread::sleep(Duration::from_millis(900));
        let last = i == 2;
        let h = if last {
            Request::PutData {
                crc32c: Some(proto::crc32c(&body)),
            }
            .encode()
        } else {
            Vec::new()
        };
        r.send(Kind::PutData, 3, !last, &h, part);
    }
    let (id, rep) = r.reply();
    assert_eq!((id, rep.status, rep.size), (3, 0, 4000), "{}", rep.message);
    rt().block_on(async {
        let c = Client::connect(config(&server)).await.unwrap();
        assert_eq!(
            c.stat("stall", &local).await.unwrap_err().status(),
            Some(Status::NoSuchKey)
        );
        let o = c.get("stall", &remote, &[]).await.unwrap();
        assert!(o.ranges[0].1[..] == body[..]);
    });
}
