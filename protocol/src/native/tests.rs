//! Codec round trips (fixed and seeded-random messages) and decoder
//! robustness (random and mutated bytes never panic).

use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn rstr(rng: &mut StdRng, max: usize) -> String {
    let n = rng.gen_range(0..=max);
    (0..n)
        .map(|_| match rng.gen_range(0..4) {
            0 => 'é',
            1 => '/',
            _ => rng.gen_range(b'a'..=b'z') as char,
        })
        .collect()
}

fn rkey(rng: &mut StdRng) -> String {
    let mut k = rstr(rng, 40);
    k.push('k');
    k
}

fn rranges(rng: &mut StdRng) -> Vec<Range> {
    (0..rng.gen_range(0..20))
        .map(|_| Range {
            offset: rng.gen(),
            length: rng.gen(),
        })
        .collect()
}

fn random_request(rng: &mut StdRng) -> Request {
    let bucket = format!("b{}", rstr(rng, 20).replace(['é', '/'], "x"));
    match rng.gen_range(0..11) {
        0 => Request::Hello(Hello {
            version: rng.gen(),
            access_key: rstr(rng, 30),
            client_nonce: (0..32).map(|_| rng.gen()).collect(),
            mac: (0..32).map(|_| rng.gen()).collect(),
            client_name: rstr(rng, 10),
        }),
        1 => Request::Get {
            bucket,
            item: BatchItem {
                key: rkey(rng),
                ranges: rranges(rng),
            },
        },
        2 => Request::BatchGet {
            bucket,
            items: (0..rng.gen_range(1..50))
                .map(|_| BatchItem {
                    key: rkey(rng),
                    ranges: rranges(rng),
                })
                .collect(),
        },
        3 => Request::Put(PutRequest {
            bucket,
            key: rkey(rng),
            size: rng.gen(),
            content_type: rstr(rng, 20),
            crc32c: rng.gen::<bool>().then(|| rng.gen()),
        }),
        4 => Request::PutData {
            crc32c: rng.gen::<bool>().then(|| rng.gen()),
        },
        5 => Request::Delete {
            bucket,
            key: rkey(rng),
        },
        6 => Request::Stat {
            bucket,
            key: rkey(rng),
        },
        7 => Request::List(ListRequest {
            bucket,
            prefix: rstr(rng, 20),
            start_after: rstr(rng, 20),
            delimiter: rstr(rng, 2),
            limit: rng.gen(),
        }),
        8 => Request::CreateBucket { bucket },
        9 => Request::ClusterMap,
        _ => Request::ListBuckets,
    }
}

