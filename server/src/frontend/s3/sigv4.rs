//! AWS Signature Version 4 verification for incoming S3 requests, and the
//! `aws-chunked` body decoder used by streaming (per-chunk signed) uploads.
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
/// X-Amz-SignedHeaders, X-Amz-Signature).
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
        (Some(_), QueryAuth::SigV4) => Err(AuthError::ConflictingAuth),
        (Some(value), _) => verify_header_auth(input, value, secret_for, now, max_skew),
        (None, QueryAuth::SigV4) => verify_query_auth(input, secret_for, now, max_skew),
        (None, QueryAuth::SigV2) => Err(AuthError::UnsupportedAlgorithm),
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
// Header auth

fn verify_header_auth(
    input: &AuthInput,
    authorization: &[u8],
    secret_for: &dyn Fn(&str) -> Option<String>,
    now: SystemTime,
    max_skew: Duration,
) -> Result<Verified, AuthError> {
    let authorization = std::str::from_utf8(authorization)
        .map_err(|_| AuthError::Malformed("authorization header is not ASCII".into()))?;
    let parsed = parse_authorization(authorization)?;
    let credential = parse_credential(parsed.credential, AuthError::Malformed)?;
    let (amz_date, date_secs) = header_request_date(input.headers)?;
    check_scope_date(&credential, &amz_date, AuthError::Malformed)?;
    let content_sha256 =
        single_header(input.headers, "x-amz-content-sha256", AuthError::Malformed)?
            .ok_or(AuthError::MissingContentSha256)?;
    let content_sha256 =
        std::str::from_utf8(content_sha256).map_err(|_| AuthError::InvalidContentSha256)?;
    let content_sha256 = trim_ows(content_sha256);
    let payload = PayloadMode::parse(content_sha256).ok_or(AuthError::InvalidContentSha256)?;

    let secret = secret_for(credential.access_key).ok_or(AuthError::InvalidAccessKeyId)?;
    if secs_apart(unix_secs(now), date_secs) > max_skew.as_secs() {
        return Err(AuthError::RequestTimeTooSkewed);
    }
    let query = canonical_query(input.raw_query, false);
    let canonical = canonical_request(
        input,
        &query,
        parsed.signed_headers,
        content_sha256,
        AuthError::Malformed,
    )?;
    let key = signing_key(&secret, credential.date, credential.region, SERVICE);
    check_signature(
        &key,
        &amz_date,
        credential.scope,
        &canonical,
        &parsed.signature,
    )?;
    // x-amz-date and x-amz-content-sha256 are in the string-to-sign (as the
    // request date and the hashed payload) even where SignedHeaders omits them.
    check_amz_headers_signed(
        input.headers,
        parsed.signed_headers,
        &[
            ("x-amz-date", &amz_date),
            ("x-amz-content-sha256", content_sha256),
        ],
    )?;
    Ok(Verified {
        access_key: credential.access_key.to_string(),
        payload,
        signing_key: key,
        seed_signature: parsed.signature,
        amz_date,
        scope: credential.scope.to_string(),
    })
}

struct AuthorizationHeader<'a> {
    credential: &'a str,
    signed_headers: &'a str,
    signature: [u8; 32],
}

/// Parse `AWS4-HMAC-SHA256 Credential=.., SignedHeaders=.., Signature=..`
/// (clients differ on whether a space follows each comma).
fn parse_authorization(value: &str) -> Result<AuthorizationHeader<'_>, AuthError> {
    let value = trim_ows(value);
    let (algorithm, rest) = value.split_once(' ').unwrap_or((value, ""));
    if algorithm != ALGORITHM {
        return Err(AuthError::UnsupportedAlgorithm);
    }
    let malformed = |what: &str| AuthError::Malformed(format!("authorization header: {what}"));
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in rest.split(',').map(trim_ows).filter(|p| !p.is_empty()) {
        let (name, field_value) = part.split_once('=').ok_or_else(|| malformed(part))?;
        let slot = match trim_ows(name) {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed_headers,
            "Signature" => &mut signature,
            other => return Err(malformed(&format!("unknown component {other}"))),
        };
        if slot.replace(trim_ows(field_value)).is_some() {
            return Err(malformed("duplicate component"));
        }
    }
    let credential = credential.ok_or_else(|| malformed("missing Credential"))?;
    let signed_headers = signed_headers.ok_or_else(|| malformed("missing SignedHeaders"))?;
    let signature = signature.ok_or_else(|| malformed("missing Signature"))?;
    let signature = parse_hex32(signature).ok_or_else(|| malformed("invalid Signature"))?;
    Ok(AuthorizationHeader {
        credential,
        signed_headers,
        signature,
    })
}

