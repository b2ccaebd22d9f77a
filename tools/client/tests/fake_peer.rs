//! The client against a hostile or flaky peer (a fake server speaking the
//! native protocol on a real socket): the server-proof check, retries of
//! idempotent requests on Busy and on a dropped connection (and no retries
//! of the rest), the per-attempt deadline, a Hello that never comes, and a
//! chunk that fails its CRC32C. The client against the real server is
//! tested in server/tests/native.rs.

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use percore_client::{Client, Config, Error, Range, Status};
use percore_protocol::native::{
    self as proto, Challenge, ChunkHead, FrameHeader, HelloOk, ItemHead, Kind, Reply, Request,
    ServerMessage,
};
use percore_protocol::routing;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ACCESS: &str = "percore";
const SECRET: &str = "percore-secret";

#[derive(Clone, Copy, Debug)]
enum Peer {
    /// Answers everything; proves a secret other than the client's.
    WrongProof,
    /// Accepts and never sends the Challenge.
    NoChallenge,
    /// The first `n` requests get Busy, the rest succeed.
    BusyFirst(usize),
    /// Every request gets this status.
    Always(Status),
    /// Never answers a request.
    Silent,
    /// Closes the connection on the first request; answers later ones.
    DropFirst,
    /// Answers a Get with a chunk whose CRC32C is wrong.
    BadChunkCrc,
    /// A cluster node whose ClusterMap answer is this JSON (`{port}`
    /// stands for its own port) and which answers every key request with
    /// WrongNode.
    ClusterMap(&'static str),
}

struct Fake {
    port: u16,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl Fake {
    fn config(&self) -> Config {
        let mut c = Config::new(format!("127.0.0.1:{}", self.port), ACCESS, SECRET);
        c.timeout = Duration::from_secs(5);
        // Busy counts against `attempts` only, unless a test says otherwise.
        c.busy_for = Duration::ZERO;
        c
    }
    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn fake(peer: Peer) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let (r, c) = (requests.clone(), connections.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, peer, port, r.clone()));
        }
    });
    Fake {
        port,
        requests,
        connections,
    }
}

async fn read_frame(s: &mut TcpStream) -> Option<(FrameHeader, Vec<u8>, Vec<u8>)> {
    let mut h = [0u8; proto::FRAME_HEADER_BYTES];
    s.read_exact(&mut h).await.ok()?;
    let fh = FrameHeader::decode(&h).expect("the client sends well-formed frames");
    let mut header = vec![0u8; fh.header_len as usize];
    s.read_exact(&mut header).await.ok()?;
    let mut payload = vec![0u8; fh.payload_len as usize];
    s.read_exact(&mut payload).await.ok()?;
    Some((fh, header, payload))
}

async fn send(s: &mut TcpStream, kind: Kind, id: u64, more: bool, msg: &[u8], payload: &[u8]) {
    let mut f = proto::frame(kind, id, more, msg, payload.len());
    f.extend_from_slice(payload);
    let _ = s.write_all(&f).await;
}

async fn reply(s: &mut TcpStream, id: u64, r: Reply) {
    send(
        s,
        Kind::Reply,
        id,
        false,
        &ServerMessage::Reply(r).encode(),
        &[],
    )
    .await;
}

