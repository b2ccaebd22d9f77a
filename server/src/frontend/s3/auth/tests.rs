//! SigV4 and aws-chunked tests, most against AWS's published examples.

use super::canonical::*;
use super::chunked::*;
use super::*;

const ACCESS_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
const EXAMPLE_DATE: &str = "20130524T000000Z";
/// 2013-05-24T00:00:00Z.
const EXAMPLE_UNIX_SECS: u64 = 1_369_353_600;
const SKEW: Duration = Duration::from_secs(15 * 60);

fn secrets(access_key: &str) -> Option<String> {
    (access_key == ACCESS_KEY).then(|| SECRET.to_string())
}

fn at(unix_secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix_secs)
}

fn example_now() -> SystemTime {
    at(EXAMPLE_UNIX_SECS)
}

fn views<'a>(headers: &[(&'a str, &'a str)]) -> Vec<HeaderView<'a>> {
    headers
        .iter()
        .map(|&(name, value)| HeaderView {
            name,
            value: value.as_bytes(),
        })
        .collect()
}

fn run(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    now: SystemTime,
) -> Result<Verified, AuthError> {
    let headers = views(headers);
    let input = AuthInput {
        method,
        raw_path: path,
        raw_query: query,
        headers: &headers,
        virtual_bucket: None,
    };
    verify(&input, &secrets, now, SKEW)
}

fn hex32(s: &str) -> [u8; 32] {
    parse_hex32(s).expect("64 hex digits")
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

// --- Independent client-side signer, written from the SigV4 spec the way
// --- SDKs do it, sharing no canonicalisation code with the verifier.

/// botocore-style `quote(s, safe)`: unreserved plus `safe` kept.
fn client_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn client_hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).unwrap();
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

struct ClientRequest<'a> {
    method: &'a str,
    /// Already encoded as it goes on the wire and into the canonical request.
    path: &'a str,
    /// Decoded (name, value) pairs.
    query: Vec<(&'a str, &'a str)>,
    headers: Vec<(&'a str, String)>,
    signed: Vec<&'a str>,
    payload_hash: &'a str,
    amz_date: &'a str,
    region: &'a str,
}

impl ClientRequest<'_> {
    fn wire_query(&self) -> String {
        self.query
            .iter()
            .map(|(n, v)| format!("{}={}", client_encode(n, false), client_encode(v, false)))
            .collect::<Vec<_>>()
            .join("&")
    }

    fn signature(&self, secret: &str) -> String {
        let mut query: Vec<(String, String)> = self
            .query
            .iter()
            .map(|(n, v)| (client_encode(n, false), client_encode(v, false)))
            .collect();
        query.sort();
        let query: Vec<String> = query.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let mut signed = self.signed.clone();
        signed.sort();
        let mut canonical_headers = String::new();
        for name in &signed {
            let values: Vec<String> = self
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
        }
        let canonical = format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            self.method,
            self.path,
            query.join("&"),
            canonical_headers,
            signed.join(";"),
            self.payload_hash
        );
        let scope = format!("{}/{}/s3/aws4_request", &self.amz_date[..8], self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
            self.amz_date,
            sha256_hex(canonical.as_bytes())
        );
        let k_date = client_hmac(format!("AWS4{secret}").as_bytes(), &self.amz_date[..8]);
        let k_region = client_hmac(&k_date, self.region);
        let k_service = client_hmac(&k_region, "s3");
        let k_signing = client_hmac(&k_service, "aws4_request");
        hex::encode(client_hmac(&k_signing, &to_sign))
    }

    fn authorization(&self, secret: &str) -> String {
        let mut signed = self.signed.clone();
        signed.sort();
        format!(
            "AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{}/{}/s3/aws4_request, SignedHeaders={}, Signature={}",
            &self.amz_date[..8],
            self.region,
            signed.join(";"),
            self.signature(secret)
        )
    }

    /// Headers as sent, Authorization included.
    fn wire_headers(&self) -> Vec<(&str, String)> {
        let mut headers = self.headers.clone();
        headers.push(("Authorization", self.authorization(SECRET)));
        headers
    }
}

fn run_owned(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, String)],
    now: SystemTime,
) -> Result<Verified, AuthError> {
    let borrowed: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    run(method, path, query, &borrowed, now)
}

fn sample_request() -> ClientRequest<'static> {
    let payload_hash = "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072";
    ClientRequest {
        method: "PUT",
        path: "/bucket/dir/a%20b%2Bc%3Dd%C3%BC~.txt",
        query: vec![("partNumber", "2"), ("uploadId", "a/b+c d")],
        headers: vec![
            ("Host", "localhost:9000".to_string()),
            ("X-Amz-Date", EXAMPLE_DATE.to_string()),
            ("x-amz-content-sha256", payload_hash.to_string()),
            ("x-amz-meta-note", "  two   spaces  ".to_string()),
            ("Content-Type", "text/plain".to_string()),
            ("User-Agent", "unsigned/1.0".to_string()),
        ],
        signed: vec![
            "host",
            "x-amz-date",
            "x-amz-content-sha256",
            "x-amz-meta-note",
            "content-type",
        ],
        payload_hash,
        amz_date: EXAMPLE_DATE,
        region: "eu-west-3",
    }
}

// --- Official AWS examples (S3 API reference, "Signature Calculations for
// --- the Authorization Header" and "Authenticating Requests: Using Query
// --- Parameters"), reproduced byte for byte.

