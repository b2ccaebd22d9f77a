//! Round trips, bit flips and placement binding of record headers.

use super::*;

const KEY: SegKey = SegKey {
    version: VERSION,
    shard_secret: 0x5eed_5eed,
    segment_id: 3,
};

fn object(payload: &[u8]) -> Header {
    Header {
        seq: 42,
        bucket: "b".into(),
        key: "dir/k ü".into(),
        payload_bytes: payload.len() as u64,
        block_crcs: block_crcs(payload),
        body: Body::Object {
            meta: ObjectMeta {
                size_bytes: payload.len() as u64,
                etag: "0123456789abcdef0123456789abcdef".into(),
                mtime_ms: 1_700_000_000_000,
                content_type: "text/plain".into(),
                headers: vec![("x-amz-meta-a".into(), "1".into())],
            },
            extents: vec![ExtentRef {
                segment_id: 3,
                record_offset: 8192,
                header_bytes: 77,
                payload_bytes: 9,
            }],
        },
    }
}

#[test]
fn round_trip_every_kind() {
    let payload = vec![7u8; 200_000];
    let bodies = [
        object(&payload).body,
        Body::Extent {
            object_offset: 1 << 20,
        },
        Body::Tombstone { mtime_ms: 5 },
        Body::Bucket { created_ms: 6 },
        Body::BucketDelete { mtime_ms: 7 },
        Body::Seal,
        Body::SegmentHeader {
            shard_id: 3,
            segment_id: 9,
            created_ms: 11,
            shard_secret: 0xfeed,
        },
    ];
    for body in bodies {
        let mut h = object(&payload);
        h.body = body;
        let bytes = encode_header_at(&h, &KEY, 4096).unwrap();
        let (decoded, len) = decode_header(&bytes, &KEY, 4096).unwrap();
        assert_eq!(len, bytes.len());
        assert_eq!(decoded, h);
        assert!(verify_blocks(&decoded.block_crcs, BLOCK_BYTES, 0, &payload));
        assert!(verify_blocks(
            &decoded.block_crcs,
            BLOCK_BYTES,
            2,
            &payload[2 * BLOCK_BYTES as usize..]
        ));
    }
}

#[test]
fn every_flipped_bit_is_detected() {
    let bytes = encode_header_at(&object(b"hello"), &KEY, 8192).unwrap();
    for bit in 0..bytes.len() * 8 {
        let mut bad = bytes.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(
            decode_header(&bad, &KEY, 8192).is_err(),
            "bit {bit} flip went unnoticed"
        );
    }
}

#[test]
fn a_header_verifies_only_where_it_was_bound() {
    let bytes = encode_header_at(&object(b"hello"), &KEY, 8192).unwrap();
    assert!(decode_header(&bytes, &KEY, 8192).is_ok());
    // Elsewhere in the segment, in another segment, under another secret.
    assert_eq!(
        decode_header(&bytes, &KEY, 8200),
        Err(DecodeError::HeaderCrc)
    );
    let other = SegKey::v2(KEY.shard_secret, KEY.segment_id + 1);
    assert_eq!(
        decode_header(&bytes, &other, 8192),
        Err(DecodeError::HeaderCrc)
    );
    let stranger = SegKey::v2(KEY.shard_secret ^ 1, KEY.segment_id);
    assert_eq!(
        decode_header(&bytes, &stranger, 8192),
        Err(DecodeError::HeaderCrc)
    );
    // A version-1 header (CRC over the header alone, as a user could
    // compute it) is refused in a version-2 segment, and vice versa.
    let mut v1 = encode_header(&object(b"hello")).unwrap();
    bind_header(&mut v1, &SegKey::v1(KEY.segment_id), 0);
    assert!(decode_header(&v1, &SegKey::v1(KEY.segment_id), 123).is_ok());
    assert_eq!(
        decode_header(&v1, &KEY, 8192),
        Err(DecodeError::BadVersion(1))
    );
    assert_eq!(
        decode_header(&bytes, &SegKey::v1(KEY.segment_id), 8192),
        Err(DecodeError::BadVersion(2))
    );
}

