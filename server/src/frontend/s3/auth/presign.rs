//! SigV4 query auth (presigned URLs): the X-Amz-* parameters, their
//! expiry, and the signature over them.

use std::time::{Duration, SystemTime};

use super::*;

#[derive(Debug, PartialEq, Eq)]
pub(super) enum QueryAuth {
    None,
    SigV4,
    SigV2,
}

pub(super) fn classify_query_auth(raw_query: &str) -> QueryAuth {
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
pub(super) struct PresignParams {
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
            set_query_param(slot, name, value)?;
        }
        Ok(params)
    }
}

pub(super) fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, AuthError> {
    value.as_deref().ok_or_else(|| {
        AuthError::QueryMalformed(format!(
            "Query-string authentication requires the {name} parameter"
        ))
    })
}

pub(super) fn verify_query_auth(
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
        principal: crate::access::Principal::Anonymous,
        access_key: credential.access_key.to_string(),
        payload,
        signing_key: key,
        seed_signature: signature,
        amz_date: amz_date.to_string(),
        scope: credential.scope.to_string(),
        content_md5_signed: super::signs(signed_headers, "content-md5"),
    })
}

pub(super) fn parse_expires(value: &str) -> Result<u64, AuthError> {
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
