//! S3 XML: building response bodies, and a tiny parser for the request
//! bodies accepted so far (CreateBucketConfiguration).
//!
//! Output is written straight into one pre-sized String; no XML library,
//! because S3's response shapes are fixed and small.

use crate::frontend::http::civil_from_days;
use std::fmt::Write as _;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

pub(crate) const XML_DECLARATION: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
pub(crate) const S3_XMLNS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";
/// Owner shown in listings that ask for one (fetch-owner=true) when the
/// caller has no better id to give.
pub const OWNER_ID_DEFAULT: &str = "percore";
/// Largest request body the parser accepts.
pub const PARSE_BODY_BYTES_MAX: usize = 1 << 20;
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

// ---------------------------------------------------------------------------
// Response bodies

/// `<Error>` body for any failed request.
pub fn error_body(code: &str, message: &str, resource: &str, request_id: &str) -> String {
    let mut out = String::with_capacity(
        XML_DECLARATION.len() + 96 + code.len() + message.len() + resource.len() + request_id.len(),
    );
    out.push_str(XML_DECLARATION);
    out.push_str("<Error>");
    push_element(&mut out, "Code", code);
    push_element(&mut out, "Message", message);
    push_element(&mut out, "Resource", resource);
    push_element(&mut out, "RequestId", request_id);
    out.push_str("</Error>");
    out
}

pub struct BucketEntry {
    pub name: String,
    pub created_unix_ms: u64,
}

/// ListBuckets (`GET /`) response.
pub fn list_buckets(owner_id: &str, buckets: &[BucketEntry]) -> String {
    let names_bytes: usize = buckets.iter().map(|b| b.name.len()).sum();
    let mut out = String::with_capacity(256 + names_bytes + buckets.len() * 96);
    push_open_root(&mut out, "ListAllMyBucketsResult");
    push_owner(&mut out, owner_id);
    out.push_str("<Buckets>");
    for bucket in buckets {
        out.push_str("<Bucket>");
        push_element(&mut out, "Name", &bucket.name);
        push_element(
            &mut out,
            "CreationDate",
            &iso8601_ms(bucket.created_unix_ms),
        );
        out.push_str("</Bucket>");
    }
    out.push_str("</Buckets></ListAllMyBucketsResult>");
    out
}

pub struct ObjectEntry {
    pub key: String,
    pub size: u64,
    /// With the surrounding quotes, as sent in the ETag header.
    pub etag: String,
    pub last_modified_unix_ms: u64,
}

/// ListObjectsV2 parameters and page.
pub struct ListV2 {
    pub bucket: String,
    pub prefix: String,
    pub delimiter: Option<String>,
    pub max_keys: u32,
    pub key_count: u32,
    pub is_truncated: bool,
    pub continuation_token: Option<String>,
    pub next_continuation_token: Option<String>,
    pub start_after: Option<String>,
    pub encoding_url: bool,
    pub contents: Vec<ObjectEntry>,
    pub common_prefixes: Vec<String>,
    pub fetch_owner: bool,
}

/// ListObjectsV2 (`GET /bucket?list-type=2`) response; owners, if asked
/// for, are [`OWNER_ID_DEFAULT`].
pub fn list_objects_v2(l: &ListV2) -> String {
    list_objects_v2_with_owner(l, OWNER_ID_DEFAULT)
}