/// The request date for header auth: x-amz-date, else an RFC 1123 `Date`.
/// Returns the ISO 8601 basic form used in the string-to-sign and unix seconds.
fn header_request_date(headers: &[HeaderView]) -> Result<(String, i64), AuthError> {
    if let Some(value) = single_header(headers, "x-amz-date", AuthError::Malformed)? {
        let value = std::str::from_utf8(value).map_err(|_| AuthError::MissingDate)?;
        let value = trim_ows(value);
        let secs = parse_amz_date(value).ok_or(AuthError::MissingDate)?;
        return Ok((value.to_string(), secs));
    }
    let value =
        single_header(headers, "date", AuthError::Malformed)?.ok_or(AuthError::MissingDate)?;
    let value = std::str::from_utf8(value).map_err(|_| AuthError::MissingDate)?;
    let time = httpdate::parse_http_date(trim_ows(value)).map_err(|_| AuthError::MissingDate)?;
    let secs = unix_secs(time);
    Ok((format_amz_date(secs), secs))
}

// ---------------------------------------------------------------------------
// Query (presigned URL) auth

#[derive(Debug, PartialEq, Eq)]
enum QueryAuth {
    None,
    SigV4,
    SigV2,
}

fn classify_query_auth(raw_query: &str) -> QueryAuth {
    let mut found = QueryAuth::None;
    for (name, _) in query_pairs(raw_query) {
        match name {
            "X-Amz-Algorithm" | "X-Amz-Credential" | "X-Amz-Signature" => return QueryAuth::SigV4,
            "AWSAccessKeyId" | "Signature" => found = QueryAuth::SigV2,
            _ => {}
        }
    }
    found
}

#[derive(Default)]
struct PresignParams {
    algorithm: Option<String>,
    credential: Option<String>,
    date: Option<String>,
    expires: Option<String>,
    signed_headers: Option<String>,
    signature: Option<String>,
    content_sha256: Option<String>,
}

impl PresignParams {
    fn parse(raw_query: &str) -> Result<Self, AuthError> {
        let mut params = Self::default();
        for (name, value) in query_pairs(raw_query) {
            let slot = match name {
                "X-Amz-Algorithm" => &mut params.algorithm,
                "X-Amz-Credential" => &mut params.credential,
                "X-Amz-Date" => &mut params.date,
                "X-Amz-Expires" => &mut params.expires,
                "X-Amz-SignedHeaders" => &mut params.signed_headers,
                "X-Amz-Signature" => &mut params.signature,
                "X-Amz-Content-Sha256" => &mut params.content_sha256,
                _ => continue,
            };
            let decoded = percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| AuthError::QueryMalformed(format!("{name} is not valid UTF-8")))?;
            if slot.replace(decoded.into_owned()).is_some() {
                return Err(AuthError::QueryMalformed(format!(
                    "{name} given more than once"
                )));
            }
        }
        Ok(params)
    }
}

fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, AuthError> {
    value.as_deref().ok_or_else(|| {
        AuthError::QueryMalformed(format!(
            "Query-string authentication requires the {name} parameter"
        ))
    })
}

fn verify_query_auth(
    input: &AuthInput,
    secret_for: &dyn Fn(&str) -> Option<String>,
    now: SystemTime,
    max_skew: Duration,
) -> Result<Verified, AuthError> {
    let params = PresignParams::parse(input.raw_query)?;
    if required(&params.algorithm, "X-Amz-Algorithm")? != ALGORITHM {
        return Err(AuthError::UnsupportedAlgorithm);
    }
    let credential = parse_credential(
        required(&params.credential, "X-Amz-Credential")?,
        AuthError::QueryMalformed,
    )?;
    let amz_date = required(&params.date, "X-Amz-Date")?;
    let date_secs = parse_amz_date(amz_date).ok_or_else(|| {
        AuthError::QueryMalformed("X-Amz-Date must be in the ISO8601 Long Format".into())
    })?;
    check_scope_date(&credential, amz_date, AuthError::QueryMalformed)?;
    let expires_secs = parse_expires(required(&params.expires, "X-Amz-Expires")?)?;
    let signed_headers = required(&params.signed_headers, "X-Amz-SignedHeaders")?;
    let signature = parse_hex32(required(&params.signature, "X-Amz-Signature")?)
        .ok_or_else(|| AuthError::QueryMalformed("invalid X-Amz-Signature".into()))?;
    // Presigned URLs sign UNSIGNED-PAYLOAD unless the URL itself pins a hash.
    let hashed_payload = params.content_sha256.as_deref().unwrap_or(UNSIGNED_PAYLOAD);
    let payload = match PayloadMode::parse(hashed_payload) {
        Some(mode @ (PayloadMode::Unsigned | PayloadMode::Sha256(_))) => mode,
        _ => return Err(AuthError::InvalidContentSha256),
    };

    let secret = secret_for(credential.access_key).ok_or(AuthError::InvalidAccessKeyId)?;
    let now_secs = unix_secs(now);
    if date_secs > now_secs.saturating_add(max_skew.as_secs() as i64) {
        return Err(AuthError::NotYetValid);
    }
    if now_secs > date_secs.saturating_add(expires_secs as i64) {
        return Err(AuthError::Expired);
    }
    let query = canonical_query(input.raw_query, true);
    let canonical = canonical_request(
        input,
        &query,
        signed_headers,
        hashed_payload,
        AuthError::QueryMalformed,
    )?;
    let key = signing_key(&secret, credential.date, credential.region, SERVICE);
    check_signature(&key, amz_date, credential.scope, &canonical, &signature)?;
    // Presigned URLs are handed to others: a header added to one must not
    // change what the request does (x-amz-copy-source, x-amz-meta-*, ...).
    // A header repeating what the query signed (some clients send
    // x-amz-content-sha256: UNSIGNED-PAYLOAD) changes nothing.
    check_amz_headers_signed(
        input.headers,
        signed_headers,
        &[
            ("x-amz-date", amz_date),
            ("x-amz-content-sha256", hashed_payload),
        ],
    )?;
    Ok(Verified {
        access_key: credential.access_key.to_string(),
        payload,
        signing_key: key,
        seed_signature: signature,
        amz_date: amz_date.to_string(),
        scope: credential.scope.to_string(),
    })
}

