//! AWS Signature Version 4 (and 2) verification for incoming S3 requests,
//! and the `aws-chunked` body decoder used by streaming (per-chunk signed)
//! uploads. This file holds the types, the entry point [`verify`] and small
//! helpers; `header` checks the SigV4 Authorization header, `presign`
//! SigV4 presigned URLs, `canonical` the canonical request and signature
//! both share, `sigv2` Signature Version 2 (header and presigned),
//! `chunked` the aws-chunked decoder.
//!
//! Pure synchronous code: the HTTP layer hands in the request target and the
//! headers exactly as received and gets back who signed the request and how
//! its body is protected. Nothing here allocates per byte of body, and every
//! buffer is bounded, because all of this runs before the caller is known.

use crate::frontend::http::civil_from_days;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use percent_encoding::percent_decode_str;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

mod canonical;
mod chunked;
mod header;
mod presign;
mod sigv2;
#[cfg(test)]
mod tests;

use canonical::*;
pub use chunked::ChunkedDecoder;
use header::*;
use presign::*;
pub use sigv2::sign_v2;

type HmacSha256 = Hmac<Sha256>;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
const SERVICE: &str = "s3";
const TERMINATOR: &str = "aws4_request";
/// AWS caps presigned URLs at seven days.
const PRESIGN_EXPIRES_SECS_MAX: u64 = 604_800;
/// Hex SHA-256 of the empty string; every chunk string-to-sign carries it.
const EMPTY_SHA256_HEX: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";
/// Every request header with this prefix must be covered by the signature.
const AMZ_HEADER_PREFIX: &str = "x-amz-";
const STREAMING_SIGNED: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
const STREAMING_SIGNED_TRAILER: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
const STREAMING_UNSIGNED_TRAILER: &str = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

/// Longest chunk header or trailer line, CRLF excluded.
pub const CHUNK_LINE_BYTES_MAX: usize = 4096;
/// Largest single aws-chunked chunk we accept (SDKs send 64 KiB .. 8 MiB).
pub const CHUNK_BYTES_MAX: u64 = 16 << 20;
/// Most trailer lines (besides the trailer signature) we accept.
pub const TRAILERS_MAX: usize = 16;

/// One request header as received: name in any case, raw value bytes.
#[derive(Debug, Clone, Copy)]
pub struct HeaderView<'a> {
    pub name: &'a str,
    pub value: &'a [u8],
}

/// The parts of a request that SigV4 covers, exactly as received.
#[derive(Debug, Clone, Copy)]
pub struct AuthInput<'a> {
    pub method: &'a str,
    /// Request-target path as the client sent it (percent-encoded), no query.
    pub raw_path: &'a str,
    /// Everything after '?', as received; "" if none.
    pub raw_query: &'a str,
    /// In arrival order; duplicates possible.
    pub headers: &'a [HeaderView<'a>],
    /// The bucket a virtual-hosted request names in its Host header (SigV2
    /// signs `/bucket` + path; SigV4 signs the path as sent).
    pub virtual_bucket: Option<&'a str>,
}

/// How the request body is protected, from `x-amz-content-sha256`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadMode {
    /// `UNSIGNED-PAYLOAD`, or a presigned URL without a content hash.
    Unsigned,
    /// The body must hash to this; the caller checks after reading the body.
    Sha256([u8; 32]),
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD`: aws-chunked, every chunk signed.
    StreamingSigned,
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER`: as above plus signed trailers.
    StreamingSignedTrailer,
    /// `STREAMING-UNSIGNED-PAYLOAD-TRAILER`: aws-chunked, unsigned chunks and trailers.
    StreamingUnsignedTrailer,
}

impl PayloadMode {
    /// True for the aws-chunked modes, whose body goes through [`ChunkedDecoder`].
    pub fn is_streaming(&self) -> bool {
        matches!(
            self,
            Self::StreamingSigned | Self::StreamingSignedTrailer | Self::StreamingUnsignedTrailer
        )
    }

    /// For `Sha256` mode: compare the hash of the body actually read.
    /// Other modes carry no body hash and always pass.
    pub fn check_body_sha256(&self, body_sha256: &[u8; 32]) -> Result<(), AuthError> {
        match self {
            Self::Sha256(expected) if !bool::from(expected.ct_eq(body_sha256)) => {
                Err(AuthError::ContentSha256Mismatch)
            }
            _ => Ok(()),
        }
    }

