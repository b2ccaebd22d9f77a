//! Bucket configurations: tags, CORS rules and lifecycle rules. The S3
//! front door parses a Put's XML into these models and stores their
//! normalized XML (`to_xml`) on the bucket-owner shard
//! (`store::bucket_config`); every shard parses the stored document again
//! into its bucket view (`BucketConfig::apply`), where requests (CORS) and
//! the shard's lifecycle runner read it without a hop.

use std::rc::Rc;

use crate::frontend::s3::xml::{parse_xml, XmlElement};
use crate::store::versions::Versioning;

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
    /// The user who created the bucket (absent: the root principal).
    Owner,
    /// The bucket policy (JSON, as given).
    Policy,
    /// The canned ACL: `public-read` (absent: private).
    Acl,
    /// `Enabled` or `Suspended` (absent: never versioned).
    Versioning,
}

impl ConfigKind {
    pub const ALL: [ConfigKind; 7] = [
        ConfigKind::Tagging,
        ConfigKind::Cors,
        ConfigKind::Lifecycle,
        ConfigKind::Owner,
        ConfigKind::Policy,
        ConfigKind::Acl,
        ConfigKind::Versioning,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ConfigKind::Tagging => "tagging",
            ConfigKind::Cors => "cors",
            ConfigKind::Lifecycle => "lifecycle",
            ConfigKind::Owner => "owner",
            ConfigKind::Policy => "policy",
            ConfigKind::Acl => "acl",
            ConfigKind::Versioning => "versioning",
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
    /// The user who created the bucket (None: the root principal).
    pub owner: Option<Rc<str>>,
    /// The policy and its text as given (GetBucketPolicy answers it).
    pub policy: Option<Rc<crate::access::policy::Policy>>,
    pub policy_text: Option<Rc<str>>,
    /// The canned ACL public-read: anyone may list the bucket.
    pub public_read: bool,
    pub versioning: crate::store::versions::Versioning,
    /// Seq of the write each kind reflects (0: none yet).
    seqs: [u64; ConfigKind::ALL.len()],
}

impl BucketConfig {
    /// Whether a document of `kind` was applied here (set or removed)
    /// since the node started, or stored before it (a removal before the
    /// start leaves no trace: it counts as never set).
    #[must_use]
    pub fn is_set(&self, kind: ConfigKind) -> bool {
        self.seqs[kind.index()] > 0
    }

    /// Applies the stored document of `kind` (None: removed) written at
    /// `seq`; a write older than the one applied is ignored (applies may
    /// arrive out of order). Returns whether it was applied. A document
    /// that no longer parses (written by another version) is logged and
    /// treated as absent.
    pub fn apply(&mut self, bucket: &str, kind: ConfigKind, seq: u64, doc: Option<&[u8]>) -> bool {
        if seq <= self.seqs[kind.index()] {
            return false;
        }
        self.seqs[kind.index()] = seq;
        self.clear(kind);
        let Some(doc) = doc else {
            return true;
        };
        if let Err(e) = self.set(bucket, kind, doc) {
            tracing::warn!(
                bucket,
                kind = kind.name(),
                "stored bucket configuration ignored: {}",
                e.message
            );
            self.clear(kind);
        }
        true
    }

    fn clear(&mut self, kind: ConfigKind) {
        match kind {
            ConfigKind::Tagging => self.tagging = None,
            ConfigKind::Cors => self.cors = None,
            ConfigKind::Lifecycle => self.lifecycle = None,
            ConfigKind::Owner => self.owner = None,
            ConfigKind::Policy => {
                self.policy = None;
                self.policy_text = None;
            }
            ConfigKind::Acl => self.public_read = false,
            ConfigKind::Versioning => self.versioning = Versioning::Off,
        }
    }

    fn set(&mut self, bucket: &str, kind: ConfigKind, doc: &[u8]) -> Result<(), ConfigError> {
        match kind {
            ConfigKind::Tagging => {
                self.tagging = Some(Rc::new(tagging::TagSet::parse_xml(
                    doc,
                    tagging::BUCKET_TAGS_MAX,
                )?));
            }
            ConfigKind::Cors => self.cors = Some(Rc::new(cors::Cors::parse(doc)?)),
            ConfigKind::Lifecycle => {
                self.lifecycle = Some(Rc::new(lifecycle::Lifecycle::parse(doc)?))
            }
            ConfigKind::Owner => {
                let name = std::str::from_utf8(doc)
                    .map_err(|_| ConfigError::malformed("owner is not UTF-8"))?;
                self.owner = Some(Rc::from(name));
            }
            ConfigKind::Policy => {
                self.policy = Some(Rc::new(crate::access::policy::Policy::parse(doc, bucket)?));
                self.policy_text = Some(Rc::from(String::from_utf8_lossy(doc).as_ref()));
            }
            ConfigKind::Acl => self.public_read = doc == b"public-read",
            ConfigKind::Versioning => {
                self.versioning = match doc {
                    b"Enabled" => Versioning::Enabled,
                    b"Suspended" => Versioning::Suspended,
                    _ => return Err(ConfigError::malformed("unknown versioning state")),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