fn parse_expires(value: &str) -> Result<u64, AuthError> {
    let secs: u64 = value
        .parse()
        .map_err(|_| AuthError::QueryMalformed("X-Amz-Expires should be a number".into()))?;
    if secs > PRESIGN_EXPIRES_SECS_MAX {
        return Err(AuthError::QueryMalformed(
            "X-Amz-Expires must be less than a week (in seconds) that is 604800".into(),
        ));
    }
    Ok(secs)
}

// ---------------------------------------------------------------------------
// Shared: credential scope, canonical request, signature

struct Credential<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    /// "date/region/s3/aws4_request", a suffix of the credential string.
    scope: &'a str,
}

/// Parse `AKID/20130524/us-east-1/s3/aws4_request`. Any region is accepted:
/// the server is region-agnostic, the region only feeds the key derivation.
fn parse_credential(
    value: &str,
    err: fn(String) -> AuthError,
) -> Result<Credential<'_>, AuthError> {
    let mut parts = value.rsplitn(5, '/');
    let (terminator, service, region, date, access_key) = match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some(t), Some(s), Some(r), Some(d), Some(a)) => (t, s, r, d, a),
        _ => return Err(err(format!("invalid credential {value:?}"))),
    };
    if access_key.is_empty() || region.is_empty() {
        return Err(err(format!("invalid credential {value:?}")));
    }
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(format!("invalid credential date {date:?}")));
    }
    if service != SERVICE {
        return Err(err(format!(
            "credential should be scoped to correct service: '{SERVICE}'"
        )));
    }
    if terminator != TERMINATOR {
        return Err(err(format!(
            "credential should be scoped with a valid terminator: '{TERMINATOR}'"
        )));
    }
    let scope = &value[access_key.len() + 1..];
    debug_assert!(scope.starts_with(date) && scope.ends_with(TERMINATOR));
    Ok(Credential {
        access_key,
        date,
        region,
        scope,
    })
}

fn check_scope_date(
    credential: &Credential,
    amz_date: &str,
    err: fn(String) -> AuthError,
) -> Result<(), AuthError> {
    if amz_date.get(..8) != Some(credential.date) {
        return Err(err(
            "Invalid credential date. Date is not the same as X-Amz-Date.".into(),
        ));
    }
    Ok(())
}