/// As [`list_objects_v2`], naming `owner_id` as every object's owner when
/// fetch-owner=true.
pub fn list_objects_v2_with_owner(l: &ListV2, owner_id: &str) -> String {
    // A page never holds more entries than were asked for.
    debug_assert!(l.contents.len() + l.common_prefixes.len() <= l.max_keys as usize);
    let mut out = String::with_capacity(listing_capacity(&l.contents, &l.common_prefixes));
    push_open_root(&mut out, "ListBucketResult");
    push_element(&mut out, "Name", &l.bucket);
    push_key_element(&mut out, "Prefix", &l.prefix, l.encoding_url);
    if let Some(delimiter) = &l.delimiter {
        push_key_element(&mut out, "Delimiter", delimiter, l.encoding_url);
    }
    if let Some(token) = &l.continuation_token {
        push_element(&mut out, "ContinuationToken", token);
    }
    if let Some(token) = &l.next_continuation_token {
        push_element(&mut out, "NextContinuationToken", token);
    }
    if let Some(start_after) = &l.start_after {
        push_key_element(&mut out, "StartAfter", start_after, l.encoding_url);
    }
    push_number_element(&mut out, "KeyCount", u64::from(l.key_count));
    push_number_element(&mut out, "MaxKeys", u64::from(l.max_keys));
    if l.encoding_url {
        push_element(&mut out, "EncodingType", "url");
    }
    push_bool_element(&mut out, "IsTruncated", l.is_truncated);
    let owner = l.fetch_owner.then_some(owner_id);
    push_listing(
        &mut out,
        &l.contents,
        &l.common_prefixes,
        l.encoding_url,
        owner,
    );
    out.push_str("</ListBucketResult>");
    out
}

/// ListObjects (v1) parameters and page.
pub struct ListV1 {
    pub bucket: String,
    pub prefix: String,
    pub delimiter: Option<String>,
    pub marker: String,
    pub next_marker: Option<String>,
    pub max_keys: u32,
    pub is_truncated: bool,
    pub encoding_url: bool,
    pub contents: Vec<ObjectEntry>,
    pub common_prefixes: Vec<String>,
}

/// ListObjects v1 (`GET /bucket`) response.
pub fn list_objects_v1(l: &ListV1) -> String {
    let mut out = String::with_capacity(listing_capacity(&l.contents, &l.common_prefixes));
    push_open_root(&mut out, "ListBucketResult");
    push_element(&mut out, "Name", &l.bucket);
    push_key_element(&mut out, "Prefix", &l.prefix, l.encoding_url);
    push_key_element(&mut out, "Marker", &l.marker, l.encoding_url);
    if let Some(next_marker) = &l.next_marker {
        push_key_element(&mut out, "NextMarker", next_marker, l.encoding_url);
    }
    push_number_element(&mut out, "MaxKeys", u64::from(l.max_keys));
    if let Some(delimiter) = &l.delimiter {
        push_key_element(&mut out, "Delimiter", delimiter, l.encoding_url);
    }
    if l.encoding_url {
        push_element(&mut out, "EncodingType", "url");
    }
    push_bool_element(&mut out, "IsTruncated", l.is_truncated);
    push_listing(
        &mut out,
        &l.contents,
        &l.common_prefixes,
        l.encoding_url,
        None,
    );
    out.push_str("</ListBucketResult>");
    out
}

fn listing_capacity(contents: &[ObjectEntry], common_prefixes: &[String]) -> usize {
    let keys_bytes: usize = contents.iter().map(|o| o.key.len()).sum();
    let prefixes_bytes: usize = common_prefixes.iter().map(|p| p.len() + 40).sum();
    512 + keys_bytes + contents.len() * 240 + prefixes_bytes
}

fn push_listing(
    out: &mut String,
    contents: &[ObjectEntry],
    common_prefixes: &[String],
    encode_url: bool,
    owner_id: Option<&str>,
) {
    for object in contents {
        out.push_str("<Contents>");
        push_key_element(out, "Key", &object.key, encode_url);
        push_element(
            out,
            "LastModified",
            &iso8601_ms(object.last_modified_unix_ms),
        );
        push_element(out, "ETag", &object.etag);
        push_number_element(out, "Size", object.size);
        if let Some(owner_id) = owner_id {
            push_owner(out, owner_id);
        }
        push_element(out, "StorageClass", "STANDARD");
        out.push_str("</Contents>");
    }
    for prefix in common_prefixes {
        out.push_str("<CommonPrefixes>");
        push_key_element(out, "Prefix", prefix, encode_url);
        out.push_str("</CommonPrefixes>");
    }
}