#[test]
fn aws_example_get_object() {
    let empty = EMPTY_SHA256_HEX;
    let auth = "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41";
    let headers = [
        ("Host", "examplebucket.s3.amazonaws.com"),
        ("Authorization", auth),
        ("Range", "bytes=0-9"),
        ("x-amz-content-sha256", empty),
        ("x-amz-date", EXAMPLE_DATE),
    ];
    let verified = run("GET", "/test.txt", "", &headers, example_now()).unwrap();
    assert_eq!(verified.access_key, ACCESS_KEY);
    assert_eq!(verified.payload, PayloadMode::Sha256(hex32(empty)));
    assert_eq!(verified.amz_date, EXAMPLE_DATE);
    assert_eq!(verified.scope, "20130524/us-east-1/s3/aws4_request");
    assert_eq!(
        verified.seed_signature,
        hex32("f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    );
    assert_eq!(
        verified.signing_key,
        signing_key(SECRET, "20130524", "us-east-1", "s3")
    );
}

#[test]
fn aws_example_get_object_canonical_request() {
    let empty = EMPTY_SHA256_HEX;
    let headers = views(&[
        ("Host", "examplebucket.s3.amazonaws.com"),
        ("Range", "bytes=0-9"),
        ("x-amz-content-sha256", empty),
        ("x-amz-date", EXAMPLE_DATE),
    ]);
    let input = AuthInput {
        method: "GET",
        raw_path: "/test.txt",
        raw_query: "",
        headers: &headers,
        virtual_bucket: None,
    };
    let canonical = canonical_request(
        &input,
        "",
        "host;range;x-amz-content-sha256;x-amz-date",
        empty,
        AuthError::Malformed,
    )
    .unwrap();
    // Hash of the canonical request as printed in the AWS example.
    assert_eq!(
        sha256_hex(&canonical),
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
    );
}

fn put_object_headers(auth: &str) -> Vec<(&str, &str)> {
    vec![
        ("Host", "examplebucket.s3.amazonaws.com"),
        ("Date", "Fri, 24 May 2013 00:00:00 GMT"),
        ("Authorization", auth),
        ("x-amz-date", "20130524T000000Z "),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        (
            "x-amz-content-sha256",
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072",
        ),
    ]
}

const PUT_OBJECT_AUTH: &str = "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class,Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd";

#[test]
fn aws_example_put_object() {
    let headers = put_object_headers(PUT_OBJECT_AUTH);
    // The key `test$file.text` verifies whether or not `$` was escaped on the wire.
    for path in [
        "/test%24file.text",
        "/test$file.text",
        "/test%24file%2etext",
    ] {
        let verified = run("PUT", path, "", &headers, example_now()).unwrap();
        let body_hash: [u8; 32] = Sha256::digest(b"Welcome to Amazon S3.").into();
        assert_eq!(verified.payload, PayloadMode::Sha256(body_hash));
        assert_eq!(verified.payload.check_body_sha256(&body_hash), Ok(()));
        let other: [u8; 32] = Sha256::digest(b"Welcome to Amazon S4.").into();
        assert_eq!(
            verified.payload.check_body_sha256(&other),
            Err(AuthError::ContentSha256Mismatch)
        );
    }
    let wrong_key = run("PUT", "/test%2524file.text", "", &headers, example_now());
    assert_eq!(wrong_key.unwrap_err(), AuthError::SignatureDoesNotMatch);
}

#[test]
fn aws_example_get_bucket_lifecycle() {
    let empty = EMPTY_SHA256_HEX;
    let auth = "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;x-amz-content-sha256;x-amz-date,Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543";
    let headers = [
        ("Host", "examplebucket.s3.amazonaws.com"),
        ("Authorization", auth),
        ("x-amz-date", EXAMPLE_DATE),
        ("x-amz-content-sha256", empty),
    ];
    run("GET", "/", "lifecycle", &headers, example_now()).unwrap();
    run("GET", "/", "lifecycle=", &headers, example_now()).unwrap();
    assert_eq!(
        run("GET", "/", "policy", &headers, example_now()).unwrap_err(),
        AuthError::SignatureDoesNotMatch
    );
}

#[test]
fn aws_example_list_objects() {
    let empty = EMPTY_SHA256_HEX;
    let auth = "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;x-amz-content-sha256;x-amz-date,Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7";
    let headers = [
        ("Host", "examplebucket.s3.amazonaws.com"),
        ("Authorization", auth),
        ("x-amz-date", EXAMPLE_DATE),
        ("x-amz-content-sha256", empty),
    ];
    // Parameter order on the wire does not matter: the canonical form sorts.
    run("GET", "/", "max-keys=2&prefix=J", &headers, example_now()).unwrap();
    run("GET", "/", "prefix=J&max-keys=2", &headers, example_now()).unwrap();
    assert_eq!(
        run("GET", "/", "max-keys=3&prefix=J", &headers, example_now()).unwrap_err(),
        AuthError::SignatureDoesNotMatch
    );
    assert_eq!(
        run("GET", "", "max-keys=2&prefix=J", &headers, example_now()).map(|_| ()),
        Ok(()),
        "an empty path is '/'"
    );
}

const PRESIGNED_QUERY: &str = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";

#[test]
fn aws_example_presigned_url() {
    let headers = [("Host", "examplebucket.s3.amazonaws.com")];
    let hour_later = at(EXAMPLE_UNIX_SECS + 3600);
    let verified = run("GET", "/test.txt", PRESIGNED_QUERY, &headers, hour_later).unwrap();
    assert_eq!(verified.payload, PayloadMode::Unsigned);
    assert_eq!(verified.access_key, ACCESS_KEY);
    assert_eq!(verified.amz_date, EXAMPLE_DATE);
    // Valid up to and including the last second of X-Amz-Expires.
    let last_second = at(EXAMPLE_UNIX_SECS + 86_400);
    run("GET", "/test.txt", PRESIGNED_QUERY, &headers, last_second).unwrap();
    let expired = at(EXAMPLE_UNIX_SECS + 86_401);
    let err = run("GET", "/test.txt", PRESIGNED_QUERY, &headers, expired).unwrap_err();
    assert_eq!(err, AuthError::Expired);
    assert_eq!((err.s3_code(), err.http_status()), ("AccessDenied", 403));
    assert_eq!(err.message(), "Request has expired");
    let early = at(EXAMPLE_UNIX_SECS - 3600);
    let err = run("GET", "/test.txt", PRESIGNED_QUERY, &headers, early).unwrap_err();
    assert_eq!(err, AuthError::NotYetValid);
}

#[test]
fn presigned_url_tampering_fails() {
    let headers = [("Host", "examplebucket.s3.amazonaws.com")];
    let now = at(EXAMPLE_UNIX_SECS + 60);
    let cases = [
        ("GET", "/test.txt2", PRESIGNED_QUERY.to_string()),
        ("PUT", "/test.txt", PRESIGNED_QUERY.to_string()),
        ("GET", "/test.txt", format!("{PRESIGNED_QUERY}&versionId=1")),
        (
            "GET",
            "/test.txt",
            PRESIGNED_QUERY.replace("X-Amz-Expires=86400", "X-Amz-Expires=86401"),
        ),
        (
            "GET",
            "/test.txt",
            PRESIGNED_QUERY.replace("us-east-1", "us-west-2"),
        ),
    ];
    for (method, path, query) in &cases {
        let result = run(method, path, query, &headers, now);
        assert_eq!(
            result.unwrap_err(),
            AuthError::SignatureDoesNotMatch,
            "{method} {path}?{query}"
        );
    }
    let other_host = [("Host", "otherbucket.s3.amazonaws.com")];
    assert_eq!(
        run("GET", "/test.txt", PRESIGNED_QUERY, &other_host, now).unwrap_err(),
        AuthError::SignatureDoesNotMatch
    );
    let date_moved =
        PRESIGNED_QUERY.replace("X-Amz-Date=20130524T000000Z", "X-Amz-Date=20130524T000001Z");
    assert_eq!(
        run("GET", "/test.txt", &date_moved, &headers, now).unwrap_err(),
        AuthError::SignatureDoesNotMatch
    );
}

#[test]
fn presigned_url_parameter_errors() {
    let headers = [("Host", "examplebucket.s3.amazonaws.com")];
    let now = at(EXAMPLE_UNIX_SECS + 60);
    let week_plus = PRESIGNED_QUERY.replace("X-Amz-Expires=86400", "X-Amz-Expires=604801");
    let err = run("GET", "/test.txt", &week_plus, &headers, now).unwrap_err();
    assert!(matches!(err, AuthError::QueryMalformed(_)), "{err:?}");
    assert_eq!(err.s3_code(), "AuthorizationQueryParametersError");
    let no_expires = PRESIGNED_QUERY.replace("X-Amz-Expires=86400&", "");
    assert!(matches!(
        run("GET", "/test.txt", &no_expires, &headers, now),
        Err(AuthError::QueryMalformed(_))
    ));
    let wrong_algorithm = PRESIGNED_QUERY.replace("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256");
    assert_eq!(
        run("GET", "/test.txt", &wrong_algorithm, &headers, now).unwrap_err(),
        AuthError::UnsupportedAlgorithm
    );
    let other_day = PRESIGNED_QUERY.replace("%2F20130524%2F", "%2F20130523%2F");
    assert!(matches!(
        run("GET", "/test.txt", &other_day, &headers, now),
        Err(AuthError::QueryMalformed(_))
    ));
    let unknown_key = PRESIGNED_QUERY.replace("AKIAIOSFODNN7EXAMPLE", "AKIAUNKNOWN");
    assert_eq!(
        run("GET", "/test.txt", &unknown_key, &headers, now).unwrap_err(),
        AuthError::InvalidAccessKeyId
    );
    let doubled = format!("{PRESIGNED_QUERY}&X-Amz-Date=20130524T000000Z");
    assert!(matches!(
        run("GET", "/test.txt", &doubled, &headers, now),
        Err(AuthError::QueryMalformed(_))
    ));
    let with_header = [
        ("Host", "examplebucket.s3.amazonaws.com"),
        ("Authorization", PUT_OBJECT_AUTH),
    ];
    assert_eq!(
        run("GET", "/test.txt", PRESIGNED_QUERY, &with_header, now).unwrap_err(),
        AuthError::ConflictingAuth
    );
}

// --- Header-auth behaviour, using the independent client signer.

/// The presigned example URL plus `extra` headers, an hour after signing.
fn presigned_with(extra: &[(&str, &str)]) -> Result<Verified, AuthError> {
    let mut headers = vec![("Host", "examplebucket.s3.amazonaws.com")];
    headers.extend_from_slice(extra);
    let hour_later = at(EXAMPLE_UNIX_SECS + 3600);
    run("GET", "/test.txt", PRESIGNED_QUERY, &headers, hour_later)
}

#[test]
fn presigned_url_with_added_amz_header_is_refused() {
    // Signed headers: host only. An added x-amz-copy-source would turn
    // a presigned PUT into a copy of any object; every x-amz-* header
    // the URL did not sign is refused, whatever its case.
    for (name, value) in [
        ("x-amz-copy-source", "/other-bucket/secret"),
        ("X-Amz-Copy-Source", "/other-bucket/secret"),
        ("x-amz-metadata-directive", "REPLACE"),
        ("x-amz-meta-owner", "mallory"),
        ("x-amz-decoded-content-length", "5"),
        ("x-amz-trailer", "x-amz-checksum-crc32"),
        ("x-amz-checksum-crc32", "AAAAAA=="),
        ("x-amz-date", "20130524T000001Z"),
        ("x-amz-content-sha256", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
        ("x-amz-", ""),
    ] {
        let err = presigned_with(&[(name, value)]).unwrap_err();
        assert_eq!(
            err,
            AuthError::UnsignedHeaders(name.to_ascii_lowercase()),
            "{name}"
        );
        assert_eq!((err.s3_code(), err.http_status()), ("AccessDenied", 403));
        assert_eq!(
            err.message(),
            "There were headers present in the request which were not signed"
        );
    }
    // Other unsigned headers are fine (proxies and clients add them),
    // and so is a header that repeats exactly what the URL signed.
    presigned_with(&[("User-Agent", "curl/8"), ("x-amzn-trace-id", "Root=1")]).unwrap();
    presigned_with(&[("x-amz-content-sha256", "UNSIGNED-PAYLOAD")]).unwrap();
    presigned_with(&[("x-amz-date", EXAMPLE_DATE)]).unwrap();
}

#[test]
fn header_auth_with_added_amz_header_is_refused() {
    let request = sample_request();
    let query = request.wire_query();
    let mut headers = request.wire_headers();
    run_owned("PUT", request.path, &query, &headers, example_now()).unwrap();
    headers.push(("x-amz-copy-source", "/other-bucket/secret".to_string()));
    let err = run_owned("PUT", request.path, &query, &headers, example_now()).unwrap_err();
    assert_eq!(err, AuthError::UnsignedHeaders("x-amz-copy-source".into()));
    assert_eq!((err.s3_code(), err.http_status()), ("AccessDenied", 403));

    // x-amz-date and x-amz-content-sha256 are in the string-to-sign even
    // when SignedHeaders leaves them out: a request signing only host
    // (as some old clients do) still verifies.
    let mut host_only = sample_request();
    host_only.signed = vec!["host"];
    host_only
        .headers
        .retain(|(n, _)| !n.starts_with("x-amz-meta"));
    let headers = host_only.wire_headers();
    run_owned("PUT", host_only.path, &query, &headers, example_now()).unwrap();
    // ... but not an x-amz-meta-* header it did not list.
    let mut headers = host_only.wire_headers();
    headers.insert(1, ("x-amz-meta-note", "added".to_string()));
    assert_eq!(
        run_owned("PUT", host_only.path, &query, &headers, example_now()).unwrap_err(),
        AuthError::UnsignedHeaders("x-amz-meta-note".into())
    );
}

#[test]
fn signed_request_verifies() {
    let request = sample_request();
    let headers = request.wire_headers();
    let verified = run_owned(
        "PUT",
        request.path,
        &request.wire_query(),
        &headers,
        example_now(),
    )
    .unwrap();
    assert_eq!(verified.scope, "20130524/eu-west-3/s3/aws4_request");
    assert_eq!(
        verified.signing_key,
        signing_key(SECRET, "20130524", "eu-west-3", "s3")
    );
}

#[test]
fn tampering_with_any_signed_part_fails() {
    let request = sample_request();
    let wire_query = request.wire_query();
    let headers = request.wire_headers();
    let mismatch = |method: &str, path: &str, query: &str, headers: &[(&str, String)]| {
        assert_eq!(
            run_owned(method, path, query, headers, example_now()).unwrap_err(),
            AuthError::SignatureDoesNotMatch,
            "{method} {path}?{query} {headers:?}"
        );
    };
    // Each signed header, changed or dropped.
    for (index, (name, value)) in request.headers.iter().enumerate() {
        if !request.signed.iter().any(|s| s.eq_ignore_ascii_case(name)) {
            continue;
        }
        let mut changed = headers.clone();
        changed[index].1 = if name.eq_ignore_ascii_case("x-amz-date") {
            "20130524T000001Z".to_string()
        } else if name.eq_ignore_ascii_case("x-amz-content-sha256") {
            EMPTY_SHA256_HEX.to_string()
        } else {
            format!("{value}x")
        };
        mismatch("PUT", request.path, &wire_query, &changed);
        let mut dropped = headers.clone();
        dropped.remove(index);
        if name.eq_ignore_ascii_case("x-amz-date") {
            let err = run_owned("PUT", request.path, &wire_query, &dropped, example_now());
            assert_eq!(err.unwrap_err(), AuthError::MissingDate);
        } else if name.eq_ignore_ascii_case("x-amz-content-sha256") {
            let err = run_owned("PUT", request.path, &wire_query, &dropped, example_now());
            assert_eq!(err.unwrap_err(), AuthError::MissingContentSha256);
        } else {
            mismatch("PUT", request.path, &wire_query, &dropped);
        }
        let mut repeated = headers.clone();
        repeated.push((name, value.clone()));
        if !name.eq_ignore_ascii_case("x-amz-date")
            && !name.eq_ignore_ascii_case("x-amz-content-sha256")
        {
            mismatch("PUT", request.path, &wire_query, &repeated);
        }
    }
    mismatch("POST", request.path, &wire_query, &headers);
    mismatch(
        "PUT",
        "/bucket/dir/a%20b%2Bc%3Dd%C3%BC~.txx",
        &wire_query,
        &headers,
    );
    mismatch(
        "PUT",
        "/bucket/dir/a+b%2Bc%3Dd%C3%BC~.txt",
        &wire_query,
        &headers,
    );
    mismatch(
        "PUT",
        "/bucket/dir%2Fa%20b%2Bc%3Dd%C3%BC~.txt",
        &wire_query,
        &headers,
    );
    mismatch(
        "PUT",
        request.path,
        "partNumber=3&uploadId=a%2Fb%2Bc%20d",
        &headers,
    );
    mismatch("PUT", request.path, &format!("{wire_query}&x=1"), &headers);
    mismatch("PUT", request.path, "partNumber=2", &headers);
    mismatch("PUT", request.path, "", &headers);
    // Unsigned headers may change freely.
    let mut agent = headers.clone();
    agent[5].1 = "other/2.0".to_string();
    agent.push(("X-Forwarded-For", "10.0.0.1".to_string()));
    run_owned("PUT", request.path, &wire_query, &agent, example_now()).unwrap();
}

#[test]
fn path_and_query_spellings_normalise() {
    let request = sample_request();
    let headers = request.wire_headers();
    // Same key and parameters, escaped differently on the wire.
    let paths = [
        "/bucket/dir/a%20b%2Bc%3Dd%C3%BC~.txt",
        "/bucket/dir/a%20b%2bc=d%c3%bc%7E.txt",
        "/bucket/dir/a%20b%2Bc%3Dd\u{fc}~.txt",
    ];
    let queries = [
        "uploadId=a%2Fb%2Bc%20d&partNumber=2",
        "partNumber=2&uploadId=a/b%2bc%20d",
        "&partNumber=2&&uploadId=a%2Fb%2Bc%20d&",
    ];
    for path in paths {
        for query in queries {
            let result = run_owned("PUT", path, query, &headers, example_now());
            assert!(result.is_ok(), "{path}?{query}: {result:?}");
        }
    }
    // '+' in a raw query is a literal plus, not a space.
    assert_eq!(
        run_owned(
            "PUT",
            request.path,
            "partNumber=2&uploadId=a/b+c+d",
            &headers,
            example_now()
        )
        .unwrap_err(),
        AuthError::SignatureDoesNotMatch
    );
}

#[test]
fn keys_as_boto3_encodes_them() {
    let keys = [
        "a b",
        "a+b",
        "ключ/über ☃.txt",
        "x=y&z",
        "100%",
        "~tilde_.-",
        "a//b",
    ];
    for key in keys {
        let wire_path = format!("/bucket/{}", client_encode(key, true));
        let mut request = sample_request();
        request.path = &wire_path;
        let headers = request.wire_headers();
        let result = run_owned(
            "PUT",
            &wire_path,
            &request.wire_query(),
            &headers,
            example_now(),
        );
        assert!(result.is_ok(), "{key}: {result:?}");
    }
}

#[test]
fn list_query_with_special_values() {
    let mut request = sample_request();
    request.method = "GET";
    request.path = "/bucket";
    request.query = vec![
        ("list-type", "2"),
        ("prefix", "photos/2024 jan+feb/"),
        ("delimiter", "/"),
        ("encoding-type", "url"),
        ("start-after", "ü=1"),
        ("fetch-owner", ""),
    ];
    let headers = request.wire_headers();
    let query = request.wire_query();
    run_owned("GET", "/bucket", &query, &headers, example_now()).unwrap();
    // A bare name is the same as name with an empty value.
    let bare = query.replace("fetch-owner=", "fetch-owner");
    run_owned("GET", "/bucket", &bare, &headers, example_now()).unwrap();
}

#[test]
fn header_values_trimmed_and_joined() {
    let headers = views(&[
        ("Host", "h"),
        ("X-Amz-Meta-A", "  one   two\t three  "),
        ("x-amz-meta-a", "four"),
    ]);
    let input = AuthInput {
        method: "GET",
        raw_path: "/",
        raw_query: "",
        headers: &headers,
        virtual_bucket: None,
    };
    let canonical = canonical_request(
        &input,
        "",
        "host;x-amz-meta-a",
        "UNSIGNED-PAYLOAD",
        AuthError::Malformed,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(canonical).unwrap(),
        "GET\n/\n\nhost:h\nx-amz-meta-a:one two three,four\n\nhost;x-amz-meta-a\nUNSIGNED-PAYLOAD"
    );
}

#[test]
fn canonical_uri_and_query_encoding() {
    let uri = |raw: &str| {
        let mut out = Vec::new();
        push_canonical_uri(&mut out, raw);
        String::from_utf8(out).unwrap()
    };
    assert_eq!(uri(""), "/");
    assert_eq!(uri("/b/k"), "/b/k");
    assert_eq!(uri("/b/a b+c"), "/b/a%20b%2Bc");
    assert_eq!(uri("/b/%7e%2f%zz%"), "/b/~%2F%25zz%25");
    assert_eq!(uri("/b/\u{e9}"), "/b/%C3%A9");
    assert_eq!(canonical_query("", false), "");
    assert_eq!(canonical_query("b=2&a=1&a=0&c", false), "a=0&a=1&b=2&c=");
    assert_eq!(canonical_query("k=a/b c", false), "k=a%2Fb%20c");
    assert_eq!(
        canonical_query("X-Amz-Signature=ab&X-Amz-Date=1", true),
        "X-Amz-Date=1"
    );
}

#[test]
fn authorization_header_errors() {
    let request = sample_request();
    let wire_query = request.wire_query();
    let base = request.wire_headers();
    let with_auth = |auth: &str| -> Result<Verified, AuthError> {
        let mut headers = base.clone();
        headers.last_mut().unwrap().1 = auth.to_string();
        run_owned("PUT", request.path, &wire_query, &headers, example_now())
    };
    let good = request.authorization(SECRET);
    assert!(with_auth(&good).is_ok());
    // No spaces after commas is accepted too.
    assert!(with_auth(&good.replace(", ", ",")).is_ok());
    // SigV2 header auth is verified as such (`sigv2`): this one was signed
    // for another request.
    assert_eq!(
        with_auth("AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg=").unwrap_err(),
        AuthError::SignatureDoesNotMatch
    );
    assert_eq!(
        with_auth("AWS4-ECDSA-P256-SHA256 Credential=x").unwrap_err(),
        AuthError::UnsupportedAlgorithm
    );
    let malformed = [
        good.replace("Credential=", "Credentials="),
        good.replace(", SignedHeaders=", ", Foo=x, SignedHeaders="),
        good.replace("/s3/", "/ec2/"),
        good.replace("aws4_request", "aws5_request"),
        good.replace("/20130524/", "/20130523/"),
        good.replace("content-type;", ""),
        good.replace("host;", ""),
        good.replace("Signature=", "Signature=ab"),
        format!("{good}, Signature=00"),
    ];
    for auth in &malformed {
        let err = with_auth(auth).unwrap_err();
        assert!(
            matches!(err, AuthError::Malformed(_)) || err == AuthError::SignatureDoesNotMatch,
            "{auth}: {err:?}"
        );
    }
    let dropped_from_list = with_auth(&good.replace("content-type;", "")).unwrap_err();
    assert_eq!(dropped_from_list, AuthError::SignatureDoesNotMatch);
    let no_host = with_auth(&good.replace("host;", "")).unwrap_err();
    assert!(matches!(no_host, AuthError::Malformed(_)));
    assert_eq!(no_host.s3_code(), "AuthorizationHeaderMalformed");
    assert_eq!(
        with_auth(&good.replace(ACCESS_KEY, "AKIAOTHER")).unwrap_err(),
        AuthError::InvalidAccessKeyId
    );
}

#[test]
fn missing_auth_and_headers() {
    let headers = [("Host", "h")];
    let err = run("GET", "/", "", &headers, example_now()).unwrap_err();
    assert_eq!(err, AuthError::Missing);
    assert_eq!((err.s3_code(), err.http_status()), ("AccessDenied", 403));
    assert_eq!(
        run(
            "GET",
            "/",
            "AWSAccessKeyId=x&Signature=y&Expires=1",
            &headers,
            example_now()
        )
        .unwrap_err(),
        AuthError::InvalidAccessKeyId
    );

    let request = sample_request();
    let mut headers = request.wire_headers();
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case("x-amz-content-sha256"));
    assert_eq!(
        run_owned(
            "PUT",
            request.path,
            &request.wire_query(),
            &headers,
            example_now()
        )
        .unwrap_err(),
        AuthError::MissingContentSha256
    );
    let mut headers = request.wire_headers();
    headers[2].1 = "SOMETHING-ELSE".to_string();
    assert_eq!(
        run_owned(
            "PUT",
            request.path,
            &request.wire_query(),
            &headers,
            example_now()
        )
        .unwrap_err(),
        AuthError::InvalidContentSha256
    );
    let mut headers = request.wire_headers();
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case("x-amz-date"));
    assert_eq!(
        run_owned(
            "PUT",
            request.path,
            &request.wire_query(),
            &headers,
            example_now()
        )
        .unwrap_err(),
        AuthError::MissingDate
    );
}

#[test]
fn clock_skew() {
    let request = sample_request();
    let headers = request.wire_headers();
    let query = request.wire_query();
    let within = [EXAMPLE_UNIX_SECS - 900, EXAMPLE_UNIX_SECS + 900];
    for now in within {
        run_owned("PUT", request.path, &query, &headers, at(now)).unwrap();
    }
    for now in [
        EXAMPLE_UNIX_SECS - 901,
        EXAMPLE_UNIX_SECS + 901,
        EXAMPLE_UNIX_SECS + 86_400,
    ] {
        let err = run_owned("PUT", request.path, &query, &headers, at(now)).unwrap_err();
        assert_eq!(err, AuthError::RequestTimeTooSkewed);
        assert_eq!(err.http_status(), 403);
    }
}

#[test]
fn date_header_fallback() {
    let mut request = sample_request();
    request.headers[1] = ("Date", "Fri, 24 May 2013 00:00:00 GMT".to_string());
    request.signed[1] = "date";
    let headers = request.wire_headers();
    let verified = run_owned(
        "PUT",
        request.path,
        &request.wire_query(),
        &headers,
        example_now(),
    )
    .unwrap();
    assert_eq!(verified.amz_date, EXAMPLE_DATE);
}

#[test]
fn dates_round_trip() {
    assert_eq!(parse_amz_date(EXAMPLE_DATE), Some(EXAMPLE_UNIX_SECS as i64));
    assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
    assert_eq!(parse_amz_date("20000229T235959Z"), Some(951_868_799));
    assert_eq!(parse_amz_date("20010229T000000Z"), None);
    assert_eq!(parse_amz_date("20130524T240000Z"), None);
    assert_eq!(parse_amz_date("20130524T000000"), None);
    assert_eq!(parse_amz_date("2013052XT000000Z"), None);
    for secs in [
        0,
        951_868_799,
        1_369_353_600,
        4_102_444_800,
        253_402_300_799,
    ] {
        assert_eq!(parse_amz_date(&format_amz_date(secs)), Some(secs));
    }
    assert_eq!(format_amz_date(1_369_353_600 + 3661), "20130524T010101Z");
}

// --- aws-chunked: AWS examples (64 KiB + 1 KiB of 'a', sigv4-streaming
// --- and sigv4-streaming-trailers pages).

const CHUNKED_SEED: &str = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";
const CHUNK_SIGNATURES: [&str; 3] = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
];
const TRAILER_SEED: &str = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e";
const TRAILER_CHUNK_SIGNATURES: [&str; 3] = [
    "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
    "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
    "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
];
const TRAILER_SIGNATURE: &str = "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435";