/// Build the canonical request:
/// method \n uri \n query \n headers \n signed-headers \n hashed-payload.
fn canonical_request(
    input: &AuthInput,
    canonical_query: &str,
    signed_headers: &str,
    hashed_payload: &str,
    err: fn(String) -> AuthError,
) -> Result<Vec<u8>, AuthError> {
    let mut out = Vec::with_capacity(
        256 + input.raw_path.len() + canonical_query.len() + 2 * signed_headers.len(),
    );
    out.extend_from_slice(input.method.as_bytes());
    out.push(b'\n');
    push_canonical_uri(&mut out, input.raw_path);
    out.push(b'\n');
    out.extend_from_slice(canonical_query.as_bytes());
    out.push(b'\n');
    push_canonical_headers(&mut out, input.headers, signed_headers, err)?;
    out.push(b'\n');
    out.extend_from_slice(signed_headers.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(hashed_payload.as_bytes());
    Ok(out)
}

/// S3 signs the path as the client encoded it (no double encoding). We
/// normalise: decode every %XX and re-encode with the SigV4 set, so that
/// `$`, `=`, `+`, spaces and unicode verify whether or not the client
/// escaped them on the wire. A raw '/' separates segments and stays; an
/// escaped %2F belongs to a key segment and stays escaped.
fn push_canonical_uri(out: &mut Vec<u8>, raw_path: &str) {
    if raw_path.is_empty() {
        out.push(b'/');
        return;
    }
    push_reencoded(out, raw_path.as_bytes(), true);
}

/// Canonical query string: pairs split on '&' and the first '=', both halves
/// decoded and re-encoded, sorted by encoded name then value. '+' is a
/// literal plus (S3 clients send spaces as %20). Presigned URLs leave out
/// X-Amz-Signature.
fn canonical_query(raw_query: &str, exclude_signature: bool) -> String {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (name, value) in query_pairs(raw_query) {
        if exclude_signature && name == "X-Amz-Signature" {
            continue;
        }
        pairs.push((reencode(name), reencode(value)));
    }
    pairs.sort_unstable();
    let len_bytes: usize = pairs.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    let mut out = String::with_capacity(len_bytes);
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(value);
    }
    out
}

fn reencode(raw: &str) -> String {
    let mut bytes = Vec::with_capacity(raw.len() + raw.len() / 2);
    push_reencoded(&mut bytes, raw.as_bytes(), false);
    // Output is ASCII by construction.
    String::from_utf8(bytes).unwrap_or_default()
}

/// Append `raw` with every %XX decoded and every byte outside the SigV4
/// unreserved set escaped as uppercase %XX. A malformed '%' is taken as a
/// literal percent sign. With `keep_raw_slash`, an unescaped '/' is kept.
fn push_reencoded(out: &mut Vec<u8>, raw: &[u8], keep_raw_slash: bool) {
    let mut i = 0;
    while i < raw.len() {
        let byte = raw[i];
        if byte == b'/' && keep_raw_slash {
            out.push(b'/');
            i += 1;
            continue;
        }
        let escaped = match (byte, raw.get(i + 1), raw.get(i + 2)) {
            (b'%', Some(&hi), Some(&lo)) => hex_val(hi).zip(hex_val(lo)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match escaped {
            Some(decoded) => {
                push_uri_encoded_byte(out, decoded);
                i += 3;
            }
            None => {
                push_uri_encoded_byte(out, byte);
                i += 1;
            }
        }
    }
}

fn push_uri_encoded_byte(out: &mut Vec<u8>, byte: u8) {
    const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";
    if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
        out.push(byte);
    } else {
        out.extend_from_slice(&[
            b'%',
            HEX_UPPER[(byte >> 4) as usize],
            HEX_UPPER[(byte & 15) as usize],
        ]);
    }
}

/// `name:value\n` for every name in SignedHeaders, in that order. Values are
/// trimmed with inner runs of spaces collapsed; repeated headers are joined
/// with ','.
fn push_canonical_headers(
    out: &mut Vec<u8>,
    headers: &[HeaderView],
    signed_headers: &str,
    err: fn(String) -> AuthError,
) -> Result<(), AuthError> {
    let mut has_host = false;
    let mut previous: Option<&str> = None;
    for name in signed_headers.split(';') {
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase() || b <= b' ') {
            return Err(err(format!("invalid SignedHeaders {signed_headers:?}")));
        }
        // Clients sort the list; a repeat would sign one header twice.
        if previous.is_some_and(|p| p == name) {
            return Err(err(format!("duplicate signed header {name:?}")));
        }
        previous = Some(name);
        has_host |= name == "host";
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
        let mut found = false;
        for header in headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)) {
            if found {
                out.push(b',');
            }
            found = true;
            push_trimmed_value(out, header.value);
        }
        // A signed header that did not arrive cannot match what was signed.
        if !found {
            return Err(AuthError::SignatureDoesNotMatch);
        }
        out.push(b'\n');
    }
    if !has_host {
        return Err(err("SignedHeaders must include host".into()));
    }
    Ok(())
}

fn push_trimmed_value(out: &mut Vec<u8>, value: &[u8]) {
    let mut pending_space = false;
    let mut started = false;
    for &byte in value {
        if byte == b' ' || byte == b'\t' {
            pending_space = started;
            continue;
        }
        if pending_space {
            out.push(b' ');
            pending_space = false;
        }
        started = true;
        out.push(byte);
    }
}

