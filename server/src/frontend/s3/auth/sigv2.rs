//! AWS Signature Version 2: `Authorization: AWS AKID:signature` and
//! presigned URLs with `AWSAccessKeyId`, `Expires` and `Signature`. This is
//! what boto3's `generate_presigned_url` makes unless told otherwise, and
//! what s3cmd and older SDKs sign with.
//!
//! The signature is base64 HMAC-SHA1, keyed with the secret, of
//!
//! ```text
//! VERB \n Content-MD5 \n Content-Type \n Date \n CanonicalizedAmzHeaders CanonicalizedResource
//! ```
//!
//! - Date: the `Date` header; empty when `x-amz-date` is present (it is
//!   signed among the amz headers instead); for a presigned URL, `Expires`.
//! - CanonicalizedAmzHeaders: every `x-amz-*` header, name lower-cased,
//!   sorted, as `name:value\n`. Every such header is signed by
//!   construction; a repeated one is refused (SigV2 would join the values,
//!   the handlers read one).
//! - CanonicalizedResource: `/bucket` for a virtual-hosted request, the path
//!   as sent (`/bucket/` for a bucket itself), then the sub-resources of the
//!   query (`SUBRESOURCES`), sorted, with their values decoded (`?acl`,
//!   `?partNumber=..&uploadId=..`).
//!
//! SigV2 signs only those sub-resources, so whatever the router reads from
//! the query must be signed as the router reads it: a percent-encoded
//! parameter name, a `&` in a decoded sub-resource value, a repeated
//! sub-resource, and a query naming an operation SigV2 does not sign
//! (`UNSIGNED_OPERATIONS`) are refused. Listing parameters (`prefix`,
//! `max-keys`, ...) are not signed, by SigV2's design: a presigned listing
//! URL can list the whole bucket.
//!
//! The checks are SigV4's: the request date within the skew (header auth),
//! an expiry in the future and at most seven days ahead (presigned), a
//! constant-time comparison of the signature. SigV2 signs no payload: a
//! body is checked against `x-amz-content-sha256` only if the client sent a
//! hash there (aws-chunked uploads need SigV4).

use std::time::{Duration, SystemTime};

use base64::Engine;
use sha1::Sha1;

use super::*;

type HmacSha1 = Hmac<Sha1>;

/// Query parameters that belong to the resource signed by SigV2, as
/// botocore lists them (a name botocore does not sign here would fail
/// every botocore request that uses it).
const SUBRESOURCES: &[&str] = &[
    "accelerate",
    "acl",
    "analytics",
    "cors",
    "delete",
    "inventory",
    "lifecycle",
    "location",
    "logging",
    "metrics",
    "notification",
    "object-lock",
    "partNumber",
    "policy",
    "replication",
    "requestPayment",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
    "restore",
    "select",
    "select-type",
    "storageClass",
    "tagging",
    "torrent",
    "uploadId",
    "uploads",
    "versionId",
    "versioning",
    "versions",
    "website",
];

/// Query parameters that select an operation in percore's router but are
/// not in SigV2's signed resource: a request carrying one is refused (it
/// needs SigV4), so that no SigV2 signature covers an operation it did not
/// sign.
const UNSIGNED_OPERATIONS: &[&str] = &[
    "attributes",
    "encryption",
    "legal-hold",
    "policyStatus",
    "publicAccessBlock",
    "retention",
];

/// Refuses a SigV2 request whose query selects an operation that SigV2
/// does not sign (`UNSIGNED_OPERATIONS`).
fn check_signable(input: &AuthInput, err: fn(String) -> AuthError) -> Result<(), AuthError> {
    for (name, _) in query_pairs(input.raw_query) {
        if UNSIGNED_OPERATIONS.contains(&name) {
            return Err(err(format!(
                "the ?{name} operation is not covered by Signature Version 2; sign it with SigV4"
            )));
        }
    }
    Ok(())
}

/// True if an Authorization header value is SigV2's (`AWS AKID:sig`).
pub(super) fn is_v2_authorization(value: &[u8]) -> bool {
    value.starts_with(b"AWS ")
}

