//! Golden bytes of the on-disk record format (`store::record`).
//!
//! The store's round-trip tests pass whatever the format is; these pin the
//! bytes of one header of every kind, bound to a place in a version-2
//! segment (and one in a version-1 segment, and an extent of data format 2,
//! whose CRC blocks are 64 KiB), so that a change to the format fails here
//! and is made on purpose, with a new record version (or data format,
//! `boot::datadir::FORMAT_VERSION`) and a reader for the old one (data
//! directories outlive binaries).
//!
//! Each case checks both ways: encoding gives the golden bytes, and the
//! golden bytes decode (CRC checked) to the same header, and (version 2)
//! at that place only.
//!
//! To print the current bytes: `PERCORE_GOLDEN_PRINT=1 cargo test --release
//! -p percore-server --test golden_record -- --nocapture --test-threads 1`.

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use percore_server::store::record::{
    self, block_crcs, decode_header, encode_header_at, Body, ExtentRef, Header, ObjectMeta, SegKey,
};

const SECRET: u64 = 0x0123_4567_89AB_CDEF;
const SEGMENT: u64 = 42;
const OFFSET: u64 = 8192;

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

fn keyed(bucket: &str, key: &str, seq: u64, payload: &[u8], body: Body) -> Header {
    Header {
        seq,
        bucket: bucket.into(),
        key: key.into(),
        payload_bytes: payload.len() as u64,
        block_crcs: block_crcs(payload),
        body,
    }
}

fn meta() -> ObjectMeta {
    ObjectMeta {
        size_bytes: 5,
        etag: "5d41402abc4b2a76b9719d911017c592".into(),
        mtime_ms: 1_700_000_000_123,
        content_type: "text/plain".into(),
        headers: vec![
            ("cache-control".into(), "no-cache".into()),
            ("x-amz-meta-owner".into(), "golden".into()),
        ],
    }
}

/// (name, header, segment key, golden hex).
fn cases() -> Vec<(&'static str, Header, SegKey, &'static str)> {
    let v2 = SegKey::v2(SECRET, SEGMENT);
    let v1 = SegKey::v1(SEGMENT);
    vec![
        (
            "segment header",
            Header::segment_record(Body::SegmentHeader {
                shard_id: 3,
                segment_id: SEGMENT,
                created_ms: 1_700_000_000_000,
                shard_secret: SECRET,
            }),
            v2,
            GOLDEN_SEGMENT_HEADER,
        ),
        (
            "inline object",
            keyed(
                "bkt",
                "dir/hello.txt",
                7,
                b"hello",
                Body::Object {
                    meta: meta(),
                    extents: vec![],
                },
            ),
            v2,
            GOLDEN_INLINE_OBJECT,
        ),
        (
            "object with extents",
            keyed(
                "bkt",
                "big",
                8,
                b"",
                Body::Object {
                    meta: ObjectMeta {
                        size_bytes: 3 << 20,
                        etag: "0123456789abcdef0123456789abcdef-2".into(),
                        mtime_ms: 1_700_000_000_456,
                        content_type: String::new(),
                        headers: vec![],
                    },
                    extents: vec![
                        ExtentRef {
                            segment_id: 40,
                            record_offset: 4096,
                            header_bytes: 96,
                            payload_bytes: 2 << 20,
                        },
                        ExtentRef {
                            segment_id: 41,
                            record_offset: 0x10_0000,
                            header_bytes: 96,
                            payload_bytes: 1 << 20,
                        },
                    ],
                },
            ),
            v2,
            GOLDEN_OBJECT_WITH_EXTENTS,
        ),
        (
            "extent, data format 2 (64 KiB CRC blocks, still read)",
            Header {
                block_crcs: [0xA5u8; 70_000]
                    .chunks(64 * 1024)
                    .map(crc32c::crc32c)
                    .collect(),
                ..keyed(
                    "bkt",
                    "big",
                    9,
                    &[0xA5; 70_000],
                    Body::Extent {
                        object_offset: 1 << 20,
                    },
                )
            },
            v2,
            GOLDEN_EXTENT_64K_BLOCKS,
        ),
        (
            "extent",
            keyed(
                "bkt",
                "big",
                9,
                &[0xA5; 70_000],
                Body::Extent {
                    object_offset: 1 << 20,
                },
            ),
            v2,
            GOLDEN_EXTENT,
        ),
        (
            "tombstone",
            keyed(
                "bkt",
                "gone",
                10,
                b"",
                Body::Tombstone {
                    mtime_ms: 1_700_000_001_000,
                },
            ),
            v2,
            GOLDEN_TOMBSTONE,
        ),
        (
            "bucket",
            keyed(
                "bkt",
                "",
                11,
                b"",
                Body::Bucket {
                    created_ms: 1_700_000_002_000,
                },
            ),
            v2,
            GOLDEN_BUCKET,
        ),
        (
            "bucket delete",
            keyed(
                "bkt",
                "",
                12,
                b"",
                Body::BucketDelete {
                    mtime_ms: 1_700_000_003_000,
                },
            ),
            v2,
            GOLDEN_BUCKET_DELETE,
        ),
        ("seal", Header::segment_record(Body::Seal), v2, GOLDEN_SEAL),
        (
            "seal in a version-1 segment",
            Header::segment_record(Body::Seal),
            v1,
            GOLDEN_SEAL_V1,
        ),
    ]
}

