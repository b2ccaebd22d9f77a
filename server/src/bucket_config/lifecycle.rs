//! Lifecycle rules (PutBucketLifecycleConfiguration): which objects expire
//! when, and when incomplete multipart uploads are aborted. Each shard's
//! runner (`shard::lifecycle`) applies them to the keys it owns.
//!
//! Supported: Expiration by Days or Date; AbortIncompleteMultipartUpload;
//! filters by prefix, tags and object size (alone or under And); Status.
//! NoncurrentVersionExpiration (NoncurrentDays, NewerNoncurrentVersions) and
//! ExpiredObjectDeleteMarker act on versioned buckets. Transitions are
//! refused: percore has one storage class.

use super::{only_child, parse_root, ConfigError};
use crate::frontend::s3::xml::{
    iso8601_ms, push_element, push_number_element, push_open_root, XmlElement,
};

/// S3's limit on rules in one configuration.
pub const LIFECYCLE_RULES_MAX: usize = 1000;
const DAY_MS: u64 = 86_400_000;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub prefix: String,
    pub tags: Vec<(String, String)>,
    pub size_greater_than: Option<u64>,
    pub size_less_than: Option<u64>,
    /// Given as `<Rule><Prefix>` (the old form), rendered back that way.
    pub legacy_prefix: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiration {
    Days(u32),
    /// Midnight UTC, unix ms.
    Date(u64),
    /// `ExpiredObjectDeleteMarker`: nothing to do without versioning.
    DeleteMarkersOnly,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: String,
    pub enabled: bool,
    pub filter: Filter,
    pub expiration: Option<Expiration>,
    pub abort_incomplete_days: Option<u32>,
    /// NoncurrentVersionExpiration: NoncurrentDays.
    pub noncurrent_days: Option<u32>,
    /// NoncurrentVersionExpiration: NewerNoncurrentVersions (how many of
    /// the newest noncurrent versions are kept whatever their age).
    pub newer_noncurrent: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lifecycle {
    pub rules: Vec<Rule>,
}

fn days(e: &XmlElement, what: &str) -> Result<u32, ConfigError> {
    e.text
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|d| *d > 0)
        .ok_or_else(|| ConfigError::invalid_argument(format!("{what} must be a positive integer")))
}

/// `YYYY-MM-DDT00:00:00[.000]Z`: midnight UTC, as S3 requires.
fn parse_midnight(s: &str) -> Option<u64> {
    let s = s.trim();
    let (date, time) = s.split_once('T')?;
    if !matches!(time, "00:00:00Z" | "00:00:00.000Z") {
        return None;
    }
    let mut parts = date.split('-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let d: u32 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || !(1970..=9999).contains(&y) || !(1..=12).contains(&m) {
        return None;
    }
    let month_days = [
        31,
        28 + u32::from(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)),
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if d == 0 || d > month_days[m as usize - 1] {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days).ok().map(|d| d * DAY_MS)
}

fn parse_tag(e: &XmlElement) -> Result<(String, String), ConfigError> {
    let k = only_child(e, "Key")?.ok_or_else(|| ConfigError::malformed("A Tag needs a Key"))?;
    let v = only_child(e, "Value")?.map_or(String::new(), |v| v.text.clone());
    Ok((k.text.clone(), v))
}

fn parse_size(e: &XmlElement) -> Result<u64, ConfigError> {
    e.text.trim().parse::<u64>().map_err(|_| {
        ConfigError::invalid_argument("Object size limits must be non-negative integers")
    })
}