/// GetBucketLocation response; us-east-1 (or no region) is the empty element,
/// as S3 returns it.
pub fn location_constraint(region: &str) -> String {
    let mut out = String::with_capacity(XML_DECLARATION.len() + 96 + region.len());
    out.push_str(XML_DECLARATION);
    out.push_str("<LocationConstraint xmlns=\"");
    out.push_str(S3_XMLNS);
    if region.is_empty() || region == "us-east-1" {
        out.push_str("\"/>");
        return out;
    }
    out.push_str("\">");
    push_escaped(&mut out, region);
    out.push_str("</LocationConstraint>");
    out
}

/// Unix milliseconds as `2013-05-24T00:00:00.000Z`.
pub fn iso8601_ms(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, secs_of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    )
}

// ---------------------------------------------------------------------------
// Request bodies

/// Parses `<CreateBucketConfiguration><LocationConstraint>x</LocationConstraint></CreateBucketConfiguration>`.
/// An empty body, a configuration without LocationConstraint, or an empty
/// LocationConstraint is `Ok(None)`; a malformed body is `Err`.
pub fn parse_create_bucket(body: &[u8]) -> Result<Option<String>, String> {
    let Some(root) = parse_xml(body)? else {
        return Ok(None);
    };
    if root.name != "CreateBucketConfiguration" {
        return Err(format!("unexpected root element <{}>", root.name));
    }
    let mut constraints = root
        .children
        .iter()
        .filter(|c| c.name == "LocationConstraint");
    let constraint = constraints.next();
    if constraints.next().is_some() {
        return Err("LocationConstraint given more than once".into());
    }
    Ok(constraint
        .map(|c| c.text.trim())
        .filter(|region| !region.is_empty())
        .map(str::to_string))
}

/// Parses a CompleteMultipartUpload body into (part number, ETag without
/// quotes, lowercased) in document order; order and duplicates are the
/// store's to judge.
pub fn parse_complete_multipart(body: &[u8]) -> Result<Vec<(u32, String)>, String> {
    use crate::store::mpu::PART_NUMBER_MAX;
    let root = parse_xml(body)?
        .filter(|r| r.name == "CompleteMultipartUpload")
        .ok_or("The body must be a CompleteMultipartUpload element")?;
    let mut parts = Vec::new();
    for p in root.children.iter().filter(|c| c.name == "Part") {
        if parts.len() >= PART_NUMBER_MAX as usize {
            return Err("At most 10000 parts".into());
        }
        let number = p
            .child("PartNumber")
            .and_then(|n| n.text.trim().parse::<u32>().ok())
            .filter(|n| (1..=PART_NUMBER_MAX).contains(n))
            .ok_or("Every Part needs a PartNumber between 1 and 10000")?;
        let etag = p
            .child("ETag")
            .map(|e| e.text.trim().trim_matches('"').to_ascii_lowercase())
            .ok_or("Every Part needs an ETag")?;
        parts.push((number, etag));
    }
    Ok(parts)
}

/// Most keys in one DeleteObjects request (S3's limit).
pub const DELETE_KEYS_MAX: usize = 1000;

/// Parses a DeleteObjects body into (quiet, keys); a missing Key is an
/// empty key, which the caller reports per key.
pub fn parse_delete(body: &[u8]) -> Result<(bool, Vec<String>), String> {
    let root = parse_xml(body)?
        .filter(|r| r.name == "Delete")
        .ok_or("The body must be a Delete element")?;
    let quiet = root
        .child("Quiet")
        .is_some_and(|q| q.text.trim().eq_ignore_ascii_case("true"));
    let keys: Vec<String> = root
        .children
        .iter()
        .filter(|c| c.name == "Object")
        .map(|o| o.child("Key").map(|k| k.text.clone()).unwrap_or_default())
        .collect();
    if keys.len() > DELETE_KEYS_MAX {
        return Err(format!(
            "A DeleteObjects request takes at most {DELETE_KEYS_MAX} keys"
        ));
    }
    Ok((quiet, keys))
}