async fn serve(mut s: TcpStream, peer: Peer, port: u16, requests: Arc<AtomicUsize>) {
    if let Peer::NoChallenge = peer {
        tokio::time::sleep(Duration::from_secs(30)).await;
        return;
    }
    let nonce = [7u8; proto::NONCE_BYTES];
    let ch = ServerMessage::Challenge(Challenge {
        versions: vec![proto::VERSION],
        server_nonce: nonce.to_vec(),
    });
    send(&mut s, Kind::Challenge, 0, false, &ch.encode(), &[]).await;
    let Some((fh, header, _)) = read_frame(&mut s).await else {
        return;
    };
    let Ok(Request::Hello(h)) = proto::decode_request(fh.kind, &header) else {
        panic!("the client's first frame is a Hello");
    };
    // The client proves it holds the secret.
    assert_eq!(
        h.mac,
        proto::client_mac(SECRET, &h.access_key, &nonce, &h.client_nonce).to_vec()
    );
    let secret = match peer {
        Peer::WrongProof => "not-the-secret",
        _ => SECRET,
    };
    let ok = HelloOk {
        version: proto::VERSION,
        server_proof: proto::server_proof(secret, &nonce, &h.client_nonce).to_vec(),
        shard_id: 0,
        shard_count: 1,
        hash_algorithm: routing::HASH_ALGORITHM.to_string(),
        hash_seed: 42,
        shard_ports: vec![port],
        frame_payload_max: proto::PAYLOAD_BYTES_MAX,
        in_flight_max: proto::IN_FLIGHT_MAX,
        ranges_max: proto::RANGES_MAX,
        batch_items_max: proto::BATCH_ITEMS_MAX,
        list_limit_max: proto::LIST_LIMIT_MAX,
        object_bytes_max: 5 << 30,
        pg_count: u32::from(matches!(peer, Peer::ClusterMap(_))) * 16,
        cluster_epoch: 1,
        node_id: 1,
    };
    send(
        &mut s,
        Kind::HelloOk,
        fh.request_id,
        false,
        &ServerMessage::HelloOk(ok).encode(),
        &[],
    )
    .await;
    while let Some((fh, header, _)) = read_frame(&mut s).await {
        let req = proto::decode_request(fh.kind, &header).expect("a valid request");
        let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
        let id = fh.request_id;
        match peer {
            Peer::Silent => continue,
            Peer::DropFirst if n == 1 => return,
            Peer::BusyFirst(k) if n <= k => {
                reply(&mut s, id, Reply::error(Status::Busy, "busy")).await
            }
            Peer::Always(status) => reply(&mut s, id, Reply::error(status, "refused")).await,
            Peer::ClusterMap(json) => {
                let r = match req {
                    Request::ClusterMap => Reply {
                        map_epoch: 1,
                        cluster_map: json.replace("{port}", &port.to_string()),
                        ..Reply::default()
                    },
                    _ => Reply::error(Status::WrongNode, "not mine"),
                };
                reply(&mut s, id, r).await;
            }
            Peer::BadChunkCrc => {
                let data = b"0123456789";
                let head = ItemHead {
                    size: 10,
                    etag: "e".into(),
                    ranges: vec![Range {
                        offset: 0,
                        length: 10,
                    }],
                    ..ItemHead::default()
                };
                send(
                    &mut s,
                    Kind::ItemHead,
                    id,
                    true,
                    &ServerMessage::ItemHead(head).encode(),
                    &[],
                )
                .await;
                let chunk = ChunkHead {
                    item: 0,
                    range: 0,
                    offset: 0,
                    crc32c: proto::crc32c(data) ^ 1,
                };
                send(
                    &mut s,
                    Kind::Chunk,
                    id,
                    true,
                    &proto::encode_chunk(&chunk),
                    data,
                )
                .await;
                reply(&mut s, id, Reply::default()).await;
            }
            _ => {
                let r = match req {
                    Request::Stat { .. } | Request::Put(_) => Reply {
                        size: 5,
                        etag: "etag".into(),
                        owner_shard: 0,
                        ..Reply::default()
                    },
                    _ => Reply::default(),
                };
                reply(&mut s, id, r).await;
            }
        }
    }
}