/// `<NoncurrentVersionExpiration>` of a rule: (NoncurrentDays,
/// NewerNoncurrentVersions).
fn parse_noncurrent(r: &XmlElement) -> Result<(Option<u32>, Option<u32>), ConfigError> {
    let Some(n) = only_child(r, "NoncurrentVersionExpiration")? else {
        return Ok((None, None));
    };
    let d = days(
        only_child(n, "NoncurrentDays")?.ok_or_else(|| {
            ConfigError::malformed("NoncurrentVersionExpiration needs NoncurrentDays")
        })?,
        "NoncurrentDays",
    )?;
    let newer = only_child(n, "NewerNoncurrentVersions")?
        .map(|v| {
            v.text
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| {
                    ConfigError::invalid_argument(
                        "NewerNoncurrentVersions must be an integer from 1 to 100",
                    )
                })
        })
        .transpose()?;
    Ok((Some(d), newer))
}

/// `<Expiration>`: Days, Date or ExpiredObjectDeleteMarker (None when that
/// is false).
fn parse_expiration(e: &XmlElement) -> Result<Option<Expiration>, ConfigError> {
    let d = only_child(e, "Days")?;
    let date = only_child(e, "Date")?;
    let marker = only_child(e, "ExpiredObjectDeleteMarker")?;
    Ok(match (d, date, marker) {
        (Some(d), None, None) => Some(Expiration::Days(days(d, "Expiration Days")?)),
        (None, Some(date), None) => Some(Expiration::Date(parse_midnight(&date.text).ok_or_else(
            || {
                ConfigError::invalid_argument(
                    "Expiration Date must be midnight UTC in ISO 8601 (2027-01-31T00:00:00Z)",
                )
            },
        )?)),
        (None, None, Some(m)) if m.text.trim() == "true" => Some(Expiration::DeleteMarkersOnly),
        (None, None, Some(_)) => None,
        _ => {
            return Err(ConfigError::malformed(
                "Expiration takes one of Days, Date or ExpiredObjectDeleteMarker",
            ))
        }
    })
}

impl Filter {
    /// `<Filter>`'s one condition, or `<And>` of several.
    fn parse(f: &XmlElement) -> Result<Filter, ConfigError> {
        let mut filter = Filter::default();
        let conditions: Vec<&XmlElement> = f.children.iter().collect();
        if conditions.len() > 1 {
            return Err(ConfigError::malformed(
                "A Filter holds one condition; combine several with And",
            ));
        }
        let Some(c) = conditions.first() else {
            return Ok(filter);
        };
        let parts: Vec<&XmlElement> = if c.name == "And" {
            c.children.iter().collect()
        } else {
            vec![c]
        };
        for p in parts {
            match p.name.as_str() {
                "Prefix" => filter.prefix = p.text.clone(),
                "Tag" => filter.tags.push(parse_tag(p)?),
                "ObjectSizeGreaterThan" => filter.size_greater_than = Some(parse_size(p)?),
                "ObjectSizeLessThan" => filter.size_less_than = Some(parse_size(p)?),
                other => {
                    return Err(ConfigError::malformed(format!(
                        "unexpected <{other}> in Filter"
                    )))
                }
            }
        }
        if let (Some(gt), Some(lt)) = (filter.size_greater_than, filter.size_less_than) {
            if gt >= lt {
                return Err(ConfigError::invalid_argument(
                    "ObjectSizeGreaterThan must be less than ObjectSizeLessThan",
                ));
            }
        }
        if filter.tags.len() > super::tagging::OBJECT_TAGS_MAX {
            return Err(ConfigError::invalid_argument(
                "A Filter lists at most 10 tags",
            ));
        }
        Ok(filter)
    }

    /// Whether an object of this key and size is in the rule's scope
    /// (tags are checked apart: they need the object's metadata).
    pub fn matches(&self, key: &str, size_bytes: u64) -> bool {
        key.starts_with(&self.prefix)
            && self.size_greater_than.is_none_or(|gt| size_bytes > gt)
            && self.size_less_than.is_none_or(|lt| size_bytes < lt)
    }