fn chunked_body(signatures: &[&str; 3]) -> Vec<u8> {
    let mut body = Vec::new();
    for (size, signature) in [65_536usize, 1024, 0].iter().zip(signatures) {
        body.extend_from_slice(format!("{size:x};chunk-signature={signature}\r\n").as_bytes());
        body.resize(body.len() + *size, b'a');
        if *size > 0 {
            body.extend_from_slice(b"\r\n");
        }
    }
    body
}

fn signed_chunked_body() -> Vec<u8> {
    let mut body = chunked_body(&CHUNK_SIGNATURES);
    body.extend_from_slice(b"\r\n");
    body
}

fn trailer_chunked_body() -> Vec<u8> {
    let mut body = chunked_body(&TRAILER_CHUNK_SIGNATURES);
    body.extend_from_slice(b"x-amz-checksum-crc32c:sOO8/Q==\r\n");
    body.extend_from_slice(
        format!("x-amz-trailer-signature:{TRAILER_SIGNATURE}\r\n\r\n").as_bytes(),
    );
    body
}

fn example_verified(seed: &str, payload: PayloadMode) -> Verified {
    Verified {
        principal: crate::access::Principal::Anonymous,
        access_key: ACCESS_KEY.into(),
        payload,
        signing_key: signing_key(SECRET, "20130524", "us-east-1", "s3"),
        seed_signature: hex32(seed),
        amz_date: EXAMPLE_DATE.into(),
        scope: "20130524/us-east-1/s3/aws4_request".into(),
        content_md5_signed: false,
    }
}

