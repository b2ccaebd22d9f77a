//! Fuzz properties, one per cargo-fuzz target in `fuzz/fuzz_targets/`.
//!
//! Each function takes arbitrary bytes, runs one parser of untrusted input
//! and checks what must hold: no panic, every bound respected, and where an
//! encoder exists, decode-then-encode gives the same bytes back. They live
//! in the library (not in fuzz/) so that a stable unit test replays every
//! committed corpus file in CI (`fuzz_corpora_replay_clean` below).
//!
//! The parsers covered: HTTP request heads and chunked bodies
//! ([`http_request`]), the S3 router's path and query decoding and the
//! `Range` header ([`s3_route`]), SigV4 header and presigned-query auth
//! ([`sigv4_auth`]), aws-chunked bodies ([`aws_chunked`]), XML request
//! bodies ([`xml_body`]) and on-disk record headers ([`record_header`]).
//! The native protocol's decoders are in `percore_protocol::native::fuzz_decode`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::frontend::http::{parse_range, BodyFraming, Limits, RangeSpec};
use crate::frontend::s3::auth::{self as sigv4, AuthInput, HeaderView, PayloadMode, Verified};
use crate::store::record;

/// Splits `data` at the first occurrence of `sep` (or at the end).
fn split_at_byte(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// An HTTP/1.1 request as the connection layer sees it: the head through
/// httparse and our framing rules, then the body through the chunked (or
/// length) state machine, fed in pieces whose sizes come from the input.
pub fn http_request(data: &[u8]) {
    let Some((&split_seed, data)) = data.split_first() else {
        return;
    };
    let limits = Limits::default();
    // The head as the connection finds it: whole, and again as reads would
    // deliver it (growing windows, the terminator scan carried across them);
    // both must agree, and the head is exactly its own bytes.
    let whole = crate::frontend::http::next_head(data, &mut 0, &limits);
    let step = usize::from(split_seed % 13) + 1;
    let (mut scan_from, mut avail) = (0usize, 0usize);
    let pieces = loop {
        avail = (avail + step).min(data.len());
        let r = crate::frontend::http::next_head(&data[..avail], &mut scan_from, &limits);
        assert!(scan_from <= avail);
        if !matches!(r, Ok(None)) || avail == data.len() {
            break r;
        }
    };
    let (head, used) = match (whole, pieces) {
        (Ok(Some((head, used))), Ok(Some((head2, used2)))) => {
            assert_eq!((&head, used), (&head2, used2), "pieces disagree with whole");
            assert!(used <= data.len());
            let again = crate::frontend::http::parse_head(&data[..used], &limits);
            assert!(matches!(again, Ok(Some((ref h, u))) if *h == head && u == used));
            (head, used)
        }
        (Ok(None), Ok(None)) | (Err(_), Err(_)) => return,
        (whole, pieces) => panic!(
            "whole: {:?}, in pieces: {:?}",
            whole.map(|o| o.map(|(_, n)| n)),
            pieces.map(|o| o.map(|(_, n)| n))
        ),
    };
    let _ = head.keep_alive();
    let _ = head.expects_continue();
    let _ = head.content_length();
    let framing = match head.body_framing() {
        Ok(f) => f,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let rest = &data[used..];
    let line_max = 64 + usize::from(split_seed);
    let mut body = crate::frontend::http::BodyState::new(framing, line_max, 1024);
    // Feed `rest` in growing windows, as reads would deliver it.
    let piece = usize::from(split_seed % 17) + 1;
    let (mut pos, mut avail, mut decoded) = (0usize, 0usize, 0u64);
    let mut steps = 0usize;
    loop {
        steps += 1;
        assert!(steps < 4 * rest.len() + 16, "body decoder made no progress");
        let window = &rest[pos..avail];
        match body.step(window) {
            Err(e) => {
                let _ = e.to_string();
                return;
            }
            Ok(crate::frontend::http::Step::Framing { consumed_bytes }) => {
                assert!(consumed_bytes > 0 && consumed_bytes <= window.len());
                pos += consumed_bytes;
            }
            Ok(crate::frontend::http::Step::NeedMore) => {
                if avail == rest.len() {
                    return; // the client stopped sending
                }
                avail = (avail + piece).min(rest.len());
            }
            Ok(crate::frontend::http::Step::Done { consumed_bytes }) => {
                assert!(consumed_bytes <= window.len());
                if let BodyFraming::Length(n) = framing {
                    assert_eq!(decoded, n);
                }
                return;
            }
            Ok(crate::frontend::http::Step::Data { remaining_bytes }) => {
                assert!(remaining_bytes > 0);
                if window.is_empty() {
                    if avail == rest.len() {
                        return;
                    }
                    avail = (avail + piece).min(rest.len());
                    continue;
                }
                let take = (window.len() as u64).min(remaining_bytes) as usize;
                body.data_consumed(take);
                pos += take;
                decoded += take as u64;
            }
        }
    }
}

/// The S3 router's view of a request target and its `Range` header: path
/// split into bucket and key and percent-decoded, query decoded, and the
/// range interpreted against an object size taken from the input.
pub fn s3_route(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let size = u64::from_le_bytes(data[..8].try_into().unwrap()) >> (data[0] % 64);
    let (target, range) = split_at_byte(&data[8..], b'\n');
    let target = String::from_utf8_lossy(target);
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    route_ops(path, query);
    match parse_range(range, size) {
        Ok(RangeSpec::Whole) | Err(_) => {}
        Ok(RangeSpec::Single(start, end)) => {
            assert!(start <= end && end < size, "{start}-{end}/{size}");
            let _ = crate::frontend::http::content_range(start, end, size);
        }
        Ok(RangeSpec::Multi(ranges)) => {
            assert!(ranges.len() >= 2 && ranges.len() <= crate::frontend::http::RANGES_COUNT_MAX);
            for (start, end) in ranges {
                assert!(start <= end && end < size, "{start}-{end}/{size}");
            }
        }
    }
}

/// The router on a raw target: whatever decodes, every method names an
/// operation, and a target with no escapes names the same one whether it
/// is read decoded or raw (the path `route` takes for refused targets).
fn route_ops(path: &str, query: &str) {
    use crate::frontend::s3::route::{route_target, S3Op};
    let decoded = route_target(path, query);
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let (bucket_raw, key_raw) = trimmed.split_once('/').unwrap_or((trimmed, ""));
    let raw_query: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    for method in ["GET", "PUT", "HEAD", "POST", "DELETE", "PATCH"] {
        for copy in [false, true] {
            let raw = S3Op::classify(
                method,
                !bucket_raw.is_empty(),
                !key_raw.is_empty(),
                &raw_query,
                copy,
            );
            assert!(S3Op::ALL.contains(&raw));
            let Ok(t) = &decoded else { continue };
            let q: Vec<(&str, &str)> = t
                .query
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            let op = S3Op::classify(method, !t.bucket.is_empty(), !t.key.is_empty(), &q, copy);
            if !path.contains('%') && !query.contains('%') {
                assert_eq!(op, raw, "{method} {path}?{query}");
            }
        }
    }
}

/// A request's auth inputs from lines of the input: method, path, query,
/// then `name: value` header lines. Checked against one key pair at a fixed
/// clock; whatever the outcome, its S3 code and status must exist.
pub fn sigv4_auth(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let method = lines.next().unwrap_or("");
    let raw_path = lines.next().unwrap_or("");
    let raw_query = lines.next().unwrap_or("");
    let owned: Vec<(&str, &str)> = lines.take(64).filter_map(|l| l.split_once(':')).collect();
    let headers: Vec<HeaderView> = owned
        .iter()
        .map(|(n, v)| HeaderView {
            name: n,
            value: v.trim_start().as_bytes(),
        })
        .collect();
    let input = AuthInput {
        method,
        raw_path,
        raw_query,
        headers: &headers,
        virtual_bucket: None,
    };
    let lookup = |ak: &str| (ak == "AKIDEXAMPLE").then(|| "secret".to_string());
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    match sigv4::verify(&input, &lookup, now, Duration::from_secs(900)) {
        Ok(v) => {
            // Forging a signature is not something a fuzzer can do; only a
            // corpus entry signed for this key and clock gets here.
            assert_eq!(v.access_key, "AKIDEXAMPLE");
        }
        Err(e) => {
            assert!(!e.s3_code().is_empty());
            assert!((400..600).contains(&e.http_status()));
            let _ = e.message();
        }
    }
    let _ = SystemTime::now();
}

/// The signing property behind presigned URLs: a request correctly signed
/// (header auth or a presigned query, chosen by the input) stays accepted
/// with unsigned headers added that are not `x-amz-*`, and is refused once
/// any `x-amz-*` header it did not sign is added, in any case and at any
/// position (403 AccessDenied). The one exception: under query auth, a
/// header that repeats exactly a value the query signed (x-amz-date,
/// x-amz-content-sha256). The request is signed here by an independent
/// minimal signer (unreserved characters only, so canonical forms are
/// trivial), not by the code under test.
// One property, read top to bottom: sign, tamper, check.
#[allow(clippy::too_many_lines)]
pub fn sigv4_unsigned_headers(data: &[u8]) {
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};
    fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
        mac.update(msg);
        mac.finalize().into_bytes().to_vec()
    }
    fn pick(byte: u8, alphabet: &[u8]) -> char {
        alphabet[usize::from(byte) % alphabet.len()] as char
    }
    const LOWER: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    const NAME: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
    const SIGNABLE: [(&str, &str); 5] = [
        ("content-type", "text/plain"),
        ("range", "bytes=0-9"),
        ("x-amz-copy-source", "/src/obj"),
        ("x-amz-meta-a", "v"),
        ("x-amz-metadata-directive", "COPY"),
    ];
    const DATE: &str = "20231114T221320Z"; // 1_700_000_000
    const SCOPE: &str = "20231114/us-east-1/s3/aws4_request";
    const SECRET: &str = "secret";

    let mut bytes = data.iter().copied();
    let mut next = || bytes.next().unwrap_or(0);
    let (flags, signed_bits, position, name_len, name_mode) =
        (next(), next(), next(), next(), next());
    let query_auth = flags & 1 == 1;
    let method = ["GET", "PUT", "HEAD", "POST", "DELETE"][usize::from(flags >> 1) % 5];
    let key: String = (0..(flags >> 4)).map(|_| pick(next(), LOWER)).collect();
    let path = format!("/b/{key}");

    let mut headers: Vec<(String, String)> = vec![("host".into(), "localhost:9000".into())];
    let payload = "UNSIGNED-PAYLOAD";
    if !query_auth {
        headers.push(("x-amz-content-sha256".into(), payload.into()));
        headers.push(("x-amz-date".into(), DATE.into()));
    }
    for (i, (name, value)) in SIGNABLE.iter().enumerate() {
        if signed_bits >> i & 1 == 1 {
            headers.push((name.to_string(), value.to_string()));
        }
    }
    headers.sort();
    let signed: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
    let signed = signed.join(";");
    let mut query: Vec<(String, String)> = Vec::new();
    if query_auth {
        query = vec![
            ("X-Amz-Algorithm".into(), "AWS4-HMAC-SHA256".into()),
            (
                "X-Amz-Credential".into(),
                format!("AKIDEXAMPLE%2F{}", SCOPE.replace('/', "%2F")),
            ),
            ("X-Amz-Date".into(), DATE.into()),
            ("X-Amz-Expires".into(), "600".into()),
            ("X-Amz-SignedHeaders".into(), signed.replace(';', "%3B")),
        ];
    }
    let canonical_query: Vec<String> = query.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let canonical = format!(
        "{method}\n{path}\n{}\n{canonical_headers}\n{signed}\n{payload}",
        canonical_query.join("&")
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{DATE}\n{SCOPE}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut k = hmac(format!("AWS4{SECRET}").as_bytes(), b"20231114");
    for part in ["us-east-1", "s3", "aws4_request"] {
        k = hmac(&k, part.as_bytes());
    }
    let signature = hex::encode(hmac(&k, to_sign.as_bytes()));
    let mut raw_query = canonical_query.join("&");
    if query_auth {
        raw_query.push_str(&format!("&X-Amz-Signature={signature}"));
    } else {
        headers.push((
            "Authorization".into(),
            format!("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{SCOPE}, SignedHeaders={signed}, Signature={signature}"),
        ));
    }

    let lookup = |ak: &str| (ak == "AKIDEXAMPLE").then(|| SECRET.to_string());
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let check = |headers: &[(String, String)]| {
        let views: Vec<HeaderView> = headers
            .iter()
            .map(|(n, v)| HeaderView {
                name: n,
                value: v.as_bytes(),
            })
            .collect();
        let input = AuthInput {
            method,
            raw_path: &path,
            raw_query: &raw_query,
            headers: &views,
            virtual_bucket: None,
        };
        sigv4::verify(&input, &lookup, now, Duration::from_secs(900))
    };
    check(&headers).expect("the signer and the verifier disagree");

    // The added header: a name from the input, or one the string-to-sign
    // covers, given the value that was signed.
    let at = usize::from(position) % (headers.len() + 1);
    let (name, value): (String, String) = match name_mode % 4 {
        0 => ("x-amz-date".into(), DATE.into()),
        1 => ("x-amz-content-sha256".into(), payload.into()),
        _ => {
            let suffix: String = (0..name_len % 24).map(|_| pick(next(), NAME)).collect();
            let value: String = (0..next() % 32).map(|_| pick(next(), LOWER)).collect();
            (format!("x-amz-{suffix}"), value)
        }
    };
    // Any spelling of the name (HTTP names are case-insensitive).
    let name: String = name
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if name_len >> (i % 8) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect();
    let mut harmless = headers.clone();
    harmless.insert(at, (format!("x-other-{}", name.len()), value.clone()));
    check(&harmless).expect("an unsigned header outside x-amz-* refused");

    let lower = name.to_ascii_lowercase();
    let already_present = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(&name));
    let repeats_signed = query_auth && name_mode % 4 < 2;
    let mut added = headers.clone();
    added.insert(at, (name.clone(), value));
    match check(&added) {
        Ok(_) => assert!(repeats_signed, "unsigned {name} accepted"),
        Err(e) if !already_present && !repeats_signed => {
            assert_eq!(e, sigv4::AuthError::UnsignedHeaders(lower));
            assert_eq!((e.s3_code(), e.http_status()), ("AccessDenied", 403));
        }
        // A second copy of a signed header changes the signed value (or is
        // refused as a duplicate): refused either way.
        Err(e) => assert!(!repeats_signed, "{name}: {e:?}"),
    }
}