/// Header auth: `Authorization: AWS AKID:base64(HMAC-SHA1)`.
pub(super) fn verify_v2_header(
    input: &AuthInput,
    authorization: &[u8],
    secret_for: &dyn Fn(&str) -> Option<String>,
    now: SystemTime,
    max_skew: Duration,
) -> Result<Verified, AuthError> {
    check_signable(input, AuthError::Malformed)?;
    let value = std::str::from_utf8(authorization)
        .map_err(|_| AuthError::Malformed("authorization header is not ASCII".into()))?;
    let rest = trim_ows(value.get(4..).unwrap_or(""));
    let (access_key, signature) = rest
        .rsplit_once(':')
        .filter(|(a, s)| !a.is_empty() && !s.is_empty())
        .ok_or_else(|| {
            AuthError::Malformed("expected Authorization: AWS AccessKeyId:Signature".into())
        })?;
    let amz_date = single_header(input.headers, "x-amz-date", AuthError::Malformed)?;
    let date = match amz_date {
        Some(v) => v,
        None => single_header(input.headers, "date", AuthError::Malformed)?
            .ok_or(AuthError::MissingDate)?,
    };
    let date = std::str::from_utf8(date).map_err(|_| AuthError::MissingDate)?;
    let date = trim_ows(date);
    let date_secs = parse_v2_date(date).ok_or(AuthError::MissingDate)?;
    let secret = secret_for(access_key).ok_or(AuthError::InvalidAccessKeyId)?;
    if secs_apart(unix_secs(now), date_secs) > max_skew.as_secs() {
        return Err(AuthError::RequestTimeTooSkewed);
    }
    // With x-amz-date, the Date line is empty (x-amz-date is signed among
    // the amz headers).
    let date_line = if amz_date.is_some() { "" } else { date };
    let to_sign = string_to_sign(input, date_line, false)?;
    check_v2_signature(&secret, &to_sign, signature, AuthError::Malformed)?;
    verified(input, access_key)
}

/// Query auth: `AWSAccessKeyId`, `Expires` (unix seconds), `Signature`.
pub(super) fn verify_v2_query(
    input: &AuthInput,
    secret_for: &dyn Fn(&str) -> Option<String>,
    now: SystemTime,
) -> Result<Verified, AuthError> {
    check_signable(input, AuthError::QueryMalformed)?;
    let (mut access_key, mut expires, mut signature) = (None, None, None);
    for (name, value) in query_pairs(input.raw_query) {
        let slot = match name {
            "AWSAccessKeyId" => &mut access_key,
            "Expires" => &mut expires,
            "Signature" => &mut signature,
            _ => continue,
        };
        set_query_param(slot, name, value)?;
    }
    let need = |v: Option<String>, name: &str| {
        v.filter(|v| !v.is_empty()).ok_or_else(|| {
            AuthError::QueryMalformed(format!(
                "Query-string authentication requires the AWSAccessKeyId, Expires and \
                 Signature parameters ({name} is missing)"
            ))
        })
    };
    let access_key = need(access_key, "AWSAccessKeyId")?;
    let expires_text = need(expires, "Expires")?;
    let signature = need(signature, "Signature")?;
    let expires: i64 = expires_text
        .parse()
        .map_err(|_| AuthError::QueryMalformed("Expires must be unix seconds".into()))?;
    let secret = secret_for(&access_key).ok_or(AuthError::InvalidAccessKeyId)?;
    let now = unix_secs(now);
    if now > expires {
        return Err(AuthError::Expired);
    }
    if expires.saturating_sub(now) > PRESIGN_EXPIRES_SECS_MAX as i64 {
        return Err(AuthError::QueryMalformed(
            "Expires must be less than a week (604800 seconds) in the future".into(),
        ));
    }
    let to_sign = string_to_sign(input, &expires_text, true)?;
    check_v2_signature(&secret, &to_sign, &signature, AuthError::QueryMalformed)?;
    verified(input, &access_key)
}

/// What a SigV2 request carries: no signing key or seed (those are for
/// aws-chunked bodies, which need SigV4), and a body hash only if the
/// client sent one in `x-amz-content-sha256`.
fn verified(input: &AuthInput, access_key: &str) -> Result<Verified, AuthError> {
    let payload = match single_header(input.headers, "x-amz-content-sha256", AuthError::Malformed)?
    {
        None => PayloadMode::Unsigned,
        Some(v) => {
            let v = std::str::from_utf8(v).map_err(|_| AuthError::InvalidContentSha256)?;
            match PayloadMode::parse(trim_ows(v)).ok_or(AuthError::InvalidContentSha256)? {
                p if p.is_streaming() => return Err(AuthError::UnsupportedAlgorithm),
                p => p,
            }
        }
    };
    Ok(Verified {
        principal: crate::access::Principal::Anonymous,
        access_key: access_key.to_string(),
        payload,
        signing_key: [0; 32],
        seed_signature: [0; 32],
        amz_date: String::new(),
        scope: String::new(),
        content_md5_signed: true,
    })
}