/// Feed `body` in pieces of `piece_bytes`; returns decoded bytes.
fn decode_in_pieces(
    decoder: &mut ChunkedDecoder,
    body: &[u8],
    piece_bytes: usize,
) -> Result<Vec<u8>, AuthError> {
    let mut out = Vec::new();
    for piece in body.chunks(piece_bytes) {
        let used = decoder.feed(piece, &mut out)?;
        assert_eq!(used, piece.len());
    }
    decoder.finish()?;
    Ok(out)
}

#[test]
fn aws_example_chunked_seed_signature() {
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class,Signature={CHUNKED_SEED}"
    );
    let headers = [
        ("Host", "s3.amazonaws.com"),
        ("x-amz-date", EXAMPLE_DATE),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ("Authorization", auth.as_str()),
        ("x-amz-content-sha256", STREAMING_SIGNED),
        ("Content-Encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "66560"),
        ("Content-Length", "66824"),
    ];
    let verified = run(
        "PUT",
        "/examplebucket/chunkObject.txt",
        "",
        &headers,
        example_now(),
    )
    .unwrap();
    assert_eq!(verified.payload, PayloadMode::StreamingSigned);
    assert_eq!(verified.seed_signature, hex32(CHUNKED_SEED));
    assert_eq!(
        signed_chunked_body().len(),
        66_824,
        "example Content-Length"
    );

    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, Some(66_560));
    let out = decode_in_pieces(&mut decoder, &signed_chunked_body(), usize::MAX).unwrap();
    assert_eq!(out, vec![b'a'; 66_560]);
    assert!(decoder.is_done());
    assert!(decoder.trailers().is_empty());
}