/// An aws-chunked body in all three modes, fed whole and in two pieces:
/// the decoder is incremental, so both must decode the same bytes to the
/// same outcome.
pub fn aws_chunked(data: &[u8]) {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let mode = match seed % 3 {
        0 => PayloadMode::StreamingSigned,
        1 => PayloadMode::StreamingSignedTrailer,
        _ => PayloadMode::StreamingUnsignedTrailer,
    };
    let verified = Verified {
        principal: crate::access::Principal::Anonymous,
        access_key: "AKIDEXAMPLE".into(),
        payload: mode,
        signing_key: sigv4::signing_key("secret", "20231114", "us-east-1", "s3"),
        seed_signature: [7; 32],
        amz_date: "20231114T221320Z".into(),
        scope: "20231114/us-east-1/s3/aws4_request".into(),
        content_md5_signed: false,
    };
    let announced = (seed & 0x80 != 0).then_some(u64::from(seed & 0x3f));
    let run = |pieces: &[&[u8]]| {
        let mut d = sigv4::ChunkedDecoder::new(&mode, &verified, announced);
        let mut out = Vec::new();
        let mut consumed = 0usize;
        for p in pieces {
            match d.feed(p, &mut out) {
                Ok(n) => {
                    assert!(n <= p.len());
                    consumed += n;
                    if n < p.len() {
                        assert!(d.is_done(), "stopped early without finishing");
                        break;
                    }
                }
                Err(e) => return (Err(e), Vec::new(), 0),
            }
        }
        assert_eq!(d.decoded_bytes(), out.len() as u64);
        assert!(d.trailers().len() <= sigv4::TRAILERS_MAX + 1);
        (d.finish(), out, consumed)
    };
    let whole = run(&[body]);
    let cut = usize::from(seed).wrapping_mul(7919) % (body.len() + 1);
    let split = run(&[&body[..cut], &body[cut..]]);
    assert_eq!(
        whole.0.is_ok(),
        split.0.is_ok(),
        "{:?} vs {:?}",
        whole.0,
        split.0
    );
    if whole.0.is_ok() {
        assert_eq!(whole.1, split.1);
        assert_eq!(whole.2, split.2);
    }
}