/// `x-amz-date` or `Date`: RFC 1123 (what SigV2 clients send), or the ISO
/// 8601 basic form.
fn parse_v2_date(value: &str) -> Option<i64> {
    // RFC 1123 allows a numeric zone; "+0000" is GMT (the AWS examples).
    let gmt = value.strip_suffix(" +0000").map(|v| format!("{v} GMT"));
    if let Ok(t) = httpdate::parse_http_date(gmt.as_deref().unwrap_or(value)) {
        return Some(unix_secs(t));
    }
    parse_amz_date(value)
}

/// The string to sign (see the module doc); `presigned` leaves the
/// `Signature`, `AWSAccessKeyId` and `Expires` parameters out (they are no
/// sub-resources anyway).
pub(super) fn string_to_sign(
    input: &AuthInput,
    date_line: &str,
    presigned: bool,
) -> Result<Vec<u8>, AuthError> {
    let err = if presigned {
        AuthError::QueryMalformed
    } else {
        AuthError::Malformed
    };
    let header = |name: &str| -> Result<&[u8], AuthError> {
        Ok(
            single_header(input.headers, name, err)?.map_or(&b""[..], |v| {
                std::str::from_utf8(v).map_or(v, |s| trim_ows(s).as_bytes())
            }),
        )
    };
    let mut out = Vec::with_capacity(256 + input.raw_path.len());
    out.extend_from_slice(input.method.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(header("content-md5")?);
    out.push(b'\n');
    out.extend_from_slice(header("content-type")?);
    out.push(b'\n');
    out.extend_from_slice(date_line.as_bytes());
    out.push(b'\n');
    push_amz_headers(&mut out, input, err)?;
    push_resource(&mut out, input, err)?;
    Ok(out)
}

/// CanonicalizedAmzHeaders (see the module doc).
fn push_amz_headers(
    out: &mut Vec<u8>,
    input: &AuthInput,
    err: fn(String) -> AuthError,
) -> Result<(), AuthError> {
    let mut amz: Vec<(String, Vec<&[u8]>)> = Vec::new();
    for h in input.headers {
        let name = h.name.to_ascii_lowercase();
        if !name.starts_with(AMZ_HEADER_PREFIX) {
            continue;
        }
        let value = std::str::from_utf8(h.value).map_or(h.value, |s| trim_ows(s).as_bytes());
        // SigV2 joins repeated headers with ','; the handlers read one of
        // them, so a repeat could carry a value the signer never meant.
        if amz.iter().any(|(n, _)| *n == name) {
            return Err(err(format!("header {name} given more than once")));
        }
        amz.push((name, vec![value]));
    }
    amz.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, values) in &amz {
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(v);
        }
        out.push(b'\n');
    }
    Ok(())
}

/// CanonicalizedResource (see the module doc).
fn push_resource(
    out: &mut Vec<u8>,
    input: &AuthInput,
    err: fn(String) -> AuthError,
) -> Result<(), AuthError> {
    // CanonicalizedResource. The pieces are joined without separators, so
    // each must be what the router will take it for: a path that starts
    // with '/', a bucket without one.
    if !input.raw_path.is_empty() && !input.raw_path.starts_with('/') {
        return Err(err("the request path must start with '/'".into()));
    }
    if let Some(bucket) = input.virtual_bucket {
        if bucket.is_empty() || bucket.contains('/') {
            return Err(err(format!("invalid bucket {bucket:?} in the Host header")));
        }
        out.push(b'/');
        out.extend_from_slice(bucket.as_bytes());
    }
    let path = if input.raw_path.is_empty() {
        "/"
    } else {
        input.raw_path
    };
    out.extend_from_slice(path.as_bytes());
    // A path-style request for a bucket itself signs `/bucket/` whether or
    // not the path ends in '/' (botocore sends `/bucket` and signs
    // `/bucket/`); both name the same bucket operation.
    if input.virtual_bucket.is_none() && path.len() > 1 && !path[1..].contains('/') {
        out.push(b'/');
    }
    let mut subs: Vec<(&str, Option<String>)> = Vec::new();
    for pair in input.raw_query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (pair, None),
        };
        // The router decodes names: `upload%49d` would act as an uploadId
        // that no signature covers.
        if name.contains('%') {
            return Err(err(format!(
                "query parameter names must not be percent-encoded with Signature \
                 Version 2 ({name})"
            )));
        }
        if !SUBRESOURCES.contains(&name) {
            continue;
        }
        if subs.iter().any(|(n, _)| *n == name) {
            return Err(err(format!("{name} given more than once")));
        }
        let value = match value {
            Some(v) => {
                let v = percent_decode_str(v)
                    .decode_utf8()
                    .map_err(|_| err(format!("query parameter {name} is not valid UTF-8")))?;
                // Values are signed decoded: `partNumber=1%26uploadId%3DA`
                // would sign like two sub-resources and route like one.
                if v.contains('&') {
                    return Err(err(format!(
                        "{name} must not contain '&' with Signature Version 2"
                    )));
                }
                Some(v.into_owned())
            }
            None => None,
        };
        subs.push((name, value));
    }
    subs.sort();
    for (i, (name, value)) in subs.iter().enumerate() {
        out.push(if i == 0 { b'?' } else { b'&' });
        out.extend_from_slice(name.as_bytes());
        if let Some(v) = value {
            out.push(b'=');
            out.extend_from_slice(v.as_bytes());
        }
    }
    Ok(())
}