/// One parsed element: local name (namespace prefix dropped), its own text
/// (entities decoded, child text excluded), and child elements. Attributes
/// are skipped: no request body we accept needs them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XmlElement {
    pub name: String,
    pub text: String,
    pub children: Vec<XmlElement>,
}

impl XmlElement {
    /// First child with this local name.
    pub fn child(&self, name: &str) -> Option<&XmlElement> {
        self.children.iter().find(|c| c.name == name)
    }
}

/// Parse a small XML document into its root element; an empty (or
/// whitespace-only) body is `Ok(None)`. DTDs are refused (no entity
/// expansion), nesting and size are bounded.
pub fn parse_xml(body: &[u8]) -> Result<Option<XmlElement>, String> {
    if body.len() > PARSE_BODY_BYTES_MAX {
        return Err(format!("XML body larger than {PARSE_BODY_BYTES_MAX} bytes"));
    }
    let text = std::str::from_utf8(body).map_err(|_| "XML body is not UTF-8".to_string())?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut tokens = Tokenizer { rest: text };
    let mut stack: Vec<XmlElement> = Vec::new();
    let mut root: Option<XmlElement> = None;
    while let Some(token) = tokens.next_token()? {
        match token {
            Token::Open { name, self_closing } => {
                if root.is_some() {
                    return Err("content after the root element".into());
                }
                if stack.len() >= PARSE_DEPTH_MAX {
                    return Err("XML nested too deeply".into());
                }
                let element = XmlElement {
                    name: local_name(name).to_string(),
                    ..XmlElement::default()
                };
                if self_closing {
                    close_element(&mut stack, &mut root, element);
                } else {
                    stack.push(element);
                }
            }
            Token::Close(name) => {
                let element = stack.pop().ok_or_else(|| format!("unexpected </{name}>"))?;
                if element.name != local_name(name) {
                    return Err(format!("<{}> closed by </{name}>", element.name));
                }
                close_element(&mut stack, &mut root, element);
            }
            Token::Text(raw) => match stack.last_mut() {
                Some(element) => decode_entities(raw, &mut element.text)?,
                None if raw.trim().is_empty() => {}
                None => return Err("text outside the root element".into()),
            },
            Token::CData(raw) => match stack.last_mut() {
                Some(element) => element.text.push_str(raw),
                None => return Err("CDATA outside the root element".into()),
            },
        }
    }
    if let Some(open) = stack.last() {
        return Err(format!("<{}> is not closed", open.name));
    }
    Ok(root)
}

fn close_element(stack: &mut [XmlElement], root: &mut Option<XmlElement>, element: XmlElement) {
    match stack.last_mut() {
        Some(parent) => parent.children.push(element),
        None => *root = Some(element),
    }
}

fn local_name(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(_, local)| local)
}

enum Token<'a> {
    Open { name: &'a str, self_closing: bool },
    Close(&'a str),
    Text(&'a str),
    CData(&'a str),
}

/// Splits a document into tags and text, skipping declarations and comments.
struct Tokenizer<'a> {
    rest: &'a str,
}

impl<'a> Tokenizer<'a> {
    fn next_token(&mut self) -> Result<Option<Token<'a>>, String> {
        loop {
            if self.rest.is_empty() {
                return Ok(None);
            }
            if !self.rest.starts_with('<') {
                let end = self.rest.find('<').unwrap_or(self.rest.len());
                return Ok(Some(Token::Text(self.advance(end, 0))));
            }
            if self.rest.starts_with("<?") {
                self.skip_past("?>")?;
            } else if self.rest.starts_with("<!--") {
                self.skip_past("-->")?;
            } else if let Some(after) = self.rest.strip_prefix("<![CDATA[") {
                let end = after.find("]]>").ok_or("unterminated CDATA")?;
                self.rest = after;
                return Ok(Some(Token::CData(self.advance(end, 3))));
            } else if self.rest.starts_with("<!") {
                return Err("DTDs are not allowed".into());
            } else {
                return self.tag().map(Some);
            }
        }
    }

    /// Return the next `len` bytes and drop them plus `skip` more.
    fn advance(&mut self, len: usize, skip: usize) -> &'a str {
        let (taken, rest) = self.rest.split_at(len);
        self.rest = &rest[skip..];
        taken
    }

    fn skip_past(&mut self, terminator: &str) -> Result<(), String> {
        let end = self
            .rest
            .find(terminator)
            .ok_or_else(|| format!("missing {terminator:?}"))?;
        self.rest = &self.rest[end + terminator.len()..];
        Ok(())
    }

    fn tag(&mut self) -> Result<Token<'a>, String> {
        debug_assert!(self.rest.starts_with('<'));
        let end = tag_end(self.rest).ok_or("unterminated tag")?;
        let inner = &self.rest[1..end];
        self.rest = &self.rest[end + 1..];
        if let Some(name) = inner.strip_prefix('/') {
            return Ok(Token::Close(valid_name(name.trim_end())?));
        }
        let (inner, self_closing) = match inner.strip_suffix('/') {
            Some(inner) => (inner, true),
            None => (inner, false),
        };
        let name_end = inner
            .find(|c: char| c.is_ascii_whitespace())
            .unwrap_or(inner.len());
        let name = valid_name(&inner[..name_end])?;
        Ok(Token::Open { name, self_closing })
    }
}