    fn push_xml(&self, out: &mut String) {
        if self.legacy_prefix {
            push_element(out, "Prefix", &self.prefix);
            return;
        }
        out.push_str("<Filter>");
        let count = usize::from(!self.prefix.is_empty())
            + self.tags.len()
            + usize::from(self.size_greater_than.is_some())
            + usize::from(self.size_less_than.is_some());
        if count > 1 {
            out.push_str("<And>");
        }
        if !self.prefix.is_empty() || count == 0 {
            push_element(out, "Prefix", &self.prefix);
        }
        for (k, v) in &self.tags {
            out.push_str("<Tag>");
            push_element(out, "Key", k);
            push_element(out, "Value", v);
            out.push_str("</Tag>");
        }
        if let Some(n) = self.size_greater_than {
            push_number_element(out, "ObjectSizeGreaterThan", n);
        }
        if let Some(n) = self.size_less_than {
            push_number_element(out, "ObjectSizeLessThan", n);
        }
        if count > 1 {
            out.push_str("</And>");
        }
        out.push_str("</Filter>");
    }
}

impl Rule {
    fn parse(r: &XmlElement, index: usize) -> Result<Rule, ConfigError> {
        for c in &r.children {
            match c.name.as_str() {
                "ID"
                | "Status"
                | "Filter"
                | "Prefix"
                | "Expiration"
                | "AbortIncompleteMultipartUpload"
                | "NoncurrentVersionExpiration" => {}
                "Transition" | "NoncurrentVersionTransition" => {
                    return Err(ConfigError::not_implemented(format!(
                        "Lifecycle {} (percore has one storage class)",
                        c.name
                    )))
                }
                other => {
                    return Err(ConfigError::malformed(format!(
                        "unexpected <{other}> in Rule"
                    )))
                }
            }
        }
        let id = match only_child(r, "ID")? {
            Some(e) if e.text.trim().len() > 255 => {
                return Err(ConfigError::invalid_argument(
                    "A rule ID is at most 255 characters",
                ))
            }
            Some(e) if !e.text.trim().is_empty() => e.text.trim().to_string(),
            _ => format!("rule-{}", index + 1),
        };
        let enabled = match only_child(r, "Status")?.map(|s| s.text.trim()) {
            Some("Enabled") => true,
            Some("Disabled") => false,
            _ => return Err(ConfigError::malformed("Status must be Enabled or Disabled")),
        };
        let filter = match (only_child(r, "Filter")?, only_child(r, "Prefix")?) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::malformed(
                    "A Rule has a Filter or a Prefix, not both",
                ))
            }
            (Some(f), None) => Filter::parse(f)?,
            (None, Some(p)) => Filter {
                prefix: p.text.clone(),
                legacy_prefix: true,
                ..Filter::default()
            },
            (None, None) => Filter::default(),
        };
        let expiration = only_child(r, "Expiration")?
            .map(parse_expiration)
            .transpose()?
            .flatten();
        let abort_incomplete_days = match only_child(r, "AbortIncompleteMultipartUpload")? {
            None => None,
            Some(a) => Some(days(
                only_child(a, "DaysAfterInitiation")?.ok_or_else(|| {
                    ConfigError::malformed(
                        "AbortIncompleteMultipartUpload needs DaysAfterInitiation",
                    )
                })?,
                "DaysAfterInitiation",
            )?),
        };
        if abort_incomplete_days.is_some() && !filter.tags.is_empty() {
            return Err(ConfigError::invalid_request(
                "AbortIncompleteMultipartUpload cannot be specified with Tags.",
            ));
        }
        let (noncurrent_days, newer_noncurrent) = parse_noncurrent(r)?;
        if expiration.is_none() && abort_incomplete_days.is_none() && noncurrent_days.is_none() {
            return Err(ConfigError::invalid_request(
                "At least one action needs to be specified in a rule",
            ));
        }
        Ok(Rule {
            id,
            enabled,
            filter,
            expiration,
            abort_incomplete_days,
            noncurrent_days,
            newer_noncurrent,
        })
    }

    /// When an object last modified at `mtime_ms` expires under this rule
    /// (unix ms), if it does: `Days` after its modification rounded up to
    /// the next midnight UTC, as S3 counts, with days `day_ms` long (a
    /// real day but in tests).
    pub fn expires_at_ms(&self, mtime_ms: u64, day_ms: u64) -> Option<u64> {
        match self.expiration? {
            Expiration::Days(n) => {
                let t = mtime_ms.saturating_add(u64::from(n).saturating_mul(day_ms));
                Some(t.div_ceil(day_ms).saturating_mul(day_ms))
            }
            Expiration::Date(ms) => Some(ms),
            Expiration::DeleteMarkersOnly => None,
        }
    }
}