    fn parse(value: &str) -> Option<Self> {
        match value {
            UNSIGNED_PAYLOAD => Some(Self::Unsigned),
            STREAMING_SIGNED => Some(Self::StreamingSigned),
            STREAMING_SIGNED_TRAILER => Some(Self::StreamingSignedTrailer),
            STREAMING_UNSIGNED_TRAILER => Some(Self::StreamingUnsignedTrailer),
            _ => parse_hex32(value).map(Self::Sha256),
        }
    }
}

/// A request whose signature checked out.
#[derive(Clone)]
pub struct Verified {
    /// Who signed: set by the front door from the access key (the auth
    /// module leaves it Anonymous, the fail-closed value).
    pub principal: crate::access::Principal,
    pub access_key: String,
    pub payload: PayloadMode,
    /// Derived kSigning, for chunk and trailer signatures.
    pub signing_key: [u8; 32],
    /// The request signature; aws-chunked chains its first chunk from it.
    pub seed_signature: [u8; 32],
    /// The signing timestamp in ISO 8601 basic form, e.g. 20130524T000000Z.
    pub amz_date: String,
    /// "20130524/us-east-1/s3/aws4_request".
    pub scope: String,
    /// Content-MD5 is covered by the signature (SigV4: named in
    /// SignedHeaders; SigV2: always in its string-to-sign), so a body it
    /// matches is the body the signer meant.
    pub content_md5_signed: bool,
}

impl Verified {
    /// A request without any signature.
    pub fn anonymous() -> Verified {
        Verified {
            principal: crate::access::Principal::Anonymous,
            access_key: String::new(),
            payload: PayloadMode::Unsigned,
            signing_key: [0; 32],
            seed_signature: [0; 32],
            amz_date: String::new(),
            scope: String::new(),
            content_md5_signed: false,
        }
    }
}

impl std::fmt::Debug for Verified {
    // Hand-written so the signing key never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verified")
            .field("access_key", &self.access_key)
            .field("payload", &self.payload)
            .field("amz_date", &self.amz_date)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Why a request failed authentication (or its aws-chunked body failed to decode).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No Authorization header and no presigned query: anonymous.
    #[error("request carries no authentication")]
    Missing,
    /// The Authorization header could not be parsed or is inconsistent.
    #[error("malformed authorization header: {0}")]
    Malformed(String),
    /// The presigned-URL query parameters could not be parsed or are inconsistent.
    #[error("malformed presigned query: {0}")]
    QueryMalformed(String),
    #[error("unknown access key id")]
    InvalidAccessKeyId,
    #[error("signature does not match")]
    SignatureDoesNotMatch,
    #[error("request time too skewed")]
    RequestTimeTooSkewed,
    /// Presigned URL past X-Amz-Date + X-Amz-Expires.
    #[error("presigned request has expired")]
    Expired,
    /// Presigned URL dated further in the future than the allowed skew.
    #[error("presigned request is not valid yet")]
    NotYetValid,
    /// Neither x-amz-date nor a parseable Date header.
    #[error("missing or invalid request date")]
    MissingDate,
    /// Not AWS4-HMAC-SHA256 (SigV2, SigV4A, ...).
    #[error("unsupported authorization algorithm")]
    UnsupportedAlgorithm,
    /// Header auth without x-amz-content-sha256.
    #[error("missing x-amz-content-sha256")]
    MissingContentSha256,
    /// x-amz-content-sha256 is neither a known mode nor 64 hex digits.
    #[error("invalid x-amz-content-sha256")]
    InvalidContentSha256,
    /// The body does not hash to x-amz-content-sha256.
    #[error("body does not match x-amz-content-sha256")]
    ContentSha256Mismatch,
    /// Both an Authorization header and presigned query parameters.
    #[error("more than one authentication mechanism")]
    ConflictingAuth,
    /// The aws-chunked framing is broken or exceeds a bound.
    #[error("malformed aws-chunked body: {0}")]
    ChunkMalformed(String),
    /// The decoded body is shorter or longer than announced.
    #[error("body length does not match the announced length")]
    IncompleteBody,
    /// `x-amz-*` headers (named, lowercased) that the signature does not
    /// cover: anyone holding the signed request could add them.
    #[error("x-amz-* headers not covered by the signature: {0}")]
    UnsignedHeaders(String),
}