/// XML request bodies: the parser and the three documents built on it
/// (CreateBucketConfiguration, CompleteMultipartUpload, Delete); then
/// escaping round-trips: any text we escape parses back to itself.
pub fn xml_body(data: &[u8]) {
    if let Ok(Some(root)) = crate::frontend::s3::xml::parse_xml(data) {
        fn depth(e: &crate::frontend::s3::xml::XmlElement) -> usize {
            1 + e.children.iter().map(depth).max().unwrap_or(0)
        }
        assert!(depth(&root) <= 32);
    }
    let _ = crate::frontend::s3::xml::parse_create_bucket(data);
    let _ = crate::frontend::s3::xml::parse_complete_multipart(data);
    let _ = crate::frontend::s3::xml::parse_delete(data);
    let text = String::from_utf8_lossy(data);
    let doc = format!("<a>{}</a>", crate::frontend::s3::xml::escape(&text));
    let root = crate::frontend::s3::xml::parse_xml(doc.as_bytes())
        .expect("escaped text parses")
        .expect("a root element");
    assert_eq!(root.text, text, "escape does not round-trip");
}

/// On-disk record headers. The stored CRC would stop a fuzzer at the first
/// check, so the input is also tried with its CRC recomputed for the place
/// it is decoded at (version 1 and version 2); a header that then decodes
/// must encode back to exactly the same bytes.
pub fn record_header(data: &[u8]) {
    const AT: u64 = 4096;
    let keys = [
        record::SegKey::v1(3),
        record::SegKey::v2(0x005e_ed0f_5eed, 3),
    ];
    for key in &keys {
        let mut buf = data.to_vec();
        if buf.len() >= record::FIXED_HEADER_BYTES {
            let n = (u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize).min(buf.len());
            if n >= record::FIXED_HEADER_BYTES {
                record::bind_header(&mut buf[..n], key, AT);
            }
        }
        for input in [data, &buf[..]] {
            let _ = record::peek_header_bytes(input);
            match record::decode_header(input, key, AT) {
                Ok((h, used)) => {
                    assert!(used <= input.len());
                    if key.version == record::VERSION_1 && h.kind() == record::Kind::SegmentHeader {
                        continue; // written in version 2's layout only
                    }
                    let again =
                        record::encode_header_at(&h, key, AT).expect("a decoded header re-encodes");
                    assert_eq!(again, &input[..used], "decode/encode is not the identity");
                    // Version 2 is bound to its place: anywhere else it fails.
                    if key.version == record::VERSION {
                        assert!(record::decode_header(input, key, AT + 8).is_err());
                    }
                }
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
    }
}

/// Bytes read off the front of a fuzz input; zeros once it runs out.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
}

/// Recovery's scan over a segment image built from the input: records as
/// the writer lays them out (batches on 4 KiB boundaries, records 8-byte
/// aligned, payloads that may hold planted headers: version 1 CRCs,
/// version 2 bound with a guessed secret, and real headers of this
/// segment copied to another place), then damage: holes of zeros, bytes
/// flipped, ranges overwritten, the file cut short. Property: every
/// record the scan returns is one the writer put exactly there (nothing
/// forged, nothing planted), and every record none of whose bytes were
/// damaged is returned.
// One property, read top to bottom: write, damage, scan, compare.
#[allow(clippy::too_many_lines)]
pub fn segment_scan(data: &[u8]) {
    use crate::store::scan;
    const SECRET: u64 = 0x0123_4567_89ab_cdef;
    let mut c = Choices(data);
    let segment_id = 1 + u64::from(c.u8() % 4);
    let key = record::SegKey::v2(SECRET, segment_id);
    let mut img = record::encode_header_at(
        &record::Header {
            seq: 0,
            bucket: String::new(),
            key: String::new(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body: record::Body::SegmentHeader {
                shard_id: 0,
                segment_id,
                created_ms: 1,
                shard_secret: SECRET,
            },
        },
        &key,
        0,
    )
    .unwrap();
    img.resize(4096, 0);
    // (offset, span, header) of each record written.
    let mut written: Vec<(u64, u64, record::Header)> = Vec::new();
    let records = 1 + c.u8() % 10;
    let mut real_headers: Vec<Vec<u8>> = Vec::new();
    for i in 0..records {
        if i > 0 && c.u8() % 3 == 0 {
            img.resize((img.len() as u64).next_multiple_of(4096) as usize, 0);
        }
        let offset = img.len() as u64;
        let len = usize::from(c.u16() % 9000);
        // Some payloads are zeros: after damage the scan must step through
        // them 8 bytes at a time, not jump to the next 4 KiB boundary.
        let zeros = c.u8() % 3 == 0;
        let mut payload: Vec<u8> = (0..len)
            .map(|j| if zeros { 0 } else { (j as u8) ^ c.u8() })
            .collect();
        let kind = c.u8();
        let h = record::Header {
            seq: u64::from(i) + 1,
            bucket: "b".into(),
            key: format!("k{}", kind % 5),
            payload_bytes: len as u64,
            block_crcs: Vec::new(),
            body: match kind % 3 {
                0 => record::Body::Extent { object_offset: 0 },
                1 => record::Body::Tombstone { mtime_ms: 5 },
                _ => record::Body::Object {
                    meta: record::ObjectMeta::default(),
                    extents: Vec::new(),
                },
            },
        };
        let mut h = if matches!(h.body, record::Body::Tombstone { .. }) {
            record::Header {
                payload_bytes: 0,
                ..h
            }
        } else {
            h
        };
        if h.payload_bytes == 0 {
            payload.clear();
        }
        h.block_crcs = record::block_crcs(&payload);
        let header = record::encode_header_at(&h, &key, offset).unwrap();
        let payload_at = offset + header.len() as u64;
        // Plant headers in the payload at 8-byte aligned places.
        let plants = c.u8() % 4;
        for _ in 0..plants {
            let at = (usize::from(c.u16()) % (payload.len().max(1))) & !7;
            let place = payload_at + at as u64;
            let fake = record::Header {
                seq: u64::MAX,
                bucket: "b".into(),
                key: "forged".into(),
                payload_bytes: 0,
                block_crcs: Vec::new(),
                body: record::Body::Tombstone { mtime_ms: 1 },
            };
            let bytes = match c.u8() % 3 {
                0 => {
                    record::encode_header_at(&fake, &record::SegKey::v1(segment_id), place).unwrap()
                }
                1 => record::encode_header_at(
                    &fake,
                    &record::SegKey::v2(c.u8().into(), segment_id),
                    place,
                )
                .unwrap(),
                _ => match real_headers.last() {
                    Some(real) => real.clone(),
                    None => continue,
                },
            };
            // (A misaligned payload start shifts `place` off 8: fine, the
            // scan must refuse it either way.)
            if at + bytes.len() <= payload.len() {
                payload[at..at + bytes.len()].copy_from_slice(&bytes);
            }
        }
        h.block_crcs = record::block_crcs(&payload);
        let header = record::encode_header_at(&h, &key, offset).unwrap();
        real_headers.push(header.clone());
        img.extend_from_slice(&header);
        img.extend_from_slice(&payload);
        img.resize((img.len() as u64).next_multiple_of(8) as usize, 0);
        written.push((offset, img.len() as u64 - offset, h));
    }
    if c.u8() % 2 == 0 {
        let at = (img.len() as u64).next_multiple_of(4096);
        img.resize(at as usize, 0);
        let seal = record::Header {
            seq: 0,
            bucket: String::new(),
            key: String::new(),
            payload_bytes: 0,
            block_crcs: Vec::new(),
            body: record::Body::Seal,
        };
        img.extend_from_slice(&record::encode_header_at(&seal, &key, at).unwrap());
        img.resize(img.len() + 4096 - img.len() % 4096, 0);
    }
    // Damage: (from, to) ranges whose bytes may differ from what was written.
    let mut damage: Vec<(u64, u64)> = Vec::new();
    for _ in 0..c.u8() % 4 {
        let len = img.len();
        let at = usize::from(c.u16()).wrapping_mul(7) % len;
        match c.u8() % 4 {
            0 => {
                // A lost 4 KiB-aligned write piece.
                let from = at & !4095;
                let to = (from + 4096 * (1 + usize::from(c.u8() % 3))).min(len);
                img[from..to].fill(0);
                damage.push((from as u64, to as u64));
            }
            1 => {
                img[at] ^= 1 << (c.u8() % 8);
                damage.push((at as u64, at as u64 + 1));
            }
            2 => {
                let to = (at + 1 + usize::from(c.u8())).min(len);
                img[at..to].fill(0xa5);
                damage.push((at as u64, to as u64));
            }
            _ => {
                img.truncate(at.max(1));
                damage.push((at as u64, u64::MAX));
            }
        }
    }
    let result = scan::scan_bytes(key, &img);
    for r in &result.records {
        if r.offset == 0 {
            continue; // the segment header
        }
        let w = written.iter().find(|w| w.0 == r.offset);
        let Some((_, _, h)) = w else {
            panic!(
                "record at {} was never written there: {:?}",
                r.offset, r.header
            );
        };
        assert_eq!(
            &r.header, h,
            "record at {} differs from what was written",
            r.offset
        );
    }
    let sealed_early = result.sealed && result.valid_end < img.len() as u64 - 4096;
    for (offset, span, h) in &written {
        let end = offset + span;
        let hit = damage.iter().any(|(a, b)| *a < end && *b > *offset);
        if hit || sealed_early {
            continue;
        }
        assert!(
            result.records.iter().any(|r| r.offset == *offset),
            "undamaged record at {offset} ({:?}) was not found; damage {damage:?}",
            h.key
        );
    }
}

/// Target name -> property; the names match `fuzz/fuzz_targets/*.rs` and
/// the corpus directories under `fuzz/corpus/`.
/// A fuzz target: its cargo-fuzz name and its property.
pub type Target = (&'static str, fn(&[u8]));

pub const TARGETS: &[Target] = &[
    ("http_request", http_request),
    ("s3_route", s3_route),
    ("sigv4_auth", sigv4_auth),
    ("sigv4_unsigned_headers", sigv4_unsigned_headers),
    ("aws_chunked", aws_chunked),
    ("xml_body", xml_body),
    ("record_header", record_header),
    ("segment_scan", segment_scan),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_corpora_replay_clean() {
        // Every committed corpus file of every target (see fuzz/README.md),
        // replayed on stable; a finding that was fixed stays fixed.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        for (name, property) in TARGETS {
            let dir = root.join(name);
            let mut files = 0;
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
                let data = std::fs::read(entry.unwrap().path()).unwrap();
                property(&data);
                files += 1;
            }
            assert!(files > 0, "{name}: empty corpus");
        }
    }

    #[test]
    fn record_round_trip_and_crafted_block_count() {
        let h = record::Header {
            seq: 9,
            bucket: "b".into(),
            key: "k".into(),
            payload_bytes: 5,
            block_crcs: vec![1],
            body: record::Body::Tombstone { mtime_ms: 3 },
        };
        let key = record::SegKey::v2(77, 3);
        let bytes = record::encode_header_at(&h, &key, 4096).unwrap();
        record_header(&bytes);
        // Claim 2^40 payload bytes (16M blocks) in a tiny header: refused
        // without allocating for them.
        let mut bad = bytes.clone();
        bad[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let at = record::FIXED_HEADER_BYTES + 2 + 1 + 2 + 1;
        bad[at..at + 4].copy_from_slice(&(1u32 << 24).to_le_bytes());
        record::bind_header(&mut bad, &key, 4096);
        assert_eq!(
            record::decode_header(&bad, &key, 4096).unwrap_err(),
            record::DecodeError::Malformed("block CRCs past header end")
        );
    }

    /// `segment_scan` on many random inputs (the fuzz target explores
    /// further; see fuzz/README.md for the long runs).
    #[test]
    fn segment_scan_never_returns_a_forged_record_nor_loses_an_undamaged_one() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5ca9_0001);
        for _ in 0..3000 {
            let len = rng.gen_range(0..300);
            let input: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            segment_scan(&input);
        }
    }

    /// `sigv4_unsigned_headers` on many random inputs (the fuzz target
    /// explores further): header and query auth, every subset of signed
    /// headers, added x-amz-* names of any length, case and position.
    #[test]
    fn sigv4_no_unsigned_amz_header_is_accepted() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5157_0a11);
        for _ in 0..4000 {
            let len = rng.gen_range(0..80);
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            sigv4_unsigned_headers(&data);
        }
        // Each mode on its own, header auth and query auth.
        for flags in [0u8, 1, 0x31] {
            for mode in 0..4u8 {
                sigv4_unsigned_headers(&[flags, 0xff, 3, 17, mode, 5, 9]);
            }
        }
    }

    #[test]
    fn escape_round_trips_control_characters() {
        xml_body(b"a\r\nb\tc\x01<&>\"'");
    }

    #[test]
    fn chunked_split_agrees() {
        aws_chunked(b"\x02");
        aws_chunked(b"\x020\r\n\r\n");
        aws_chunked(b"\x825;chunk-signature=00\r\nhello\r\n0\r\n\r\n");
    }
}