#[test]
fn aws_example_trailer_seed_signature() {
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=content-encoding;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class;x-amz-trailer,Signature={TRAILER_SEED}"
    );
    let headers = [
        ("Host", "s3.amazonaws.com"),
        ("x-amz-date", EXAMPLE_DATE),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ("Authorization", auth.as_str()),
        ("x-amz-content-sha256", STREAMING_SIGNED_TRAILER),
        ("Content-Encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "66560"),
        ("x-amz-trailer", "x-amz-checksum-crc32c"),
    ];
    let verified = run(
        "PUT",
        "/examplebucket/chunkObject.txt",
        "",
        &headers,
        example_now(),
    )
    .unwrap();
    assert_eq!(verified.payload, PayloadMode::StreamingSignedTrailer);

    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, Some(66_560));
    let out = decode_in_pieces(&mut decoder, &trailer_chunked_body(), usize::MAX).unwrap();
    assert_eq!(out, vec![b'a'; 66_560]);
    assert_eq!(
        decoder.trailers(),
        &[("x-amz-checksum-crc32c".to_string(), "sOO8/Q==".to_string())]
    );
    // The trailer's checksum is base64 of the big-endian CRC32C of the data.
    assert_eq!(crc32c::crc32c(&out).to_be_bytes(), [0xb0, 0xe3, 0xbc, 0xfd]);
}