impl AuthError {
    /// The S3 error code for the XML error body.
    pub fn s3_code(&self) -> &'static str {
        match self {
            Self::Missing
            | Self::Expired
            | Self::NotYetValid
            | Self::MissingDate
            | Self::UnsignedHeaders(_) => "AccessDenied",
            Self::Malformed(_) => "AuthorizationHeaderMalformed",
            Self::QueryMalformed(_) => "AuthorizationQueryParametersError",
            Self::InvalidAccessKeyId => "InvalidAccessKeyId",
            Self::SignatureDoesNotMatch => "SignatureDoesNotMatch",
            Self::RequestTimeTooSkewed => "RequestTimeTooSkewed",
            Self::UnsupportedAlgorithm | Self::MissingContentSha256 | Self::ChunkMalformed(_) => {
                "InvalidRequest"
            }
            Self::InvalidContentSha256 | Self::ConflictingAuth => "InvalidArgument",
            Self::ContentSha256Mismatch => "XAmzContentSHA256Mismatch",
            Self::IncompleteBody => "IncompleteBody",
        }
    }

    pub fn http_status(&self) -> u16 {
        match self {
            Self::Missing
            | Self::InvalidAccessKeyId
            | Self::SignatureDoesNotMatch
            | Self::RequestTimeTooSkewed
            | Self::Expired
            | Self::NotYetValid
            | Self::MissingDate
            | Self::UnsignedHeaders(_) => 403,
            Self::Malformed(_)
            | Self::QueryMalformed(_)
            | Self::UnsupportedAlgorithm
            | Self::MissingContentSha256
            | Self::InvalidContentSha256
            | Self::ContentSha256Mismatch
            | Self::ConflictingAuth
            | Self::ChunkMalformed(_)
            | Self::IncompleteBody => 400,
        }
    }

    /// Human-readable message for the XML error body (S3's wording where it has one).
    pub fn message(&self) -> String {
        let text = match self {
            Self::Missing => "Access Denied",
            Self::Malformed(detail) | Self::QueryMalformed(detail) | Self::ChunkMalformed(detail) => {
                return detail.clone()
            }
            Self::InvalidAccessKeyId => {
                "The AWS Access Key Id you provided does not exist in our records."
            }
            Self::SignatureDoesNotMatch => {
                "The request signature we calculated does not match the signature you provided. \
                 Check your key and signing method."
            }
            Self::RequestTimeTooSkewed => {
                "The difference between the request time and the current time is too large."
            }
            Self::Expired => "Request has expired",
            Self::NotYetValid => "Request is not valid yet",
            Self::MissingDate => "AWS authentication requires a valid Date or x-amz-date header",
            Self::UnsupportedAlgorithm => {
                "The authorization mechanism you have provided is not supported. \
                 Please use AWS4-HMAC-SHA256."
            }
            Self::MissingContentSha256 => {
                "Missing required header for this request: x-amz-content-sha256"
            }
            Self::InvalidContentSha256 => {
                "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, \
                 STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER, STREAMING-UNSIGNED-PAYLOAD-TRAILER \
                 or a valid sha256 value."
            }
            Self::ContentSha256Mismatch => {
                "The provided 'x-amz-content-sha256' header does not match what was computed."
            }
            Self::ConflictingAuth => "Only one auth mechanism allowed",
            Self::IncompleteBody => {
                "You did not provide the number of bytes specified by the Content-Length HTTP header."
            }
            Self::UnsignedHeaders(_) => {
                "There were headers present in the request which were not signed"
            }
        };
        text.to_string()
    }
}

/// Verify header auth (`Authorization: AWS4-HMAC-SHA256 Credential=.., SignedHeaders=.., Signature=..`)
/// or query auth (presigned URL: X-Amz-Algorithm, X-Amz-Credential, X-Amz-Date, X-Amz-Expires,
/// X-Amz-SignedHeaders, X-Amz-Signature), or their Signature Version 2 forms
/// (`Authorization: AWS AK:sig`; AWSAccessKeyId, Expires, Signature): `sigv2`.
///
/// `secret_for(access_key)` returns the secret or None. `now` is the server clock; header auth
/// rejects |now - request date| > `max_skew` with RequestTimeTooSkewed.
pub fn verify(
    input: &AuthInput,
    secret_for: &dyn Fn(&str) -> Option<String>,
    now: SystemTime,
    max_skew: Duration,
) -> Result<Verified, AuthError> {
    let authorization = single_header(input.headers, "authorization", AuthError::Malformed)?;
    let query_auth = classify_query_auth(input.raw_query);
    match (authorization, query_auth) {
        (Some(_), QueryAuth::SigV4 | QueryAuth::SigV2) => Err(AuthError::ConflictingAuth),
        (Some(value), _) if sigv2::is_v2_authorization(value) => {
            sigv2::verify_v2_header(input, value, secret_for, now, max_skew)
        }
        (Some(value), _) => verify_header_auth(input, value, secret_for, now, max_skew),
        (None, QueryAuth::SigV4) => verify_query_auth(input, secret_for, now, max_skew),
        (None, QueryAuth::SigV2) => sigv2::verify_v2_query(input, secret_for, now),
        (None, QueryAuth::None) => Err(AuthError::Missing),
    }
}

