//! What header and query auth share: the credential scope, the canonical
//! request (URI, query and header normalisation), the unsigned x-amz-*
//! header check and the signature comparison.

use super::*;

pub(super) struct Credential<'a> {
    pub(super) access_key: &'a str,
    pub(super) date: &'a str,
    pub(super) region: &'a str,
    /// "date/region/s3/aws4_request", a suffix of the credential string.
    pub(super) scope: &'a str,
}

/// Parse `AKID/20130524/us-east-1/s3/aws4_request`. Any region is accepted:
/// the server is region-agnostic, the region only feeds the key derivation.
pub(super) fn parse_credential(
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

pub(super) fn check_scope_date(
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
pub(super) fn canonical_request(
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
pub(super) fn push_canonical_uri(out: &mut Vec<u8>, raw_path: &str) {
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
pub(super) fn canonical_query(raw_query: &str, exclude_signature: bool) -> String {
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

pub(super) fn reencode(raw: &str) -> String {
    let mut bytes = Vec::with_capacity(raw.len() + raw.len() / 2);
    push_reencoded(&mut bytes, raw.as_bytes(), false);
    // Output is ASCII by construction.
    String::from_utf8(bytes).unwrap_or_default()
}

/// Append `raw` with every %XX decoded and every byte outside the SigV4
/// unreserved set escaped as uppercase %XX. A malformed '%' is taken as a
/// literal percent sign. With `keep_raw_slash`, an unescaped '/' is kept.
pub(super) fn push_reencoded(out: &mut Vec<u8>, raw: &[u8], keep_raw_slash: bool) {
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

pub(super) fn push_uri_encoded_byte(out: &mut Vec<u8>, byte: u8) {
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
pub(super) fn push_canonical_headers(
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

pub(super) fn push_trimmed_value(out: &mut Vec<u8>, value: &[u8]) {
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
pub(super) fn check_amz_headers_signed(
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

pub(super) fn check_signature(
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