#[test]
fn chunked_every_split_point() {
    let signed = example_verified(CHUNKED_SEED, PayloadMode::StreamingSigned);
    let trailer = example_verified(TRAILER_SEED, PayloadMode::StreamingSignedTrailer);
    let cases = [
        (&signed, signed_chunked_body()),
        (&trailer, trailer_chunked_body()),
    ];
    for (verified, body) in &cases {
        for piece_bytes in [1, 2, 3, 7, 64, 4097, 65_537] {
            let mut decoder = ChunkedDecoder::new(&verified.payload, verified, Some(66_560));
            let out = decode_in_pieces(&mut decoder, body, piece_bytes).unwrap();
            assert_eq!(out.len(), 66_560, "piece {piece_bytes}");
            assert!(out.iter().all(|&b| b == b'a'));
        }
        // Two pieces, split at every byte of the framing around chunk 2.
        for split in 65_600..body.len() {
            let mut decoder = ChunkedDecoder::new(&verified.payload, verified, None);
            let mut out = Vec::new();
            decoder.feed(&body[..split], &mut out).unwrap();
            decoder.feed(&body[split..], &mut out).unwrap();
            assert!(decoder.is_done(), "split {split}");
            assert_eq!(out.len(), 66_560);
        }
    }
}

#[test]
fn chunked_tampering_fails() {
    let verified = example_verified(CHUNKED_SEED, PayloadMode::StreamingSigned);
    let body = signed_chunked_body();
    let mut flipped_data = body.clone();
    flipped_data[100] = b'b';
    let mut flipped_signature = body.clone();
    // Inside chunk 1's signature hex, still a hex digit.
    flipped_signature[30] = if body[30] == b'0' { b'1' } else { b'0' };
    let mut wrong_last = body.clone();
    let last = body.len() - 5;
    wrong_last[last] = if body[last] == b'0' { b'1' } else { b'0' };
    for tampered in [flipped_data, flipped_signature, wrong_last] {
        let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, None);
        let err = decode_in_pieces(&mut decoder, &tampered, 1000).unwrap_err();
        assert_eq!(err, AuthError::SignatureDoesNotMatch);
        // The decoder stays failed.
        assert_eq!(
            decoder.feed(b"x", &mut Vec::new()),
            Err(AuthError::SignatureDoesNotMatch)
        );
    }
    // Chunks in the wrong order break the chain.
    let mut swapped = Vec::new();
    swapped
        .extend_from_slice(format!("400;chunk-signature={}\r\n", CHUNK_SIGNATURES[1]).as_bytes());
    swapped.extend_from_slice(&[b'a'; 1024]);
    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, None);
    assert_eq!(
        decoder.feed(&swapped, &mut Vec::new()),
        Err(AuthError::SignatureDoesNotMatch)
    );
    // A different seed (another request's signature) fails at once.
    let other = example_verified(TRAILER_SEED, PayloadMode::StreamingSigned);
    let mut decoder = ChunkedDecoder::new(&other.payload, &other, None);
    assert_eq!(
        decode_in_pieces(&mut decoder, &body, 70_000).unwrap_err(),
        AuthError::SignatureDoesNotMatch
    );
}