fn random_server(rng: &mut StdRng) -> ServerMessage {
    match rng.gen_range(0..5) {
        0 => ServerMessage::Challenge(Challenge {
            versions: vec![1, rng.gen()],
            server_nonce: (0..32).map(|_| rng.gen()).collect(),
        }),
        1 => ServerMessage::HelloOk(HelloOk {
            version: 1,
            server_proof: (0..32).map(|_| rng.gen()).collect(),
            shard_id: rng.gen(),
            shard_count: rng.gen(),
            hash_algorithm: rstr(rng, 40),
            hash_seed: rng.gen(),
            shard_ports: (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect(),
            frame_payload_max: rng.gen(),
            in_flight_max: rng.gen(),
            ranges_max: rng.gen(),
            batch_items_max: rng.gen(),
            list_limit_max: rng.gen(),
            object_bytes_max: rng.gen(),
            pg_count: rng.gen(),
            cluster_epoch: rng.gen(),
            node_id: rng.gen(),
        }),
        2 => ServerMessage::ItemHead(ItemHead {
            item: rng.gen(),
            status: rng.gen_range(0..21),
            message: rstr(rng, 30),
            owner_shard: rng.gen(),
            size: rng.gen(),
            etag: rstr(rng, 32),
            mtime_ms: rng.gen(),
            content_type: rstr(rng, 20),
            ranges: rranges(rng),
        }),
        3 => ServerMessage::Chunk(ChunkHead {
            item: rng.gen(),
            range: rng.gen(),
            offset: rng.gen(),
            crc32c: rng.gen(),
        }),
        _ => ServerMessage::Reply(Reply {
            status: rng.gen_range(0..20),
            message: rstr(rng, 30),
            owner_shard: rng.gen(),
            size: rng.gen(),
            etag: rstr(rng, 32),
            mtime_ms: rng.gen(),
            content_type: rstr(rng, 20),
            crc32c: rng.gen(),
            existed: rng.gen(),
            entries: (0..rng.gen_range(0..30))
                .map(|_| ListEntry {
                    key: rkey(rng),
                    size: rng.gen(),
                    etag: rstr(rng, 32),
                    mtime_ms: rng.gen(),
                    is_prefix: rng.gen(),
                })
                .collect(),
            truncated: rng.gen(),
            next_start_after: rstr(rng, 20),
            buckets: (0..rng.gen_range(0..10))
                .map(|_| BucketEntry {
                    name: rkey(rng),
                    created_ms: rng.gen(),
                })
                .collect(),
            map_epoch: rng.gen(),
            cluster_map: rstr(rng, 200),
        }),
    }
}

#[test]
fn frame_header_round_trip_and_layout() {
    let fh = FrameHeader {
        kind: Kind::BatchGet,
        flags: FLAG_MORE,
        request_id: 0x0102_0304_0506_0708,
        header_len: 77,
        payload_len: 4096,
    };
    let b = fh.encode();
    // Byte-by-byte layout as documented in docs/native.md.
    assert_eq!(&b[0..4], b"PCN1");
    assert_eq!(b[4], 1);
    assert_eq!(b[5], 3);
    assert_eq!(&b[6..8], &[1, 0]);
    assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(&b[16..20], &[77, 0, 0, 0]);
    assert_eq!(&b[20..24], &[0, 16, 0, 0]);
    assert_eq!(FrameHeader::decode(&b), Ok(fh));
}

#[test]
fn frame_header_refusals() {
    let good = FrameHeader {
        kind: Kind::Get,
        flags: 0,
        request_id: 9,
        header_len: 10,
        payload_len: 0,
    }
    .encode();
    let mut b = good;
    b[0] = b'X';
    assert!(matches!(
        FrameHeader::decode(&b),
        Err(FrameError::BadMagic(_))
    ));
    let mut b = good;
    b[4] = 2;
    assert_eq!(
        FrameHeader::decode(&b),
        Err(FrameError::UnsupportedVersion(2))
    );
    let mut b = good;
    b[5] = 0x55;
    assert_eq!(
        FrameHeader::decode(&b),
        Err(FrameError::UnknownKind {
            kind: 0x55,
            request_id: 9,
            header_len: 10,
            payload_len: 0
        })
    );
    let mut b = good;
    b[6] = 0x80;
    assert_eq!(FrameHeader::decode(&b), Err(FrameError::UnknownFlags(0x80)));
    let mut b = good;
    b[16..20].copy_from_slice(&(HEADER_BYTES_MAX + 1).to_le_bytes());
    assert_eq!(
        FrameHeader::decode(&b),
        Err(FrameError::HeaderTooLarge(HEADER_BYTES_MAX + 1))
    );
    let mut b = good;
    b[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        FrameHeader::decode(&b),
        Err(FrameError::PayloadTooLarge(u32::MAX))
    );
}

#[test]
fn requests_round_trip_seeded() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for _ in 0..5000 {
        let r = random_request(&mut rng);
        let bytes = r.encode();
        assert_eq!(decode_request(r.kind(), &bytes), Ok(r));
    }
}

#[test]
fn server_messages_round_trip_seeded() {
    let mut rng = StdRng::seed_from_u64(0xfeed);
    for _ in 0..5000 {
        let m = random_server(&mut rng);
        let bytes = m.encode();
        assert_eq!(decode_server(m.kind(), &bytes), Ok(m));
    }
}