#[test]
fn segment_header_carries_its_key() {
    let h = Header {
        seq: 0,
        bucket: String::new(),
        key: String::new(),
        payload_bytes: 0,
        block_crcs: Vec::new(),
        body: Body::SegmentHeader {
            shard_id: 1,
            segment_id: 7,
            created_ms: 5,
            shard_secret: 0xabcdef,
        },
    };
    let key = SegKey::v2(0xabcdef, 7);
    let bytes = encode_header_at(&h, &key, 0).unwrap();
    let (decoded, _, got) = decode_segment_header(&bytes, 7).unwrap();
    assert_eq!((decoded, got), (h, key));
    assert!(
        decode_segment_header(&bytes, 8).is_err(),
        "bound to its segment id"
    );
}

#[test]
fn payload_corruption_is_detected() {
    let mut payload = vec![1u8; 3 * BLOCK_BYTES as usize + 10];
    let crcs = block_crcs(&payload);
    payload[BLOCK_BYTES as usize + 5] ^= 0x10;
    assert!(!verify_blocks(&crcs, BLOCK_BYTES, 0, &payload));
    assert!(verify_blocks(
        &crcs,
        BLOCK_BYTES,
        0,
        &payload[..BLOCK_BYTES as usize]
    ));
    assert!(!verify_blocks(
        &crcs,
        BLOCK_BYTES,
        1,
        &payload[BLOCK_BYTES as usize..2 * BLOCK_BYTES as usize]
    ));
    assert!(
        !verify_blocks(&crcs, BLOCK_BYTES, 5, &payload[..10]),
        "block index past the end must fail"
    );
}

#[test]
fn short_padding_and_garbage() {
    let bytes = encode_header_at(&object(b"x"), &KEY, 0).unwrap();
    assert_eq!(
        decode_header(&bytes[..10], &KEY, 0),
        Err(DecodeError::Short(FIXED_HEADER_BYTES))
    );
    assert_eq!(
        decode_header(&bytes[..40], &KEY, 0),
        Err(DecodeError::Short(bytes.len()))
    );
    assert_eq!(
        decode_header(&[0u8; 64], &KEY, 0),
        Err(DecodeError::Padding)
    );
    assert!(matches!(
        decode_header(&[0xffu8; 64], &KEY, 0),
        Err(DecodeError::BadMagic(_))
    ));
}

#[test]
fn oversized_fields_are_refused() {
    let mut h = object(b"");
    h.key = "k".repeat(KEY_BYTES_MAX + 1);
    assert_eq!(encode_header(&h), Err(EncodeError::FieldTooLong("key")));
}

/// The block size follows from the stored count: 4 KiB for records written
/// now, 64 KiB for data format 2; a count of neither is malformed.
#[test]
fn block_size_follows_from_the_block_count() {
    assert_eq!(block_bytes(0, 0), BLOCK_BYTES);
    assert_eq!(block_bytes(4096, 1), BLOCK_BYTES);
    assert_eq!(block_bytes(70_000, 18), BLOCK_BYTES);
    assert_eq!(block_bytes(70_000, 2), LEGACY_BLOCK_BYTES);
    // Every size over 4 KiB tells the two apart.
    for n in [4097u64, 65_536, 65_537, 1 << 20, (1 << 20) + 1] {
        assert_ne!(
            n.div_ceil(BLOCK_BYTES),
            n.div_ceil(LEGACY_BLOCK_BYTES),
            "{n}"
        );
    }
    let payload = vec![7u8; 70_000];
    let mut legacy = object(&payload);
    legacy.block_crcs = payload
        .chunks(LEGACY_BLOCK_BYTES as usize)
        .map(crc32c::crc32c)
        .collect();
    let bytes = encode_header_at(&legacy, &KEY, 4096).unwrap();
    let (back, _) = decode_header(&bytes, &KEY, 4096).unwrap();
    assert_eq!(back.block_bytes(), LEGACY_BLOCK_BYTES);
    assert!(verify_blocks(
        &back.block_crcs,
        LEGACY_BLOCK_BYTES,
        0,
        &payload
    ));
    assert!(!verify_blocks(&back.block_crcs, BLOCK_BYTES, 0, &payload));
    // 18 CRCs (4 KiB blocks of 70,000 bytes) for a payload of 1,000,000
    // bytes: neither 245 nor 16 blocks.
    let mut raw = encode_header(&object(&payload)).unwrap();
    raw[16..24].copy_from_slice(&1_000_000u64.to_le_bytes());
    assert_eq!(
        parse_header(&raw),
        Err(DecodeError::Malformed("block count does not match payload"))
    );
}
