//! Golden bytes of the native wire format.
//!
//! The round-trip tests in `src/native/tests.rs` pass whatever the format
//! is; these pin the bytes themselves, so that a change to the frame header
//! or to a message's encoding fails here and is made on purpose (with a new
//! protocol version when old peers cannot read it).
//!
//! Two checks per message: the golden bytes decode to the expected message
//! (what an old peer sends, we still read), and encoding the message gives
//! the golden bytes (what we send, an old peer reads). Messages are
//! flatbuffers: a flatbuffers upgrade may lay a table out differently but
//! compatibly; then the decode check still passes, and the golden encoding
//! is updated deliberately.
//!
//! To print the current bytes: `PERCORE_GOLDEN_PRINT=1 cargo test -p
//! percore-protocol --test golden -- --nocapture`.

use percore_protocol::native::{
    self as proto, BatchItem, ChunkHead, FrameHeader, Hello, Kind, PutRequest, Range, Request,
    ServerMessage,
};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Compares `got` with `golden` (hex, whitespace ignored), or prints it.
fn check(name: &str, got: &[u8], golden: &str) {
    if std::env::var_os("PERCORE_GOLDEN_PRINT").is_some() {
        println!("{name}: {}", hex(got));
        return;
    }
    assert_eq!(
        hex(got),
        hex(&unhex(golden)),
        "{name}: the encoding changed; if on purpose, bump the protocol version where \
         old peers cannot read it, and update the golden bytes"
    );
}

#[test]
fn frame_header_bytes_are_pinned() {
    let fh = FrameHeader {
        kind: Kind::Get,
        flags: proto::FLAG_MORE,
        request_id: 0x0102_0304_0506_0708,
        header_len: 0x1122,
        payload_len: 0x0033_4455,
    };
    // magic "PCN1", version, kind, flags LE, request id LE, header len LE,
    // payload len LE: 24 bytes.
    let golden = format!(
        "50434e31 01 {:02x} 0100 0807060504030201 22110000 55443300",
        Kind::Get as u8
    );
    check("frame header", &fh.encode(), &golden);
    let back = FrameHeader::decode(&unhex(&golden).try_into().unwrap()).unwrap();
    assert_eq!(back, fh);
}

#[test]
fn kind_numbers_are_pinned() {
    // The kind byte of every message: renumbering one breaks every peer.
    let kinds: Vec<(u8, &str)> = (0..=255u8)
        .filter_map(|v| Kind::from_u8(v).map(|k| (v, k.name())))
        .collect();
    let got = format!("{kinds:?}");
    if std::env::var_os("PERCORE_GOLDEN_PRINT").is_some() {
        println!("kinds: {got}");
        return;
    }
    assert_eq!(got, KINDS_GOLDEN);
}

const KINDS_GOLDEN: &str = "[(1, \"Hello\"), (2, \"Get\"), (3, \"BatchGet\"), (4, \"Put\"), (5, \"PutData\"), (6, \"Delete\"), (7, \"Stat\"), (8, \"List\"), (9, \"CreateBucket\"), (10, \"ListBuckets\"), (11, \"ClusterMap\"), (128, \"Challenge\"), (129, \"HelloOk\"), (130, \"ItemHead\"), (131, \"Chunk\"), (132, \"Reply\")]";

fn requests() -> Vec<(&'static str, Request, &'static str)> {
    vec![
        (
            "hello",
            Request::Hello(Hello {
                version: 1,
                access_key: "AKIDEXAMPLE".into(),
                client_nonce: vec![7; proto::NONCE_BYTES],
                mac: vec![9; 32],
                client_name: "golden".into(),
            }),
            GOLDEN_HELLO,
        ),
        (
            "get",
            Request::Get {
                bucket: "bkt".into(),
                item: BatchItem {
                    key: "a/b.bin".into(),
                    ranges: vec![Range {
                        offset: 4096,
                        length: 65536,
                    }],
                },
            },
            GOLDEN_GET,
        ),
        (
            "put",
            Request::Put(PutRequest {
                bucket: "bkt".into(),
                key: "k".into(),
                size: 1 << 20,
                content_type: "application/octet-stream".into(),
                crc32c: Some(0xDEAD_BEEF),
            }),
            GOLDEN_PUT,
        ),
        (
            "delete",
            Request::Delete {
                bucket: "bkt".into(),
                key: "k".into(),
            },
            GOLDEN_DELETE,
        ),
    ]
}

#[test]
fn request_encodings_are_pinned() {
    for (name, req, golden) in requests() {
        let bytes = req.encode();
        check(name, &bytes, golden);
        if std::env::var_os("PERCORE_GOLDEN_PRINT").is_none() {
            let decoded = proto::decode_request(req.kind(), &unhex(golden)).unwrap();
            assert_eq!(
                decoded, req,
                "{name}: the golden bytes no longer decode to it"
            );
        }
    }
}

#[test]
fn server_message_encodings_are_pinned() {
    let chunk = ServerMessage::Chunk(ChunkHead {
        item: 2,
        range: 1,
        offset: 8192,
        crc32c: 0x0BAD_F00D,
    });
    let reply = ServerMessage::Reply(proto::Reply {
        size: 12345,
        etag: "0123456789abcdef0123456789abcdef".into(),
        mtime_ms: 1_700_000_000_000,
        content_type: "text/plain".into(),
        crc32c: 42,
        ..proto::Reply::default()
    });
    for (name, msg, golden) in [
        ("chunk", chunk, GOLDEN_CHUNK),
        ("reply", reply, GOLDEN_REPLY),
    ] {
        let bytes = msg.encode();
        check(name, &bytes, golden);
        if std::env::var_os("PERCORE_GOLDEN_PRINT").is_none() {
            let decoded = proto::decode_server(msg.kind(), &unhex(golden)).unwrap();
            assert_eq!(
                decoded, msg,
                "{name}: the golden bytes no longer decode to it"
            );
        }
    }
}

const GOLDEN_HELLO: &str = "1400000000000e001800070008000c00100014000e0000000000000164000000 3c000000140000000400000006000000676f6c64656e00002000000009090909 0909090909090909090909090909090909090909090909090909090920000000 0707070707070707070707070707070707070707070707070707070707070707 0b000000414b49444558414d504c4500";
const GOLDEN_GET: &str = "140000000000000000000a001000040008000c000a0000003000000020000000 0400000001000000001000000000000000000100000000000000000007000000 612f622e62696e0003000000626b7400";
const GOLDEN_PUT: &str = "1400000000000e001c000400080014000c0010000e0000004000000034000000 10000000efbeadde0000100000000000180000006170706c69636174696f6e2f 6f637465742d73747265616d00000000010000006b00000003000000626b7400";
const GOLDEN_DELETE: &str =
    "0c00000008000c0004000800080000001000000004000000010000006b000000 03000000626b7400";
const GOLDEN_CHUNK: &str =
    "100000000c0018000400080010000c000c00000002000000010000000df0ad0b 0020000000000000";
const GOLDEN_REPLY: &str = "180000001400200000000000000010000400180008000c00140000002c000000 180000002a00000039300000000000000068e5cf8b0100000a00000074657874 2f706c61696e0000200000003031323334353637383961626364656630313233 34353637383961626364656600000000";