/// Derive kSigning = HMAC(HMAC(HMAC(HMAC("AWS4"+secret, date), region), service), "aws4_request").
pub fn signing_key(secret: &str, date_yyyymmdd: &str, region: &str, service: &str) -> [u8; 32] {
    let mut k_secret = Vec::with_capacity(4 + secret.len());
    k_secret.extend_from_slice(b"AWS4");
    k_secret.extend_from_slice(secret.as_bytes());
    let k_date = hmac_sha256(&k_secret, &[date_yyyymmdd.as_bytes()]);
    let k_region = hmac_sha256(&k_date, &[region.as_bytes()]);
    let k_service = hmac_sha256(&k_region, &[service.as_bytes()]);
    hmac_sha256(&k_service, &[TERMINATOR.as_bytes()])
}

// ---------------------------------------------------------------------------
// Small helpers

/// Raw `name=value` pairs of a query string; '=' missing means empty value.
fn query_pairs(raw_query: &str) -> impl Iterator<Item = (&str, &str)> {
    raw_query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// Decodes presigned-URL parameter `name` into `slot`, refusing one that
/// is not UTF-8 or given twice.
fn set_query_param(slot: &mut Option<String>, name: &str, value: &str) -> Result<(), AuthError> {
    let decoded = percent_decode_str(value)
        .decode_utf8()
        .map_err(|_| AuthError::QueryMalformed(format!("{name} is not valid UTF-8")))?;
    if slot.replace(decoded.into_owned()).is_some() {
        return Err(AuthError::QueryMalformed(format!(
            "{name} given more than once"
        )));
    }
    Ok(())
}

/// The value of a header that must appear at most once.
fn single_header<'a>(
    headers: &[HeaderView<'a>],
    name: &str,
    err: fn(String) -> AuthError,
) -> Result<Option<&'a [u8]>, AuthError> {
    let mut found = None;
    for header in headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)) {
        if found.replace(header.value).is_some() {
            return Err(err(format!("header {name} given more than once")));
        }
    }
    Ok(found)
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

fn hex_encode32(bytes: &[u8; 32], out: &mut [u8; 64]) {
    // Cannot fail: the output is exactly twice the input.
    let _ = hex::encode_to_slice(bytes, out);
}

fn parse_hex32(value: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if value.len() != 64 {
        return None;
    }
    hex::decode_to_slice(value, &mut out).ok()?;
    Some(out)
}

fn hex_val(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// Trim HTTP optional whitespace (spaces and tabs).
fn trim_ows(s: &str) -> &str {
    s.trim_matches(|c| c == ' ' || c == '\t')
}

fn unix_secs(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_secs() as i64,
        Err(before) => -(before.duration().as_secs() as i64),
    }
}

fn secs_apart(a: i64, b: i64) -> u64 {
    a.abs_diff(b)
}

/// Parse `YYYYMMDDTHHMMSSZ` to unix seconds.
fn parse_amz_date(value: &str) -> Option<i64> {
    let b = value.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        b[range].iter().try_fold(0i64, |acc, &d| {
            d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
        })
    };
    let (year, month, day) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (hour, minute, second) = (digits(9..11)?, digits(11..13)?, digits(13..15)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Unix seconds to `YYYYMMDDTHHMMSSZ`.
fn format_amz_date(secs: i64) -> String {
    let (days, secs_of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    )
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Whether `name` is one of the `;`-separated SignedHeaders.
pub(super) fn signs(signed_headers: &str, name: &str) -> bool {
    signed_headers
        .split(';')
        .any(|h| h.trim().eq_ignore_ascii_case(name))
}
