//! Tag sets of objects and buckets: the `Tagging` XML body of
//! Put*Tagging, the URL-encoded `x-amz-tagging` header of PUT, Copy and
//! CreateMultipartUpload, and S3's limits on both.

use super::{only_child, parse_root, ConfigError};
use crate::frontend::s3::xml::{push_element, push_open_root};

/// S3's limits: 10 tags on an object, 50 on a bucket; keys of at most 128
/// and values of at most 256 Unicode characters.
pub const OBJECT_TAGS_MAX: usize = 10;
pub const BUCKET_TAGS_MAX: usize = 50;
pub const TAG_KEY_CHARS_MAX: usize = 128;
pub const TAG_VALUE_CHARS_MAX: usize = 256;

/// The stored metadata entry holding an object's tags (URL-encoded, as
/// `x-amz-tagging` sends them). Never returned as a response header.
pub const OBJECT_TAGS_HEADER: &str = "x-amz-tagging";

/// Tags in the order given; keys are unique.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TagSet(pub Vec<(String, String)>);

fn invalid_tag(message: impl Into<String>) -> ConfigError {
    ConfigError {
        status: 400,
        code: "InvalidTag",
        message: message.into(),
    }
}

/// Letters, digits, white space and `+ - = . _ : / @` (S3's rule).
fn allowed_char(c: char) -> bool {
    c.is_alphanumeric() || c == ' ' || "+-=._:/@".contains(c)
}

impl TagSet {
    fn check(tags: Vec<(String, String)>, max: usize) -> Result<TagSet, ConfigError> {
        if tags.len() > max {
            return Err(ConfigError {
                status: 400,
                code: "BadRequest",
                message: format!("At most {max} tags are allowed here; {} given", tags.len()),
            });
        }
        for (i, (k, v)) in tags.iter().enumerate() {
            if k.is_empty() || k.chars().count() > TAG_KEY_CHARS_MAX {
                return Err(invalid_tag(format!(
                    "A tag key must be 1 to {TAG_KEY_CHARS_MAX} characters long"
                )));
            }
            if v.chars().count() > TAG_VALUE_CHARS_MAX {
                return Err(invalid_tag(format!(
                    "A tag value must be at most {TAG_VALUE_CHARS_MAX} characters long"
                )));
            }
            if !k.chars().chain(v.chars()).all(allowed_char) {
                return Err(invalid_tag(
                    "Tags may contain only letters, digits, spaces and + - = . _ : / @",
                ));
            }
            if k.starts_with("aws:") {
                return Err(invalid_tag("Tag keys starting with aws: are reserved"));
            }
            if tags[..i].iter().any(|(other, _)| other == k) {
                return Err(invalid_tag(format!("Duplicate tag key {k:?}")));
            }
        }
        Ok(TagSet(tags))
    }

    /// `<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag>..`.
    pub fn parse_xml(body: &[u8], max: usize) -> Result<TagSet, ConfigError> {
        let root = parse_root(body, "Tagging")?;
        let set = only_child(&root, "TagSet")?
            .ok_or_else(|| ConfigError::malformed("Tagging needs a TagSet"))?;
        let mut tags = Vec::new();
        for tag in &set.children {
            if tag.name != "Tag" {
                return Err(ConfigError::malformed(format!(
                    "unexpected <{}> in TagSet",
                    tag.name
                )));
            }
            if tags.len() > max {
                break; // `check` refuses it; stop reading.
            }
            let key = only_child(tag, "Key")?
                .ok_or_else(|| ConfigError::malformed("Every Tag needs a Key"))?;
            let value = only_child(tag, "Value")?
                .ok_or_else(|| ConfigError::malformed("Every Tag needs a Value"))?;
            tags.push((key.text.clone(), value.text.clone()));
        }
        Self::check(tags, max)
    }

    /// The `x-amz-tagging` header: `k1=v1&k2=v2`, URL-encoded.
    pub fn parse_query(header: &str, max: usize) -> Result<TagSet, ConfigError> {
        let mut tags = Vec::new();
        for pair in header.split('&').filter(|p| !p.is_empty()) {
            if tags.len() > max {
                break;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| {
                let s = s.replace('+', " ");
                percent_encoding::percent_decode_str(&s)
                    .decode_utf8()
                    .map(|c| c.into_owned())
                    .map_err(|_| invalid_tag("x-amz-tagging is not valid UTF-8 once decoded"))
            };
            tags.push((decode(k)?, decode(v)?));
        }
        Self::check(tags, max)
    }

    /// The URL-encoded form, as stored and as `x-amz-tagging` takes it.
    pub fn to_query(&self) -> String {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        let mut out = String::new();
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push('&');
            }
            out.extend(utf8_percent_encode(k, NON_ALPHANUMERIC));
            out.push('=');
            out.extend(utf8_percent_encode(v, NON_ALPHANUMERIC));
        }
        out
    }

    /// The `Tagging` document GetObjectTagging and GetBucketTagging answer.
    pub fn to_xml(&self) -> String {
        let mut out = String::with_capacity(128 + 64 * self.0.len());
        push_open_root(&mut out, "Tagging");
        out.push_str("<TagSet>");
        for (k, v) in &self.0 {
            out.push_str("<Tag>");
            push_element(&mut out, "Key", k);
            push_element(&mut out, "Value", v);
            out.push_str("</Tag>");
        }
        out.push_str("</TagSet></Tagging>");
        out
    }

    /// Whether every tag of `wanted` is in this set with the same value.
    pub fn contains_all(&self, wanted: &[(String, String)]) -> bool {
        wanted
            .iter()
            .all(|w| self.0.iter().any(|(k, v)| *k == w.0 && *v == w.1))
    }
}
