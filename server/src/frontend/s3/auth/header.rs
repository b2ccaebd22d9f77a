//! SigV4 header auth: `Authorization: AWS4-HMAC-SHA256 Credential=..,
//! SignedHeaders=.., Signature=..` and the request date it signs.

use std::time::{Duration, SystemTime};

use super::*;

pub(super) fn verify_header_auth(
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
        principal: crate::access::Principal::Anonymous,
        access_key: credential.access_key.to_string(),
        payload,
        signing_key: key,
        seed_signature: parsed.signature,
        amz_date,
        scope: credential.scope.to_string(),
        content_md5_signed: signs(parsed.signed_headers, "content-md5"),
    })
}

pub(super) struct AuthorizationHeader<'a> {
    credential: &'a str,
    signed_headers: &'a str,
    signature: [u8; 32],
}

/// Parse `AWS4-HMAC-SHA256 Credential=.., SignedHeaders=.., Signature=..`
/// (clients differ on whether a space follows each comma).
pub(super) fn parse_authorization(value: &str) -> Result<AuthorizationHeader<'_>, AuthError> {
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
pub(super) fn header_request_date(headers: &[HeaderView]) -> Result<(String, i64), AuthError> {
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