#[test]
fn record_headers_are_pinned() {
    let print = std::env::var_os("PERCORE_GOLDEN_PRINT").is_some();
    for (name, header, key, golden) in cases() {
        let bytes = encode_header_at(&header, &key, OFFSET).unwrap();
        if print {
            println!("{name}: {}", hex(&bytes));
            continue;
        }
        assert_eq!(
            hex(&bytes),
            hex(&unhex(golden)),
            "{name}: the record encoding changed; if on purpose, bump record::VERSION, keep a \
             reader for the old version and update the golden bytes"
        );
        let golden = unhex(golden);
        let (back, used) = decode_header(&golden, &key, OFFSET).unwrap();
        assert_eq!(used, golden.len(), "{name}");
        assert_eq!(
            back, header,
            "{name}: the golden bytes no longer decode to it"
        );
        // From version 2 a header is bound to its place (version 1 headers
        // carry a plain CRC32C and are not).
        if key.version == record::VERSION {
            assert!(
                decode_header(&golden, &key, OFFSET + record::RECORD_ALIGN_BYTES).is_err(),
                "{name}: valid at another offset"
            );
            let other = SegKey::v2(SECRET ^ 1, SEGMENT);
            assert!(
                decode_header(&golden, &other, OFFSET).is_err(),
                "{name}: valid under another secret"
            );
        }
    }
}

const GOLDEN_SEGMENT_HEADER: &str = "5050435202070000440000008112102300000000000000000000000000000000 0000000000000000030000002a000000000000000068e5cf8b010000efcdab89 67452301";
const GOLDEN_INLINE_OBJECT: &str = "5050435202010000b3000000a0ec6e2b05000000000000000700000000000000 0300626b740d006469722f68656c6c6f2e747874010000004cbb719a05000000 000000007b68e5cf8b0100002000356434313430326162633462326137366239 37313964393131303137633539320a00746578742f706c61696e02000d006361 6368652d636f6e74726f6c08006e6f2d63616368651000782d616d7a2d6d6574 612d6f776e65720600676f6c64656e00000000";
const GOLDEN_OBJECT_WITH_EXTENTS: &str = "5050435202010000a20000009972ee1b00000000000000000800000000000000 0300626b740300626967000000000000300000000000c869e5cf8b0100002200 3031323334353637383961626364656630313233343536373839616263646566 2d32000000000200000028000000000000000010000000000000600000000000 2000000000002900000000000000000010000000000060000000000010000000 0000";
const GOLDEN_EXTENT: &str = "50504352020200007e000000ec3e814a70110100000000000900000000000000 0300626b74030062696712000000d333c98ad333c98ad333c98ad333c98ad333 c98ad333c98ad333c98ad333c98ad333c98ad333c98ad333c98ad333c98ad333 c98ad333c98ad333c98ad333c98ad333c98a94d0d0d00000100000000000";
const GOLDEN_EXTENT_64K_BLOCKS: &str = "50504352020200003e000000c51678ab70110100000000000900000000000000 0300626b74030062696702000000e5f4d45a479c868f0000100000000000";
const GOLDEN_TOMBSTONE: &str = "50504352020300003700000025e8aa6000000000000000000a00000000000000 0300626b740400676f6e6500000000e86be5cf8b010000";
const GOLDEN_BUCKET: &str = "5050435202040000330000001dabf2fc00000000000000000b00000000000000 0300626b74000000000000d06fe5cf8b010000";
const GOLDEN_BUCKET_DELETE: &str = "5050435202050000330000008711218200000000000000000c00000000000000 0300626b74000000000000b873e5cf8b010000";
const GOLDEN_SEAL: &str =
    "505043520206000028000000e539d9fd00000000000000000000000000000000 0000000000000000";
const GOLDEN_SEAL_V1: &str =
    "505043520106000028000000c0e177da00000000000000000000000000000000 0000000000000000";