#[test]
fn decoders_survive_random_and_mutated_bytes() {
    let mut rng = StdRng::seed_from_u64(7);
    let kinds: Vec<Kind> = (0..=255u8).filter_map(Kind::from_u8).collect();
    let mut refused = 0;
    for i in 0..20_000 {
        let kind = kinds[rng.gen_range(0..kinds.len())];
        let mut bytes = if i % 2 == 0 {
            random_request(&mut rng).encode()
        } else {
            random_server(&mut rng).encode()
        };
        // Flip, truncate or extend.
        match rng.gen_range(0..3) {
            0 if !bytes.is_empty() => {
                let at = rng.gen_range(0..bytes.len());
                bytes[at] ^= 1 << rng.gen_range(0..8);
            }
            1 => bytes.truncate(rng.gen_range(0..=bytes.len())),
            _ => bytes.extend((0..rng.gen_range(0..16)).map(|_| rng.gen::<u8>())),
        }
        let a = if kind.is_request() {
            decode_request(kind, &bytes).is_err()
        } else {
            decode_server(kind, &bytes).is_err()
        };
        refused += usize::from(a);
        let mut header = [0u8; FRAME_HEADER_BYTES];
        rng.fill(&mut header[..]);
        if rng.gen() {
            header[0..4].copy_from_slice(&MAGIC);
            header[4] = VERSION;
        }
        let _ = FrameHeader::decode(&header);
    }
    // Most garbage is refused (some mutations land on padding or values).
    assert!(refused > 5_000, "refused {refused}");
}

#[test]
fn semantic_limits() {
    let too_many = Request::BatchGet {
        bucket: "b".into(),
        items: (0..BATCH_ITEMS_MAX + 1)
            .map(|i| BatchItem {
                key: format!("k{i}"),
                ranges: vec![],
            })
            .collect(),
    };
    assert!(decode_request(Kind::BatchGet, &too_many.encode()).is_err());
    let empty = Request::BatchGet {
        bucket: "b".into(),
        items: vec![],
    };
    assert!(decode_request(Kind::BatchGet, &empty.encode()).is_err());
    let ranges = Request::Get {
        bucket: "b".into(),
        item: BatchItem {
            key: "k".into(),
            ranges: vec![Range::default(); RANGES_MAX as usize + 1],
        },
    };
    assert!(decode_request(Kind::Get, &ranges.encode()).is_err());
    let long_key = Request::Stat {
        bucket: "b".into(),
        key: "k".repeat(KEY_BYTES_MAX + 1),
    };
    assert!(decode_request(Kind::Stat, &long_key.encode()).is_err());
    let nul = Request::Stat {
        bucket: "b".into(),
        key: "a\0b".into(),
    };
    assert!(decode_request(Kind::Stat, &nul.encode()).is_err());
    // A request kind's header is not accepted as another kind's.
    let get = Request::Stat {
        bucket: "b".into(),
        key: "k".into(),
    }
    .encode();
    assert!(decode_server(Kind::Reply, b"").is_err());
    assert!(decode_request(Kind::Reply, &get).is_err());
    assert_eq!(
        decode_request(Kind::PutData, b""),
        Ok(Request::PutData { crc32c: None })
    );
}

#[test]
fn mac_binds_key_and_both_nonces() {
    let (sn, cn) = ([1u8; 32], [2u8; 32]);
    let m = client_mac("secret", "AK", &sn, &cn);
    assert!(mac_equal(&m, &client_mac("secret", "AK", &sn, &cn)));
    assert!(!mac_equal(&m, &client_mac("secreT", "AK", &sn, &cn)));
    assert!(!mac_equal(&m, &client_mac("secret", "AK2", &sn, &cn)));
    assert!(!mac_equal(&m, &client_mac("secret", "AK", &cn, &sn)));
    assert!(!mac_equal(&m, &m[..31]));
    assert_ne!(server_proof("secret", &sn, &cn), m);
}

#[test]
fn fuzz_corpus_replays_clean() {
    // The committed corpus of fuzz/ (cargo fuzz run native_frame), replayed
    // on stable so CI checks it without nightly.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/native_frame");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/native_frame") {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        fuzz_decode(&data);
        n += 1;
    }
    assert!(n > 50, "only {n} corpus files");
    // And seeds that decode: every message kind, well formed.
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..200 {
        let r = random_request(&mut rng);
        let mut d = vec![r.kind() as u8];
        d.extend(r.encode());
        fuzz_decode(&d);
    }
}