#[test]
fn trailer_tampering_fails() {
    let verified = example_verified(TRAILER_SEED, PayloadMode::StreamingSignedTrailer);
    let body = trailer_chunked_body();
    let text = String::from_utf8(body.clone()).unwrap();
    let cases = [
        text.replace("sOO8/Q==", "sOO8/Q=A"),
        text.replace("x-amz-checksum-crc32c:", "x-amz-checksum-crc32:"),
        text.replace(TRAILER_SIGNATURE, TRAILER_CHUNK_SIGNATURES[2]),
    ];
    for tampered in &cases {
        let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, None);
        let err = decode_in_pieces(&mut decoder, tampered.as_bytes(), 1).unwrap_err();
        assert_eq!(err, AuthError::SignatureDoesNotMatch);
    }
    // Without the trailer signature the body never completes.
    let unsigned_end = text.replace(
        &format!("x-amz-trailer-signature:{TRAILER_SIGNATURE}\r\n"),
        "",
    );
    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, None);
    assert!(matches!(
        decode_in_pieces(&mut decoder, unsigned_end.as_bytes(), 512),
        Err(AuthError::ChunkMalformed(_))
    ));
}

#[test]
fn trailer_after_blank_line_is_tolerated() {
    let verified = example_verified(TRAILER_SEED, PayloadMode::StreamingSignedTrailer);
    let text = String::from_utf8(trailer_chunked_body()).unwrap();
    let variant = text.replace("\r\nx-amz-checksum-crc32c", "\r\n\r\nx-amz-checksum-crc32c");
    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, Some(66_560));
    decode_in_pieces(&mut decoder, variant.as_bytes(), 1).unwrap();
    assert_eq!(decoder.trailers().len(), 1);
}

