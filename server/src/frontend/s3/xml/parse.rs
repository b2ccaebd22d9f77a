//! The request-body XML parser: a small tokenizer with bounded size and
//! depth and no DTDs, and the three request shapes built on it.

use super::*;
use crate::store::checksum::Algorithm;

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
/// The parts a CompleteMultipartUpload lists: (number, ETag), and the
/// checksums listed with each (`ChecksumCRC32` and the like), in order.
pub type CompleteParts = (Vec<(u32, String)>, Vec<Vec<(Algorithm, String)>>);

pub fn parse_complete_multipart(body: &[u8]) -> Result<CompleteParts, String> {
    use crate::store::mpu::PART_NUMBER_MAX;
    let root = parse_xml_limited(body, COMPLETE_BODY_BYTES_MAX)?
        .filter(|r| r.name == "CompleteMultipartUpload")
        .ok_or("The body must be a CompleteMultipartUpload element")?;
    let mut parts = Vec::new();
    let mut sums = Vec::new();
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
        let sum: Vec<(Algorithm, String)> = Algorithm::ALL
            .into_iter()
            .filter_map(|a| {
                p.child(&format!("Checksum{}", a.name()))
                    .map(|c| (a, c.text.trim().to_string()))
            })
            .collect();
        parts.push((number, etag));
        sums.push(sum);
    }
    Ok((parts, sums))
}

/// Most keys in one DeleteObjects request (S3's limit).
pub const DELETE_KEYS_MAX: usize = 1000;

/// One object of a DeleteObjects body: its key and `VersionId`, if any.
pub type DeleteEntry = (String, Option<String>);

/// Parses a DeleteObjects body into (quiet, entries); a missing Key is an
/// empty key, which the caller reports per key.
pub fn parse_delete(body: &[u8]) -> Result<(bool, Vec<DeleteEntry>), String> {
    let root = parse_xml(body)?
        .filter(|r| r.name == "Delete")
        .ok_or("The body must be a Delete element")?;
    let quiet = root
        .child("Quiet")
        .is_some_and(|q| q.text.trim().eq_ignore_ascii_case("true"));
    let keys: Vec<DeleteEntry> = root
        .children
        .iter()
        .filter(|c| c.name == "Object")
        .map(|o| {
            (
                o.child("Key").map(|k| k.text.clone()).unwrap_or_default(),
                o.child("VersionId").map(|v| v.text.trim().to_string()),
            )
        })
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
    parse_xml_limited(body, PARSE_BODY_BYTES_MAX)
}

/// `parse_xml` with another bound on the body's size.
pub fn parse_xml_limited(body: &[u8], bytes_max: usize) -> Result<Option<XmlElement>, String> {
    if body.len() > bytes_max {
        return Err(format!("XML body larger than {bytes_max} bytes"));
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