#[tokio::test]
async fn a_server_that_cannot_prove_it_holds_the_secret_is_refused() {
    let f = fake(Peer::WrongProof).await;
    match Client::connect(f.config()).await {
        Err(Error::Protocol(m)) => assert!(m.contains("could not prove"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("connected to a server that does not know the secret"),
    }
    assert_eq!(f.requests(), 0, "no request may reach an unproven server");
    // The same peer with the right secret is accepted.
    let good = fake(Peer::BusyFirst(0)).await;
    let c = Client::connect(good.config()).await.unwrap();
    assert_eq!(c.stat("b", "k").await.unwrap().size, 5);
}

#[tokio::test]
async fn busy_is_retried_with_backoff_until_it_succeeds() {
    let f = fake(Peer::BusyFirst(2)).await;
    let c = Client::connect(f.config()).await.unwrap();
    let started = Instant::now();
    let st = c.stat("b", "k").await.unwrap();
    assert_eq!(st.size, 5);
    assert_eq!(f.requests(), 3);
    // Backoff 20 ms, then 80 ms, each jittered to at least half.
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(f.connections(), 1, "Busy does not need a new connection");
}

#[tokio::test]
async fn busy_past_the_attempts_is_returned() {
    let f = fake(Peer::BusyFirst(100)).await;
    let mut cfg = f.config();
    cfg.attempts = 3;
    let c = Client::connect(cfg).await.unwrap();
    let e = c.stat("b", "k").await.unwrap_err();
    assert_eq!(e.status(), Some(Status::Busy), "{e}");
    assert_eq!(f.requests(), 3);
    let before = f.requests();
    cfg = f.config();
    cfg.attempts = 1;
    let c = Client::connect(cfg).await.unwrap();
    assert_eq!(
        c.list_buckets().await.unwrap_err().status(),
        Some(Status::Busy)
    );
    assert_eq!(f.requests() - before, 1);
}

/// Busy past the attempts goes on for `busy_for` (a cluster taking a
/// placement group over answers Busy for up to about a lease), with the
/// backoff capped, and no longer.
#[tokio::test]
async fn busy_is_retried_for_busy_for() {
    let f = fake(Peer::BusyFirst(6)).await;
    let mut cfg = f.config();
    cfg.busy_for = Duration::from_secs(5);
    let c = Client::connect(cfg).await.unwrap();
    let started = Instant::now();
    assert_eq!(c.stat("b", "k").await.unwrap().size, 5);
    assert_eq!(f.requests(), 7);
    // 20 + 80 + 320 + 500 + 500 + 500 ms, each backoff jittered to
    // between half of it and all of it.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(950), "{took:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");

    let f = fake(Peer::BusyFirst(1000)).await;
    let mut cfg = f.config();
    cfg.busy_for = Duration::from_millis(1500);
    let c = Client::connect(cfg).await.unwrap();
    let started = Instant::now();
    assert_eq!(
        c.stat("b", "k").await.unwrap_err().status(),
        Some(Status::Busy)
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500) + Duration::from_secs(1),
        "{took:?}"
    );
    assert!((4..=10).contains(&f.requests()), "{}", f.requests());
}

#[tokio::test]
async fn create_bucket_and_streamed_put_are_not_retried() {
    let f = fake(Peer::BusyFirst(100)).await;
    let c = Client::connect(f.config()).await.unwrap();
    assert_eq!(
        c.create_bucket("b").await.unwrap_err().status(),
        Some(Status::Busy)
    );
    assert_eq!(f.requests(), 1, "CreateBucket is not idempotent");
    // A Put from memory is (it can be sent again)...
    let e = c
        .put("b", "k", Bytes::from_static(b"hello"))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::Busy));
    let after_put = f.requests();
    assert_eq!(after_put, 1 + 3, "a Put from memory is retried");
    // ...a streamed one is not (its source was consumed).
    let data = vec![1u8; 100];
    let mut src: &[u8] = &data;
    let e = c
        .put_stream("b", "k2", 100, "", &mut src, &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::Busy), "{e}");
    assert_eq!(f.requests(), after_put + 1);
}

#[tokio::test]
async fn permanent_errors_are_not_retried() {
    for status in [
        Status::NoSuchKey,
        Status::Unauthenticated,
        Status::Internal,
        Status::Corrupt,
    ] {
        let f = fake(Peer::Always(status)).await;
        let c = Client::connect(f.config()).await.unwrap();
        let e = c.stat("b", "k").await.unwrap_err();
        assert_eq!(e.status(), Some(status), "{e}");
        assert_eq!(f.requests(), 1, "{status:?} was retried");
    }
    // ShuttingDown is transient: retried.
    let f = fake(Peer::Always(Status::ShuttingDown)).await;
    let c = Client::connect(f.config()).await.unwrap();
    assert_eq!(
        c.stat("b", "k").await.unwrap_err().status(),
        Some(Status::ShuttingDown)
    );
    assert_eq!(f.requests(), 3);
}