/// Offset of the '>' closing the tag at the start of `s`, skipping quoted
/// attribute values.
fn tag_end(s: &str) -> Option<usize> {
    let mut quote: Option<u8> = None;
    for (i, byte) in s.bytes().enumerate() {
        match (quote, byte) {
            (None, b'>') => return Some(i),
            (None, b'"' | b'\'') => quote = Some(byte),
            (Some(q), _) if q == byte => quote = None,
            _ => {}
        }
    }
    None
}

fn valid_name(name: &str) -> Result<&str, String> {
    let ok = !name.is_empty()
        && !name.bytes().any(|b| {
            b.is_ascii_whitespace() || matches!(b, b'<' | b'>' | b'/' | b'=' | b'"' | b'\'' | b'&')
        });
    if ok {
        Ok(name)
    } else {
        Err(format!("invalid element name {name:?}"))
    }
}

/// Append `raw` text with the predefined and numeric entities decoded.
fn decode_entities(raw: &str, out: &mut String) -> Result<(), String> {
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let semi = after.find(';').ok_or("unterminated entity")?;
        let entity = &after[..semi];
        let decoded = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => numeric_entity(entity).ok_or_else(|| format!("unknown entity &{entity};"))?,
        };
        out.push(decoded);
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    Ok(())
}