/// The base64 HMAC-SHA1 of `to_sign` must be `given`, compared in
/// constant time.
fn check_v2_signature(
    secret: &str,
    to_sign: &[u8],
    given: &str,
    err: fn(String) -> AuthError,
) -> Result<(), AuthError> {
    let given = base64::engine::general_purpose::STANDARD
        .decode(given.trim())
        .map_err(|_| err("the signature is not base64".into()))?;
    let expected = hmac_sha1(secret, to_sign);
    if given.len() == expected.len() && bool::from(expected.ct_eq(&given[..])) {
        Ok(())
    } else {
        Err(AuthError::SignatureDoesNotMatch)
    }
}

/// The SigV2 signature of `to_sign`: base64 HMAC-SHA1 keyed with `secret`.
pub fn sign_v2(secret: &str, to_sign: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(hmac_sha1(secret, to_sign))
}

fn hmac_sha1(secret: &str, to_sign: &[u8]) -> [u8; 20] {
    let mut mac = match HmacSha1::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(to_sign);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const AK: &str = "AKIAIOSFODNN7EXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    fn secret_for(ak: &str) -> Option<String> {
        (ak == AK).then(|| SECRET.to_string())
    }

    fn at(http_date: &str) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(parse_v2_date(http_date).unwrap() as u64)
    }

    /// The examples of the AWS documentation ("Signing and authenticating
    /// REST requests"): a virtual-hosted GET and PUT.
    #[test]
    fn aws_documentation_examples_verify() {
        let date = "Tue, 27 Mar 2007 19:36:42 +0000";
        let auth = format!("AWS {AK}:qgk2+6Sv9/oM7G3qLEjTH1a1l1g=");
        let headers = [
            HeaderView {
                name: "Host",
                value: b"awsexamplebucket1.us-west-1.s3.amazonaws.com",
            },
            HeaderView {
                name: "Date",
                value: date.as_bytes(),
            },
            HeaderView {
                name: "Authorization",
                value: auth.as_bytes(),
            },
        ];
        let input = AuthInput {
            method: "GET",
            raw_path: "/photos/puppy.jpg",
            raw_query: "",
            headers: &headers,
            virtual_bucket: Some("awsexamplebucket1"),
        };
        let skew = Duration::from_secs(900);
        let v = verify(&input, &secret_for, at(date), skew).unwrap();
        assert_eq!(v.access_key, AK);
        assert_eq!(v.payload, PayloadMode::Unsigned);
        // Path-style: the same resource, signed the same.
        let path_style = AuthInput {
            raw_path: "/awsexamplebucket1/photos/puppy.jpg",
            virtual_bucket: None,
            ..input
        };
        assert!(verify(&path_style, &secret_for, at(date), skew).is_ok());
        // Another time, method or secret does not verify.
        let later = at("Tue, 27 Mar 2007 20:36:42 +0000");
        assert_eq!(
            verify(&input, &secret_for, later, skew).unwrap_err(),
            AuthError::RequestTimeTooSkewed
        );
        let put = AuthInput {
            method: "PUT",
            ..input
        };
        assert_eq!(
            verify(&put, &secret_for, at(date), skew).unwrap_err(),
            AuthError::SignatureDoesNotMatch
        );
        let other = |ak: &str| (ak == AK).then(|| "other".to_string());
        assert_eq!(
            verify(&input, &other, at(date), skew).unwrap_err(),
            AuthError::SignatureDoesNotMatch
        );
        let to_sign = string_to_sign(
            &AuthInput {
                method: "PUT",
                headers: &[HeaderView {
                    name: "Content-Type",
                    value: b"image/jpeg",
                }],
                ..input
            },
            "Tue, 27 Mar 2007 21:15:45 +0000",
            false,
        )
        .unwrap();
        assert_eq!(sign_v2(SECRET, &to_sign), "iqRzw+ileNPu1fhspnRs8nOjjIA=");
    }

    /// x-amz-* headers are signed (sorted, lower-cased, repeated values
    /// joined); with x-amz-date the Date line is empty; sub-resources are
    /// in the resource, other query parameters are not.
    #[test]
    fn string_to_sign_follows_the_canonical_form() {
        let headers = [
            HeaderView {
                name: "X-Amz-Meta-B",
                value: b" two ",
            },
            HeaderView {
                name: "x-amz-date",
                value: b"Tue, 27 Mar 2007 19:36:42 +0000",
            },
            HeaderView {
                name: "Content-MD5",
                value: b"md5==",
            },
        ];
        let input = AuthInput {
            method: "PUT",
            raw_path: "/b/k%20y",
            raw_query: "uploadId=u%2B1&partNumber=2&prefix=x&acl",
            headers: &headers,
            virtual_bucket: None,
        };
        let s = String::from_utf8(string_to_sign(&input, "", false).unwrap()).unwrap();
        assert_eq!(
            s,
            "PUT\nmd5==\n\n\nx-amz-date:Tue, 27 Mar 2007 19:36:42 +0000\n\
             x-amz-meta-b:two\n/b/k%20y?acl&partNumber=2&uploadId=u+1"
        );
        // Refused: a repeated x-amz header, a percent-encoded name, a '&'
        // hidden in a sub-resource value, a repeated sub-resource, a path
        // or Host bucket that would join ambiguously.
        let twice = [headers[0], headers[0]];
        let bad_inputs = [
            AuthInput {
                headers: &twice,
                ..input
            },
            AuthInput {
                raw_query: "upload%49d=A&partNumber=1",
                ..input
            },
            AuthInput {
                raw_query: "partNumber=1%26uploadId%3DA",
                ..input
            },
            AuthInput {
                raw_query: "acl&acl=x",
                ..input
            },
            AuthInput {
                raw_path: "b/k",
                ..input
            },
            AuthInput {
                virtual_bucket: Some("a/b"),
                ..input
            },
        ];
        for bad in &bad_inputs {
            assert!(
                matches!(string_to_sign(bad, "", false), Err(AuthError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn presigned_query_is_checked() {
        let now = at("Tue, 27 Mar 2007 19:36:42 +0000");
        let secs = unix_secs(now);
        let url = |expires: i64, sig: &str| {
            format!("AWSAccessKeyId={AK}&Expires={expires}&Signature={sig}")
        };
        let sign = |expires: i64| {
            let probe = AuthInput {
                method: "GET",
                raw_path: "/b/k",
                raw_query: "",
                headers: &[],
                virtual_bucket: None,
            };
            let s = sign_v2(
                SECRET,
                &string_to_sign(&probe, &expires.to_string(), true).unwrap(),
            );
            percent_encoding::utf8_percent_encode(&s, percent_encoding::NON_ALPHANUMERIC)
                .to_string()
        };
        let check = |q: &str| {
            let input = AuthInput {
                method: "GET",
                raw_path: "/b/k",
                raw_query: q,
                headers: &[],
                virtual_bucket: None,
            };
            verify(&input, &secret_for, now, Duration::from_secs(900))
        };
        assert!(check(&url(secs + 60, &sign(secs + 60))).is_ok());
        // An operation SigV2 does not sign is refused, not run.
        let attributes = format!("{}&attributes", url(secs + 60, &sign(secs + 60)));
        assert!(matches!(
            check(&attributes).unwrap_err(),
            AuthError::QueryMalformed(_)
        ));
        assert_eq!(
            check(&url(secs - 1, &sign(secs - 1))).unwrap_err(),
            AuthError::Expired
        );
        assert!(matches!(
            check(&url(secs + 8 * 86_400, &sign(secs + 8 * 86_400))).unwrap_err(),
            AuthError::QueryMalformed(_)
        ));
        assert_eq!(
            check(&url(secs + 61, &sign(secs + 60))).unwrap_err(),
            AuthError::SignatureDoesNotMatch
        );
        assert!(matches!(
            check(&format!("AWSAccessKeyId={AK}&Signature=x")).unwrap_err(),
            AuthError::QueryMalformed(_)
        ));
    }
}