/// Refuses any `x-amz-*` header the signature does not cover: one not in
/// SignedHeaders, unless it is one of `in_string_to_sign` (name, value) and
/// carries exactly the value that was signed. S3 answers such requests with
/// 403 AccessDenied ("There were headers present in the request which were
/// not signed"); without this, whoever holds a presigned URL (or replays a
/// signed request) could add x-amz-copy-source and turn a PUT into a copy.
fn check_amz_headers_signed(
    headers: &[HeaderView],
    signed_headers: &str,
    in_string_to_sign: &[(&str, &str)],
) -> Result<(), AuthError> {
    let mut unsigned: Vec<String> = Vec::new();
    for header in headers {
        let name = header.name;
        if !name
            .get(..AMZ_HEADER_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(AMZ_HEADER_PREFIX))
        {
            continue;
        }
        if signed_headers
            .split(';')
            .any(|signed| signed.eq_ignore_ascii_case(name))
        {
            continue;
        }
        let same_as_signed = in_string_to_sign.iter().any(|(covered, value)| {
            covered.eq_ignore_ascii_case(name)
                && std::str::from_utf8(header.value).is_ok_and(|v| trim_ows(v) == *value)
        });
        if same_as_signed {
            continue;
        }
        let lower = name.to_ascii_lowercase();
        if !unsigned.contains(&lower) {
            unsigned.push(lower);
        }
    }
    if unsigned.is_empty() {
        Ok(())
    } else {
        Err(AuthError::UnsignedHeaders(unsigned.join(",")))
    }
}

fn check_signature(
    key: &[u8; 32],
    amz_date: &str,
    scope: &str,
    canonical_request: &[u8],
    provided: &[u8; 32],
) -> Result<(), AuthError> {
    let mut request_hash_hex = [0u8; 64];
    hex_encode32(
        &Sha256::digest(canonical_request).into(),
        &mut request_hash_hex,
    );
    let expected = hmac_sha256(
        key,
        &[
            ALGORITHM.as_bytes(),
            b"\n",
            amz_date.as_bytes(),
            b"\n",
            scope.as_bytes(),
            b"\n",
            &request_hash_hex,
        ],
    );
    if bool::from(expected.ct_eq(provided)) {
        Ok(())
    } else {
        Err(AuthError::SignatureDoesNotMatch)
    }
}

// ---------------------------------------------------------------------------
// aws-chunked decoder

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkVariant {
    Signed,
    SignedTrailer,
    UnsignedTrailer,
}

