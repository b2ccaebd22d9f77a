//! S3 XML: building response bodies (`render`), and a tiny bounded parser
//! for the request bodies accepted (`parse`: CreateBucketConfiguration,
//! CompleteMultipartUpload, Delete). This file holds the shared constants,
//! escaping and the small element writers.
//!
//! Output is written straight into one pre-sized String; no XML library,
//! because S3's response shapes are fixed and small.

use std::fmt::Write as _;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

mod parse;
mod render;
#[cfg(test)]
mod tests;

pub use parse::*;
pub use render::*;

pub(crate) const XML_DECLARATION: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
pub(crate) const S3_XMLNS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";
/// Owner shown in listings that ask for one (fetch-owner=true) when the
/// caller has no better id to give.
pub const OWNER_ID_DEFAULT: &str = "percore";
/// Largest request body the parser accepts.
pub const PARSE_BODY_BYTES_MAX: usize = 1 << 20;
/// Largest CompleteMultipartUpload body: 10,000 parts, each with its ETag
/// and the checksums SDKs copy from the UploadPart answers (up to about
/// 300 bytes a part).
pub const COMPLETE_BODY_BYTES_MAX: usize = 4 << 20;
/// Deepest element nesting the parser accepts.
const PARSE_DEPTH_MAX: usize = 32;

/// encoding-type=url, as S3 does it: everything but unreserved and '/' is
/// escaped, so '+' becomes %2B (clients decode with unquote_plus).
const KEY_URL_ENCODE_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

// ---------------------------------------------------------------------------
// Escaping and small writers

/// Escape text for element content or attribute values: `& < > " '` and
/// control characters (as `&#xN;`, so CR/LF/TAB in keys survive parsing).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    push_escaped(&mut out, s);
    out
}

fn push_escaped(out: &mut String, s: &str) {
    // Every character we escape is ASCII, so byte offsets are char boundaries.
    let bytes = s.as_bytes();
    let mut clean_from = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let replacement = match byte {
            b'&' => "&amp;",
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'"' => "&quot;",
            b'\'' => "&apos;",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[clean_from..i]);
        if replacement.is_empty() {
            let _ = write!(out, "&#x{byte:X};");
        } else {
            out.push_str(replacement);
        }
        clean_from = i + 1;
    }
    out.push_str(&s[clean_from..]);
}

/// `<name>escaped value</name>`.
pub(crate) fn push_element(out: &mut String, name: &str, value: &str) {
    out.push('<');
    out.push_str(name);
    out.push('>');
    push_escaped(out, value);
    out.push_str("</");
    out.push_str(name);
    out.push('>');
}

/// Like [`push_element`], URL-encoding the value first when the client
/// asked for encoding-type=url.
pub(crate) fn push_key_element(out: &mut String, name: &str, value: &str, encode_url: bool) {
    if !encode_url {
        return push_element(out, name, value);
    }
    out.push('<');
    out.push_str(name);
    out.push('>');
    // The encoded form is plain ASCII without XML specials.
    for piece in utf8_percent_encode(value, KEY_URL_ENCODE_SET) {
        out.push_str(piece);
    }
    out.push_str("</");
    out.push_str(name);
    out.push('>');
}

pub(crate) fn push_number_element(out: &mut String, name: &str, value: u64) {
    let _ = write!(out, "<{name}>{value}</{name}>");
}

pub(crate) fn push_bool_element(out: &mut String, name: &str, value: bool) {
    push_element(out, name, if value { "true" } else { "false" });
}

pub(crate) fn push_open_root(out: &mut String, name: &str) {
    out.push_str(XML_DECLARATION);
    out.push('<');
    out.push_str(name);
    out.push_str(" xmlns=\"");
    out.push_str(S3_XMLNS);
    out.push_str("\">");
}

/// `<ID>..</ID><DisplayName>..</DisplayName>` inside `<Owner>`.
pub(crate) fn push_owner(out: &mut String, owner_id: &str) {
    out.push_str("<Owner>");
    push_element(out, "ID", owner_id);
    push_element(out, "DisplayName", owner_id);
    out.push_str("</Owner>");
}