#[tokio::test]
async fn a_silent_server_fails_each_attempt_at_the_deadline() {
    let f = fake(Peer::Silent).await;
    let mut cfg = f.config();
    cfg.timeout = Duration::from_millis(300);
    cfg.attempts = 2;
    let c = Client::connect(cfg).await.unwrap();
    let started = Instant::now();
    match c.stat("b", "k").await {
        Err(Error::Timeout(d)) => assert_eq!(d, Duration::from_millis(300)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(f.requests(), 2);
}

#[tokio::test]
async fn a_dropped_connection_is_retried_on_a_new_one() {
    let f = fake(Peer::DropFirst).await;
    let c = Client::connect(f.config()).await.unwrap();
    assert_eq!(c.stat("b", "k").await.unwrap().size, 5);
    assert_eq!(f.requests(), 2);
    assert_eq!(f.connections(), 2);
}

#[tokio::test]
async fn a_server_that_never_says_hello_times_out() {
    let f = fake(Peer::NoChallenge).await;
    let mut cfg = f.config();
    cfg.timeout = Duration::from_millis(300);
    let started = Instant::now();
    match Client::connect(cfg).await {
        Err(Error::Timeout(_)) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("connected without a Challenge"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Nothing listens: a Connect error naming the address.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = Config::new(format!("127.0.0.1:{port}"), ACCESS, SECRET);
    match Client::connect(cfg).await {
        Err(e @ Error::Connect { .. }) => assert!(e.to_string().contains(&port.to_string())),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("connected to nothing"),
    }
}

#[tokio::test]
async fn a_chunk_that_fails_its_crc_is_an_error_not_data() {
    let f = fake(Peer::BadChunkCrc).await;
    let c = Client::connect(f.config()).await.unwrap();
    match c.get("b", "k", &[]).await {
        Err(Error::Checksum {
            offset,
            got,
            expected,
        }) => {
            assert_eq!(offset, 0);
            assert_eq!(got, proto::crc32c(b"0123456789"));
            assert_eq!(expected, got ^ 1);
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert_eq!(f.requests(), 1, "a checksum failure is not retried");
}

const GOOD_MAP: &str = r#"{"cluster":"c","epoch":1,"pgs":16,"replicas":1,"seed":"0x2a",
  "nodes":[{"id":1,"name":"n1","zone":"z","state":"up","s3":"127.0.0.1:1","native":["127.0.0.1:{port}"]}]}"#;

/// A cluster node's map is checked before it is used: a broken or
/// hostile one is a clear error, never a panic or a division by zero.
#[tokio::test]
async fn a_bad_cluster_map_is_refused() {
    for (json, want) in [
        ("not json", "bad cluster map"),
        (
            r#"{"cluster":"c","epoch":1,"pgs":0,"replicas":1,"seed":"0x1","nodes":[]}"#,
            "0 placement groups",
        ),
        (
            r#"{"cluster":"c","epoch":1,"pgs":16,"replicas":9,"seed":"0x1","nodes":[]}"#,
            "9 replicas",
        ),
        (
            r#"{"cluster":"c","epoch":1,"pgs":16,"replicas":1,"seed":"12","nodes":[]}"#,
            "seed",
        ),
        (
            r#"{"cluster":"c","epoch":1,"pgs":16,"replicas":1,"seed":"0x1","nodes":[]}"#,
            "no nodes",
        ),
        (
            r#"{"cluster":"c","epoch":1,"pgs":16,"replicas":1,"seed":"0x1","nodes":[{"id":1,"name":"n","zone":"z","state":"up","s3":"","native":[]}]}"#,
            "0 shards",
        ),
        (
            r#"{"cluster":"c","epoch":1,"pgs":16,"replicas":1,"seed":"0x1","nodes":[{"id":1,"name":"n","zone":"z","state":"up","s3":"","native":["nowhere"]}]}"#,
            "address",
        ),
    ] {
        let leaked: &'static str = Box::leak(json.to_string().into_boxed_str());
        let f = fake(Peer::ClusterMap(leaked)).await;
        match Client::connect(f.config()).await {
            Err(e @ Error::Protocol(_)) => assert!(e.to_string().contains(want), "{e}"),
            Err(e) => panic!("wrong error for {json}: {e}"),
            Ok(_) => panic!("a bad map was taken: {json}"),
        }
    }
}

/// A node that keeps answering WrongNode (its map disagrees with the one
/// it hands out) ends the request with WrongNode after a bounded number
/// of attempts and map fetches.
#[tokio::test]
async fn wrong_node_answers_are_followed_a_bounded_number_of_times() {
    let f = fake(Peer::ClusterMap(GOOD_MAP)).await;
    let c = Client::connect(f.config()).await.unwrap();
    assert_eq!(c.cluster_map().unwrap().nodes.len(), 1);
    let before = f.requests();
    match c.stat("b", "k").await {
        Err(e) => assert_eq!(e.status(), Some(Status::WrongNode), "{e}"),
        Ok(_) => panic!("a WrongNode answer was taken"),
    }
    let sent = f.requests() - before;
    assert!((8..=16).contains(&sent), "{sent} requests");
    assert!(c.map_refreshes.load(Ordering::Relaxed) >= 7);
}