impl ChunkVariant {
    fn chunks_signed(self) -> bool {
        self != Self::UnsignedTrailer
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ChunkState {
    /// Reading `hex(size)[;chunk-signature=..]\r\n`.
    Header,
    /// Copying chunk payload.
    Data {
        remaining_bytes: u64,
    },
    /// Expecting the CRLF after chunk data (`last`: after the final chunk).
    Crlf {
        matched_bytes: u8,
        last: bool,
    },
    /// Reading trailer lines after the final chunk.
    Trailer,
    /// Trailer signature verified; expecting the closing empty line.
    TrailerEnd,
    Done,
    Failed(AuthError),
}

/// Incremental decoder for `Content-Encoding: aws-chunked` bodies.
///
/// Decoded bytes are appended to `out` as they arrive, before the chunk's
/// signature (which follows the data) can be checked: a caller must treat
/// everything it got as unauthenticated until `feed` returns for the end of
/// that chunk without error, and discard the whole body on any error.
pub struct ChunkedDecoder {
    variant: ChunkVariant,
    state: ChunkState,
    signing_key: [u8; 32],
    amz_date: String,
    scope: String,
    /// Signature of the previous chunk (the seed for the first one).
    previous_signature: [u8; 32],
    /// Signature announced by the current chunk's header.
    chunk_signature: [u8; 32],
    chunk_hasher: Sha256,
    trailer_hasher: Sha256,
    /// Current header or trailer line, bounded by CHUNK_LINE_BYTES_MAX.
    line: Vec<u8>,
    trailers: Vec<(String, String)>,
    /// Tolerates one empty line between the final chunk and signed trailers.
    skipped_blank_line: bool,
    decoded_bytes: u64,
    decoded_bytes_expected: Option<u64>,
}

impl ChunkedDecoder {
    /// `mode` must be one of the Streaming* modes; any other mode yields a
    /// decoder whose first `feed` fails. `decoded_content_length` is
    /// x-amz-decoded-content-length, checked against the decoded total.
    pub fn new(
        mode: &PayloadMode,
        verified: &Verified,
        decoded_content_length: Option<u64>,
    ) -> Self {
        let variant = match mode {
            PayloadMode::StreamingSigned => Some(ChunkVariant::Signed),
            PayloadMode::StreamingSignedTrailer => Some(ChunkVariant::SignedTrailer),
            PayloadMode::StreamingUnsignedTrailer => Some(ChunkVariant::UnsignedTrailer),
            PayloadMode::Unsigned | PayloadMode::Sha256(_) => None,
        };
        // A non-streaming mode gives a decoder that is failed from the start
        // (its variant is then never looked at).
        let state = match variant {
            Some(_) => ChunkState::Header,
            None => ChunkState::Failed(AuthError::ChunkMalformed(
                "payload mode is not aws-chunked".into(),
            )),
        };
        Self {
            variant: variant.unwrap_or(ChunkVariant::UnsignedTrailer),
            state,
            signing_key: verified.signing_key,
            amz_date: verified.amz_date.clone(),
            scope: verified.scope.clone(),
            previous_signature: verified.seed_signature,
            chunk_signature: [0; 32],
            chunk_hasher: Sha256::new(),
            trailer_hasher: Sha256::new(),
            line: Vec::with_capacity(128),
            trailers: Vec::new(),
            skipped_blank_line: false,
            decoded_bytes: 0,
            decoded_bytes_expected: decoded_content_length,
        }
    }

    /// Feed input bytes; appends decoded payload bytes to `out`; returns how
    /// many input bytes were consumed. Consumes everything unless the body
    /// ends inside `input` (then the rest is not part of this body). After
    /// an error every later call fails with the same error.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, AuthError> {
        if let ChunkState::Failed(err) = &self.state {
            return Err(err.clone());
        }
        let mut consumed = 0;
        while consumed < input.len() && self.state != ChunkState::Done {
            match self.step(&input[consumed..], out) {
                Ok(used) => {
                    debug_assert!(used > 0, "every step must make progress");
                    consumed += used;
                }
                Err(err) => {
                    self.state = ChunkState::Failed(err.clone());
                    return Err(err);
                }
            }
        }
        Ok(consumed)
    }

    /// The final 0-size chunk (and the trailers, if any) have been consumed.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Call at end of input: an unfinished body is IncompleteBody.
    pub fn finish(&self) -> Result<(), AuthError> {
        match &self.state {
            ChunkState::Done => Ok(()),
            ChunkState::Failed(err) => Err(err.clone()),
            _ => Err(AuthError::IncompleteBody),
        }
    }

    /// Trailer headers (lowercased name, trimmed value), e.g. x-amz-checksum-crc32.
    pub fn trailers(&self) -> &[(String, String)] {
        &self.trailers
    }

    /// Payload bytes decoded so far.
    pub fn decoded_bytes(&self) -> u64 {
        self.decoded_bytes
    }

    /// Consume at least one byte of `input` (non-empty) and advance.
    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, AuthError> {
        debug_assert!(!input.is_empty());
        match self.state {
            ChunkState::Header => self.step_line(input, Self::on_chunk_header),
            ChunkState::Data { remaining_bytes } => self.step_data(input, remaining_bytes, out),
            ChunkState::Crlf {
                matched_bytes,
                last,
            } => self.step_crlf(input[0], matched_bytes, last),
            ChunkState::Trailer => self.step_line(input, Self::on_trailer_line),
            ChunkState::TrailerEnd => self.step_line(input, Self::on_trailer_end),
            ChunkState::Done | ChunkState::Failed(_) => {
                debug_assert!(false, "feed does not step a finished decoder");
                Err(AuthError::ChunkMalformed("decoder already finished".into()))
            }
        }
    }

    /// Accumulate a CRLF-terminated line; once complete, hand its content
    /// (CRLF stripped) to `on_line`.
    fn step_line(
        &mut self,
        input: &[u8],
        on_line: fn(&mut Self, &[u8]) -> Result<(), AuthError>,
    ) -> Result<usize, AuthError> {
        let (piece, complete) = match input.iter().position(|&b| b == b'\n') {
            Some(end) => (&input[..=end], true),
            None => (input, false),
        };
        if self.line.len() + piece.len() > CHUNK_LINE_BYTES_MAX + 2 {
            return Err(AuthError::ChunkMalformed(format!(
                "line longer than {CHUNK_LINE_BYTES_MAX} bytes"
            )));
        }
        self.line.extend_from_slice(piece);
        if complete {
            let mut line = std::mem::take(&mut self.line);
            let content = line
                .strip_suffix(b"\r\n")
                .ok_or_else(|| AuthError::ChunkMalformed("line not terminated by CRLF".into()))?;
            let result = on_line(self, content);
            line.clear();
            self.line = line; // keep the allocation
            result?;
        }
        Ok(piece.len())
    }

    fn on_chunk_header(&mut self, line: &[u8]) -> Result<(), AuthError> {
        let variant = self.variant;
        let (size_bytes, signature) = parse_chunk_header(line, variant.chunks_signed())?;
        if let Some(signature) = signature {
            self.chunk_signature = signature;
        }
        let decoded_after = self.decoded_bytes + size_bytes;
        if self
            .decoded_bytes_expected
            .is_some_and(|expected| decoded_after > expected)
        {
            return Err(AuthError::IncompleteBody);
        }
        if size_bytes > 0 {
            self.state = ChunkState::Data {
                remaining_bytes: size_bytes,
            };
            return Ok(());
        }
        // The final, empty chunk.
        if self
            .decoded_bytes_expected
            .is_some_and(|expected| self.decoded_bytes != expected)
        {
            return Err(AuthError::IncompleteBody);
        }
        if variant.chunks_signed() {
            self.verify_chunk_signature()?;
        }
        self.state = match variant {
            ChunkVariant::Signed => ChunkState::Crlf {
                matched_bytes: 0,
                last: true,
            },
            ChunkVariant::SignedTrailer | ChunkVariant::UnsignedTrailer => ChunkState::Trailer,
        };
        Ok(())
    }

    fn step_data(
        &mut self,
        input: &[u8],
        remaining_bytes: u64,
        out: &mut Vec<u8>,
    ) -> Result<usize, AuthError> {
        debug_assert!(remaining_bytes > 0);
        let take = remaining_bytes.min(input.len() as u64) as usize;
        let data = &input[..take];
        out.extend_from_slice(data);
        if self.variant.chunks_signed() {
            self.chunk_hasher.update(data);
        }
        self.decoded_bytes += take as u64;
        let remaining_bytes = remaining_bytes - take as u64;
        if remaining_bytes > 0 {
            self.state = ChunkState::Data { remaining_bytes };
            return Ok(take);
        }
        if self.variant.chunks_signed() {
            self.verify_chunk_signature()?;
        }
        self.state = ChunkState::Crlf {
            matched_bytes: 0,
            last: false,
        };
        Ok(take)
    }

    fn step_crlf(&mut self, byte: u8, matched_bytes: u8, last: bool) -> Result<usize, AuthError> {
        debug_assert!(matched_bytes < 2);
        let expected = if matched_bytes == 0 { b'\r' } else { b'\n' };
        if byte != expected {
            return Err(AuthError::ChunkMalformed(
                "chunk data not followed by CRLF".into(),
            ));
        }
        self.state = match (matched_bytes, last) {
            (0, _) => ChunkState::Crlf {
                matched_bytes: 1,
                last,
            },
            (_, true) => ChunkState::Done,
            (_, false) => ChunkState::Header,
        };
        Ok(1)
    }

    /// Chunk string-to-sign: "AWS4-HMAC-SHA256-PAYLOAD\n" date \n scope \n
    /// previous-signature \n sha256("") \n sha256(chunk data), all hex.
    fn verify_chunk_signature(&mut self) -> Result<(), AuthError> {
        let data_hash: [u8; 32] = std::mem::take(&mut self.chunk_hasher).finalize().into();
        let mut previous_hex = [0u8; 64];
        let mut data_hash_hex = [0u8; 64];
        hex_encode32(&self.previous_signature, &mut previous_hex);
        hex_encode32(&data_hash, &mut data_hash_hex);
        let expected = hmac_sha256(
            &self.signing_key,
            &[
                b"AWS4-HMAC-SHA256-PAYLOAD\n",
                self.amz_date.as_bytes(),
                b"\n",
                self.scope.as_bytes(),
                b"\n",
                &previous_hex,
                b"\n",
                EMPTY_SHA256_HEX.as_bytes(),
                b"\n",
                &data_hash_hex,
            ],
        );
        if !bool::from(expected.ct_eq(&self.chunk_signature)) {
            return Err(AuthError::SignatureDoesNotMatch);
        }
        self.previous_signature = self.chunk_signature;
        Ok(())
    }

    fn on_trailer_line(&mut self, line: &[u8]) -> Result<(), AuthError> {
        let signed = self.variant == ChunkVariant::SignedTrailer;
        if line.is_empty() {
            if !signed {
                self.state = ChunkState::Done;
                return Ok(());
            }
            // Some writers put the final chunk's CRLF before signed trailers.
            if self.trailers.is_empty() && !self.skipped_blank_line {
                self.skipped_blank_line = true;
                return Ok(());
            }
            return Err(AuthError::ChunkMalformed(
                "missing x-amz-trailer-signature".into(),
            ));
        }
        let (name, value) = split_trailer(line)?;
        if name.eq_ignore_ascii_case("x-amz-trailer-signature") {
            if !signed {
                return Err(AuthError::ChunkMalformed(
                    "unexpected trailer signature".into(),
                ));
            }
            let signature = parse_hex32(value).ok_or_else(|| {
                AuthError::ChunkMalformed("invalid x-amz-trailer-signature".into())
            })?;
            self.verify_trailer_signature(&signature)?;
            self.state = ChunkState::TrailerEnd;
            return Ok(());
        }
        if self.trailers.len() >= TRAILERS_MAX {
            return Err(AuthError::ChunkMalformed(format!(
                "more than {TRAILERS_MAX} trailers"
            )));
        }
        if signed {
            // The trailer signature covers each line as sent, "name:value\n".
            self.trailer_hasher.update(line);
            self.trailer_hasher.update(b"\n");
        }
        self.trailers
            .push((name.to_ascii_lowercase(), value.to_string()));
        Ok(())
    }

    fn on_trailer_end(&mut self, line: &[u8]) -> Result<(), AuthError> {
        if !line.is_empty() {
            return Err(AuthError::ChunkMalformed(
                "data after x-amz-trailer-signature".into(),
            ));
        }
        self.state = ChunkState::Done;
        Ok(())
    }

    /// Trailer string-to-sign: "AWS4-HMAC-SHA256-TRAILER\n" date \n scope \n
    /// previous-signature \n sha256(trailer lines), all hex.
    fn verify_trailer_signature(&mut self, provided: &[u8; 32]) -> Result<(), AuthError> {
        let trailer_hash: [u8; 32] = std::mem::take(&mut self.trailer_hasher).finalize().into();
        let mut previous_hex = [0u8; 64];
        let mut trailer_hash_hex = [0u8; 64];
        hex_encode32(&self.previous_signature, &mut previous_hex);
        hex_encode32(&trailer_hash, &mut trailer_hash_hex);
        let expected = hmac_sha256(
            &self.signing_key,
            &[
                b"AWS4-HMAC-SHA256-TRAILER\n",
                self.amz_date.as_bytes(),
                b"\n",
                self.scope.as_bytes(),
                b"\n",
                &previous_hex,
                b"\n",
                &trailer_hash_hex,
            ],
        );
        if !bool::from(expected.ct_eq(provided)) {
            return Err(AuthError::SignatureDoesNotMatch);
        }
        self.previous_signature = *provided;
        Ok(())
    }
}

/// `hex(size);chunk-signature=<64 hex>` (signed) or `hex(size)[;ext]` (unsigned).
fn parse_chunk_header(line: &[u8], signed: bool) -> Result<(u64, Option<[u8; 32]>), AuthError> {
    let malformed = || AuthError::ChunkMalformed("invalid chunk header".into());
    let line = std::str::from_utf8(line).map_err(|_| malformed())?;
    let (size_hex, extension) = match line.split_once(';') {
        Some((size, ext)) => (size, Some(ext)),
        None => (line, None),
    };
    if size_hex.is_empty()
        || size_hex.len() > 16
        || !size_hex.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(malformed());
    }
    let size_bytes = u64::from_str_radix(size_hex, 16).map_err(|_| malformed())?;
    if size_bytes > CHUNK_BYTES_MAX {
        return Err(AuthError::ChunkMalformed(format!(
            "chunk of {size_bytes} bytes exceeds {CHUNK_BYTES_MAX}"
        )));
    }
    if !signed {
        return Ok((size_bytes, None));
    }
    let signature = extension
        .and_then(|ext| ext.strip_prefix("chunk-signature="))
        .and_then(parse_hex32)
        .ok_or_else(|| AuthError::ChunkMalformed("missing or invalid chunk-signature".into()))?;
    Ok((size_bytes, Some(signature)))
}

fn split_trailer(line: &[u8]) -> Result<(&str, &str), AuthError> {
    let malformed = || AuthError::ChunkMalformed("invalid trailer line".into());
    let line = std::str::from_utf8(line).map_err(|_| malformed())?;
    let (name, value) = line.split_once(':').ok_or_else(malformed)?;
    let name = trim_ows(name);
    if name.is_empty() || !name.bytes().all(is_token_byte) {
        return Err(malformed());
    }
    Ok((name, trim_ows(value)))
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

#[cfg(test)]
mod tests {
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
        assert_eq!(
            with_auth("AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg=").unwrap_err(),
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
            AuthError::UnsupportedAlgorithm
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
    const TRAILER_SIGNATURE: &str =
        "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435";

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
            access_key: ACCESS_KEY.into(),
            payload,
            signing_key: signing_key(SECRET, "20130524", "us-east-1", "s3"),
            seed_signature: hex32(seed),
            amz_date: EXAMPLE_DATE.into(),
            scope: "20130524/us-east-1/s3/aws4_request".into(),
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
        swapped.extend_from_slice(
            format!("400;chunk-signature={}\r\n", CHUNK_SIGNATURES[1]).as_bytes(),
        );
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
}