fn numeric_entity(entity: &str) -> Option<char> {
    let digits = entity.strip_prefix('#')?;
    let code = match digits
        .strip_prefix('x')
        .or_else(|| digits.strip_prefix('X'))
    {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => digits.parse().ok()?,
    };
    char::from_u32(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECL: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    /// 2013-05-24T00:00:00Z.
    const MAY_24_2013_MS: u64 = 1_369_353_600_000;

    fn object(key: &str) -> ObjectEntry {
        ObjectEntry {
            key: key.to_string(),
            size: 11,
            etag: "\"5eb63bbbe01eeed093cb22bb8f5acdc3\"".to_string(),
            last_modified_unix_ms: MAY_24_2013_MS + 1234,
        }
    }

    #[test]
    fn escape_specials_and_controls() {
        assert_eq!(escape("plain ü ☃"), "plain ü ☃");
        assert_eq!(escape("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
        assert_eq!(
            escape("x\u{1}y\tz\r\n\u{1f}"),
            "x&#x1;y&#x9;z&#xD;&#xA;&#x1F;"
        );
        assert_eq!(escape(""), "");
        assert_eq!(escape("&&"), "&amp;&amp;");
    }

    #[test]
    fn error_body_shape() {
        assert_eq!(
            error_body("NoSuchKey", "The specified key does not exist.", "/b/a&b", "req-1"),
            format!(
                "{DECL}<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message>\
                 <Resource>/b/a&amp;b</Resource><RequestId>req-1</RequestId></Error>"
            )
        );
    }

    #[test]
    fn iso8601_dates() {
        assert_eq!(iso8601_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_ms(MAY_24_2013_MS), "2013-05-24T00:00:00.000Z");
        assert_eq!(
            iso8601_ms(MAY_24_2013_MS + 3_723_004),
            "2013-05-24T01:02:03.004Z"
        );
        assert_eq!(iso8601_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601_ms(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(iso8601_ms(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(iso8601_ms(1_709_164_800_000), "2024-02-29T00:00:00.000Z");
        assert_eq!(iso8601_ms(1_735_689_599_000), "2024-12-31T23:59:59.000Z");
        // Every day for 1000 years is consecutive and well-formed.
        let mut previous = (1969, 12, 31);
        for day in 0..365_243 {
            let current = civil_from_days(day);
            let next_day_same_month = (previous.0, previous.1, previous.2 + 1);
            let next_month = (previous.0, previous.1 + 1, 1);
            let next_year = (previous.0 + 1, 1, 1);
            assert!(
                current == next_day_same_month || current == next_month || current == next_year,
                "{previous:?} -> {current:?}"
            );
            previous = current;
        }
        assert_eq!(previous, (2969, 12, 31));
    }

    #[test]
    fn list_buckets_shape() {
        let buckets = [
            BucketEntry {
                name: "alpha".into(),
                created_unix_ms: MAY_24_2013_MS,
            },
            BucketEntry {
                name: "beta".into(),
                created_unix_ms: MAY_24_2013_MS + 1,
            },
        ];
        assert_eq!(
            list_buckets("owner<1>", &buckets),
            format!(
                "{DECL}<ListAllMyBucketsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <Owner><ID>owner&lt;1&gt;</ID><DisplayName>owner&lt;1&gt;</DisplayName></Owner>\
                 <Buckets><Bucket><Name>alpha</Name><CreationDate>2013-05-24T00:00:00.000Z</CreationDate></Bucket>\
                 <Bucket><Name>beta</Name><CreationDate>2013-05-24T00:00:00.001Z</CreationDate></Bucket>\
                 </Buckets></ListAllMyBucketsResult>"
            )
        );
        assert!(list_buckets("o", &[]).contains("<Buckets></Buckets>"));
    }

    fn sample_v2() -> ListV2 {
        ListV2 {
            bucket: "bucket".into(),
            prefix: "photos/".into(),
            delimiter: Some("/".into()),
            max_keys: 2,
            key_count: 2,
            is_truncated: true,
            continuation_token: Some("tok+1/=".into()),
            next_continuation_token: Some("tok&2".into()),
            start_after: None,
            encoding_url: false,
            contents: vec![object("photos/a&b.jpg")],
            common_prefixes: vec!["photos/2024/".into()],
            fetch_owner: false,
        }
    }

    #[test]
    fn list_v2_plain() {
        assert_eq!(
            list_objects_v2(&sample_v2()),
            format!(
                "{DECL}<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <Name>bucket</Name><Prefix>photos/</Prefix><Delimiter>/</Delimiter>\
                 <ContinuationToken>tok+1/=</ContinuationToken><NextContinuationToken>tok&amp;2</NextContinuationToken>\
                 <KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>\
                 <Contents><Key>photos/a&amp;b.jpg</Key><LastModified>2013-05-24T00:00:01.234Z</LastModified>\
                 <ETag>&quot;5eb63bbbe01eeed093cb22bb8f5acdc3&quot;</ETag><Size>11</Size>\
                 <StorageClass>STANDARD</StorageClass></Contents>\
                 <CommonPrefixes><Prefix>photos/2024/</Prefix></CommonPrefixes></ListBucketResult>"
            )
        );
    }

    #[test]
    fn list_v2_url_encoding_and_owner() {
        let mut list = sample_v2();
        list.encoding_url = true;
        list.fetch_owner = true;
        list.prefix = "a b+c/".into();
        list.start_after = Some("a b+c/ü=1".into());
        list.contents = vec![object("a b+c/ü=1&\u{1}.txt")];
        list.common_prefixes = vec!["a b+c/~x y/".into()];
        let xml = list_objects_v2_with_owner(&list, "me");
        assert!(xml.contains("<Prefix>a%20b%2Bc/</Prefix>"), "{xml}");
        assert!(xml.contains("<Delimiter>/</Delimiter>"));
        assert!(xml.contains("<StartAfter>a%20b%2Bc/%C3%BC%3D1</StartAfter>"));
        assert!(xml.contains("<Key>a%20b%2Bc/%C3%BC%3D1%26%01.txt</Key>"));
        assert!(xml.contains("<CommonPrefixes><Prefix>a%20b%2Bc/~x%20y/</Prefix></CommonPrefixes>"));
        assert!(xml.contains("<EncodingType>url</EncodingType>"));
        assert!(xml.contains(
            "<Size>11</Size><Owner><ID>me</ID><DisplayName>me</DisplayName></Owner><StorageClass>"
        ));
        // Tokens are opaque: escaped, never URL-encoded.
        assert!(xml.contains("<ContinuationToken>tok+1/=</ContinuationToken>"));
        assert!(list_objects_v2(&list).contains("<Owner><ID>percore</ID>"));
        // Parses back as XML with the expected values.
        let root = parse_xml(xml.as_bytes()).unwrap().unwrap();
        assert_eq!(root.name, "ListBucketResult");
        assert_eq!(root.child("KeyCount").unwrap().text, "2");
        assert_eq!(
            root.child("Contents").unwrap().child("ETag").unwrap().text,
            "\"5eb63bbbe01eeed093cb22bb8f5acdc3\""
        );
    }

    #[test]
    fn list_v2_minimal() {
        let list = ListV2 {
            bucket: "b".into(),
            prefix: String::new(),
            delimiter: None,
            max_keys: 1000,
            key_count: 0,
            is_truncated: false,
            continuation_token: None,
            next_continuation_token: None,
            start_after: None,
            encoding_url: false,
            contents: Vec::new(),
            common_prefixes: Vec::new(),
            fetch_owner: false,
        };
        assert_eq!(
            list_objects_v2(&list),
            format!(
                "{DECL}<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <Name>b</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>\
                 <IsTruncated>false</IsTruncated></ListBucketResult>"
            )
        );
    }

    #[test]
    fn list_v1_shape() {
        let list = ListV1 {
            bucket: "b".into(),
            prefix: "p q/".into(),
            delimiter: Some("/".into()),
            marker: "p q/a".into(),
            next_marker: Some("p q/c".into()),
            max_keys: 1,
            is_truncated: true,
            encoding_url: true,
            contents: vec![object("p q/b")],
            common_prefixes: vec![],
        };
        assert_eq!(
            list_objects_v1(&list),
            format!(
                "{DECL}<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <Name>b</Name><Prefix>p%20q/</Prefix><Marker>p%20q/a</Marker><NextMarker>p%20q/c</NextMarker>\
                 <MaxKeys>1</MaxKeys><Delimiter>/</Delimiter><EncodingType>url</EncodingType>\
                 <IsTruncated>true</IsTruncated><Contents><Key>p%20q/b</Key>\
                 <LastModified>2013-05-24T00:00:01.234Z</LastModified>\
                 <ETag>&quot;5eb63bbbe01eeed093cb22bb8f5acdc3&quot;</ETag><Size>11</Size>\
                 <StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>"
            )
        );
    }

    #[test]
    fn location_constraint_shape() {
        let xmlns = "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"";
        assert_eq!(
            location_constraint("us-east-1"),
            format!("{DECL}<LocationConstraint {xmlns}/>")
        );
        assert_eq!(
            location_constraint(""),
            format!("{DECL}<LocationConstraint {xmlns}/>")
        );
        assert_eq!(
            location_constraint("eu-west-1"),
            format!("{DECL}<LocationConstraint {xmlns}>eu-west-1</LocationConstraint>")
        );
    }

    #[test]
    fn create_bucket_bodies() {
        assert_eq!(parse_create_bucket(b""), Ok(None));
        assert_eq!(parse_create_bucket(b" \r\n\t "), Ok(None));
        assert_eq!(
            parse_create_bucket(
                b"<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                  <LocationConstraint>eu-central-1</LocationConstraint></CreateBucketConfiguration>"
            ),
            Ok(Some("eu-central-1".into()))
        );
        // As boto3 sends it: declaration, newlines, indentation.
        let boto = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
                    <CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\n  \
                    <LocationConstraint> us-west-2 </LocationConstraint>\n</CreateBucketConfiguration>\n";
        assert_eq!(
            parse_create_bucket(boto.as_bytes()),
            Ok(Some("us-west-2".into()))
        );
        assert_eq!(
            parse_create_bucket(b"\xef\xbb\xbf<!-- hi --><s3:CreateBucketConfiguration xmlns:s3='x'><s3:LocationConstraint>a&amp;b&#x41;&#66;</s3:LocationConstraint></s3:CreateBucketConfiguration>"),
            Ok(Some("a&bAB".into()))
        );
        assert_eq!(
            parse_create_bucket(b"<CreateBucketConfiguration><LocationConstraint><![CDATA[x<y]]></LocationConstraint></CreateBucketConfiguration>"),
            Ok(Some("x<y".into()))
        );
        assert_eq!(
            parse_create_bucket(b"<CreateBucketConfiguration/>"),
            Ok(None)
        );
        assert_eq!(
            parse_create_bucket(
                b"<CreateBucketConfiguration><LocationConstraint/></CreateBucketConfiguration>"
            ),
            Ok(None)
        );
        assert_eq!(
            parse_create_bucket(b"<CreateBucketConfiguration><Bucket><Type>Directory</Type></Bucket><LocationConstraint>r</LocationConstraint></CreateBucketConfiguration>"),
            Ok(Some("r".into()))
        );
    }

    #[test]
    fn create_bucket_malformed() {
        let bad: &[&[u8]] = &[
            b"<CreateBucketConfiguration>",
            b"<CreateBucketConfiguration><LocationConstraint>x</CreateBucketConfiguration>",
            b"<CreateBucketConfiguration><LocationConstraint>x</LocationConstraint>",
            b"<Other><LocationConstraint>x</LocationConstraint></Other>",
            b"<CreateBucketConfiguration></CreateBucketConfiguration><Again/>",
            b"text<CreateBucketConfiguration/>",
            b"<CreateBucketConfiguration/>trailing",
            b"</CreateBucketConfiguration>",
            b"<CreateBucketConfiguration><LocationConstraint>&bogus;</LocationConstraint></CreateBucketConfiguration>",
            b"<CreateBucketConfiguration><LocationConstraint>a &amp b</LocationConstraint></CreateBucketConfiguration>",
            b"<!DOCTYPE x [<!ENTITY a \"b\">]><CreateBucketConfiguration/>",
            b"<CreateBucketConfiguration",
            b"< CreateBucketConfiguration/>",
            b"\xff\xfe",
            b"<CreateBucketConfiguration><LocationConstraint>a</LocationConstraint><LocationConstraint>b</LocationConstraint></CreateBucketConfiguration>",
            b"<!-- unterminated",
        ];
        for body in bad {
            assert!(
                parse_create_bucket(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let deep = "<a>".repeat(PARSE_DEPTH_MAX + 1);
        assert!(parse_xml(deep.as_bytes()).unwrap_err().contains("deep"));
        let huge = vec![b' '; PARSE_BODY_BYTES_MAX + 1];
        assert!(parse_xml(&huge).is_err());
    }

    #[test]
    fn escaped_output_parses_back() {
        let nasty = "k&<>\"' ü\t";
        let body = error_body("Code", nasty, nasty, "id");
        let root = parse_xml(body.as_bytes()).unwrap().unwrap();
        assert_eq!(root.child("Message").unwrap().text, nasty);
        assert_eq!(root.child("Resource").unwrap().text, nasty);
    }
}