#[test]
fn unsigned_trailer_body() {
    let verified = example_verified(CHUNKED_SEED, PayloadMode::StreamingUnsignedTrailer);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let crc = crc32c::crc32c(&data);
    let mut body = Vec::new();
    for piece in data.chunks(8192) {
        body.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        body.extend_from_slice(piece);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("0\r\nx-amz-checksum-crc32c:{crc:08x}\r\n\r\n").as_bytes());
    for piece_bytes in [1, 5, 8193, usize::MAX] {
        let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, Some(20_000));
        let out = decode_in_pieces(&mut decoder, &body, piece_bytes).unwrap();
        assert_eq!(out, data);
        assert_eq!(decoder.trailers()[0].1, format!("{crc:08x}"));
    }
    // No trailers at all.
    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, None);
    let out = decode_in_pieces(&mut decoder, b"3\r\nabc\r\n0\r\n\r\n", 1).unwrap();
    assert_eq!(out, b"abc");
}

#[test]
fn chunked_stops_at_end_of_body() {
    let verified = example_verified(CHUNKED_SEED, PayloadMode::StreamingUnsignedTrailer);
    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, None);
    let mut out = Vec::new();
    let used = decoder
        .feed(b"1\r\nz\r\n0\r\n\r\nGET / HTTP/1.1", &mut out)
        .unwrap();
    assert_eq!(used, 11);
    assert!(decoder.is_done());
    assert_eq!(out, b"z");
}

#[test]
fn chunked_length_checks() {
    let verified = example_verified(CHUNKED_SEED, PayloadMode::StreamingSigned);
    for announced in [66_559, 66_561, 0] {
        let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, Some(announced));
        let err = decode_in_pieces(&mut decoder, &signed_chunked_body(), 4096).unwrap_err();
        assert_eq!(err, AuthError::IncompleteBody, "announced {announced}");
    }
    let body = signed_chunked_body();
    let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, Some(66_560));
    let err = decode_in_pieces(&mut decoder, &body[..body.len() - 1], 4096).unwrap_err();
    assert_eq!(err, AuthError::IncompleteBody);
    assert_eq!(err.s3_code(), "IncompleteBody");
}

#[test]
fn chunked_bounds() {
    let verified = example_verified(CHUNKED_SEED, PayloadMode::StreamingUnsignedTrailer);
    let malformed = |body: &[u8]| {
        let mut decoder = ChunkedDecoder::new(&verified.payload, &verified, None);
        let err = decode_in_pieces(&mut decoder, body, 1).unwrap_err();
        assert!(matches!(err, AuthError::ChunkMalformed(_)), "{err:?}");
        assert_eq!(err.http_status(), 400);
    };
    let long_header = format!("1;{}\r\nz\r\n0\r\n\r\n", "x".repeat(CHUNK_LINE_BYTES_MAX));
    malformed(long_header.as_bytes());
    malformed(b"1000001\r\n");
    malformed(b"10000000000000000\r\n");
    malformed(b"\r\n");
    malformed(b"xyz\r\n");
    malformed(b"1\nz\r\n");
    malformed(b"1\r\nzz\r\n");
    let mut many = b"0\r\n".to_vec();
    for i in 0..=TRAILERS_MAX {
        many.extend_from_slice(format!("x-amz-meta-{i}:v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    malformed(&many);
    let long_trailer = format!(
        "0\r\nx-amz-checksum-crc32:{}\r\n\r\n",
        "A".repeat(CHUNK_LINE_BYTES_MAX)
    );
    malformed(long_trailer.as_bytes());
    malformed(b"0\r\nno colon here\r\n\r\n");

    // Signed chunks need a valid chunk-signature.
    let signed = example_verified(CHUNKED_SEED, PayloadMode::StreamingSigned);
    let mut decoder = ChunkedDecoder::new(&signed.payload, &signed, None);
    assert!(matches!(
        decoder.feed(b"1;chunk-signature=abc\r\n", &mut Vec::new()),
        Err(AuthError::ChunkMalformed(_))
    ));
    // Only streaming modes decode.
    let plain = example_verified(CHUNKED_SEED, PayloadMode::Unsigned);
    let mut decoder = ChunkedDecoder::new(&plain.payload, &plain, None);
    assert!(decoder.feed(b"0\r\n\r\n", &mut Vec::new()).is_err());
}

#[test]
fn error_codes() {
    let cases = [
        (
            AuthError::SignatureDoesNotMatch,
            "SignatureDoesNotMatch",
            403,
        ),
        (AuthError::InvalidAccessKeyId, "InvalidAccessKeyId", 403),
        (AuthError::RequestTimeTooSkewed, "RequestTimeTooSkewed", 403),
        (
            AuthError::ContentSha256Mismatch,
            "XAmzContentSHA256Mismatch",
            400,
        ),
        (
            AuthError::Malformed("x".into()),
            "AuthorizationHeaderMalformed",
            400,
        ),
        (AuthError::UnsupportedAlgorithm, "InvalidRequest", 400),
    ];
    for (err, code, status) in cases {
        assert_eq!((err.s3_code(), err.http_status()), (code, status));
        assert!(!err.message().is_empty());
    }
    let verified = example_verified(CHUNKED_SEED, PayloadMode::Unsigned);
    assert!(!format!("{verified:?}").contains("signing_key"));
}