impl Lifecycle {
    pub fn parse(body: &[u8]) -> Result<Lifecycle, ConfigError> {
        let root = parse_root(body, "LifecycleConfiguration")?;
        let mut rules: Vec<Rule> = Vec::new();
        for c in &root.children {
            if c.name != "Rule" {
                return Err(ConfigError::malformed(format!(
                    "unexpected <{}> in LifecycleConfiguration",
                    c.name
                )));
            }
            if rules.len() == LIFECYCLE_RULES_MAX {
                return Err(ConfigError::malformed(format!(
                    "A lifecycle configuration has at most {LIFECYCLE_RULES_MAX} rules"
                )));
            }
            let rule = Rule::parse(c, rules.len())?;
            if rules.iter().any(|r| r.id == rule.id) {
                return Err(ConfigError::invalid_argument(format!(
                    "Rule ID {:?} is used twice",
                    rule.id
                )));
            }
            rules.push(rule);
        }
        if rules.is_empty() {
            return Err(ConfigError::malformed(
                "A lifecycle configuration needs at least one Rule",
            ));
        }
        Ok(Lifecycle { rules })
    }

    pub fn to_xml(&self) -> String {
        let mut out = String::with_capacity(256 * self.rules.len() + 128);
        push_open_root(&mut out, "LifecycleConfiguration");
        for r in &self.rules {
            out.push_str("<Rule>");
            push_element(&mut out, "ID", &r.id);
            r.filter.push_xml(&mut out);
            push_element(
                &mut out,
                "Status",
                if r.enabled { "Enabled" } else { "Disabled" },
            );
            match r.expiration {
                Some(Expiration::Days(n)) => {
                    out.push_str("<Expiration>");
                    push_number_element(&mut out, "Days", n as u64);
                    out.push_str("</Expiration>");
                }
                Some(Expiration::Date(ms)) => {
                    out.push_str("<Expiration>");
                    push_element(&mut out, "Date", &iso8601_ms(ms));
                    out.push_str("</Expiration>");
                }
                Some(Expiration::DeleteMarkersOnly) => out.push_str(
                    "<Expiration><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration>",
                ),
                None => {}
            }
            if let Some(n) = r.noncurrent_days {
                out.push_str("<NoncurrentVersionExpiration>");
                push_number_element(&mut out, "NoncurrentDays", n as u64);
                if let Some(k) = r.newer_noncurrent {
                    push_number_element(&mut out, "NewerNoncurrentVersions", k as u64);
                }
                out.push_str("</NoncurrentVersionExpiration>");
            }
            if let Some(n) = r.abort_incomplete_days {
                out.push_str("<AbortIncompleteMultipartUpload>");
                push_number_element(&mut out, "DaysAfterInitiation", n as u64);
                out.push_str("</AbortIncompleteMultipartUpload>");
            }
            out.push_str("</Rule>");
        }
        out.push_str("</LifecycleConfiguration>");
        out
    }

    /// The enabled rules.
    pub fn enabled(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().filter(|r| r.enabled)
    }
}

#[cfg(test)]
pub(super) fn parse_midnight_for_tests(s: &str) -> Option<u64> {
    parse_midnight(s)
}
