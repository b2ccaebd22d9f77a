//! Bucket configurations: tags, CORS rules and lifecycle rules. The S3
//! front door parses a Put's XML into these models and stores their
//! normalized XML (`to_xml`) on the bucket-owner shard
//! (`store::bucket_config`); every shard parses the stored document again
//! into its bucket view (`BucketConfig::apply`), where requests (CORS) and
//! the shard's lifecycle runner read it without a hop.

use std::rc::Rc;

use crate::frontend::s3::xml::{parse_xml, XmlElement};

pub mod cors;
pub mod lifecycle;
pub mod tagging;

/// The kinds of bucket configuration, by the name their documents are
/// stored under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    Tagging,
    Cors,
    Lifecycle,
}

impl ConfigKind {
    pub const ALL: [ConfigKind; 3] = [ConfigKind::Tagging, ConfigKind::Cors, ConfigKind::Lifecycle];

    pub fn name(self) -> &'static str {
        match self {
            ConfigKind::Tagging => "tagging",
            ConfigKind::Cors => "cors",
            ConfigKind::Lifecycle => "lifecycle",
        }
    }

    pub fn from_name(name: &str) -> Option<ConfigKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Why a configuration was refused: an S3 status, code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn malformed(message: impl Into<String>) -> ConfigError {
        ConfigError {
            status: 400,
            code: "MalformedXML",
            message: message.into(),
        }
    }
    pub fn invalid_argument(message: impl Into<String>) -> ConfigError {
        ConfigError {
            status: 400,
            code: "InvalidArgument",
            message: message.into(),
        }
    }
    pub fn invalid_request(message: impl Into<String>) -> ConfigError {
        ConfigError {
            status: 400,
            code: "InvalidRequest",
            message: message.into(),
        }
    }
    pub fn not_implemented(message: impl Into<String>) -> ConfigError {
        ConfigError {
            status: 501,
            code: "NotImplemented",
            message: message.into(),
        }
    }
}

/// The root element of a configuration body, which must be `root`.
pub(crate) fn parse_root(body: &[u8], root: &str) -> Result<XmlElement, ConfigError> {
    let element = parse_xml(body)
        .map_err(ConfigError::malformed)?
        .ok_or_else(|| ConfigError::malformed(format!("The body must be a {root} element")))?;
    if element.name != root {
        return Err(ConfigError::malformed(format!(
            "The body must be a {root} element, not <{}>",
            element.name
        )));
    }
    Ok(element)
}

/// The text of the only `name` child of `parent`, if any; two is an error.
pub(crate) fn only_child<'a>(
    parent: &'a XmlElement,
    name: &str,
) -> Result<Option<&'a XmlElement>, ConfigError> {
    let mut found = parent.children.iter().filter(|c| c.name == name);
    let first = found.next();
    if found.next().is_some() {
        return Err(ConfigError::malformed(format!(
            "<{name}> given more than once in <{}>",
            parent.name
        )));
    }
    Ok(first)
}

/// A bucket's configurations as one shard sees them.
#[derive(Debug, Clone, Default)]
pub struct BucketConfig {
    pub tagging: Option<Rc<tagging::TagSet>>,
    pub cors: Option<Rc<cors::Cors>>,
    pub lifecycle: Option<Rc<lifecycle::Lifecycle>>,
    /// Seq of the write each kind reflects (0: none yet).
    seqs: [u64; 3],
}

impl BucketConfig {
    /// Applies the stored document of `kind` (None: removed) written at
    /// `seq`; a write older than the one applied is ignored (applies may
    /// arrive out of order). Returns whether it was applied. A document
    /// that no longer parses (written by another version) is logged and
    /// treated as absent.
    pub fn apply(&mut self, kind: ConfigKind, seq: u64, doc: Option<&[u8]>) -> bool {
        if seq <= self.seqs[kind.index()] {
            return false;
        }
        self.seqs[kind.index()] = seq;
        let parsed = doc.map(|doc| match kind {
            ConfigKind::Tagging => tagging::TagSet::parse_xml(doc, tagging::BUCKET_TAGS_MAX)
                .map(|t| self.tagging = Some(Rc::new(t))),
            ConfigKind::Cors => cors::Cors::parse(doc).map(|c| self.cors = Some(Rc::new(c))),
            ConfigKind::Lifecycle => {
                lifecycle::Lifecycle::parse(doc).map(|l| self.lifecycle = Some(Rc::new(l)))
            }
        });
        match parsed {
            None | Some(Err(_)) => {
                if let Some(Err(e)) = parsed {
                    tracing::warn!(
                        kind = kind.name(),
                        "stored bucket configuration ignored: {}",
                        e.message
                    );
                }
                match kind {
                    ConfigKind::Tagging => self.tagging = None,
                    ConfigKind::Cors => self.cors = None,
                    ConfigKind::Lifecycle => self.lifecycle = None,
                }
            }
            Some(Ok(())) => {}
        }
        true
    }
}

#[cfg(test)]
mod tests;
