//! CORS rules (PutBucketCors) and how a request is matched against them:
//! the preflight (`OPTIONS` with `Origin` and
//! `Access-Control-Request-Method`) and the headers added to an actual
//! request that carries `Origin`.

use super::{only_child, parse_root, ConfigError};
use crate::frontend::s3::xml::{push_element, push_number_element, push_open_root, XmlElement};

/// S3's limit on rules in one configuration.
pub const CORS_RULES_MAX: usize = 100;
const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];
/// Bounds on what one rule lists (S3 documents none; these keep a stored
/// document and a match small).
const RULE_ENTRIES_MAX: usize = 100;
const ENTRY_BYTES_MAX: usize = 512;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CorsRule {
    pub id: Option<String>,
    pub origins: Vec<String>,
    pub methods: Vec<String>,
    pub headers: Vec<String>,
    pub expose: Vec<String>,
    pub max_age_secs: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cors {
    pub rules: Vec<CorsRule>,
}

/// `pattern` with at most one `*` matching any run of characters.
fn wildcard_match(pattern: &str, s: &str, ignore_case: bool) -> bool {
    let eq = |a: &str, b: &str| {
        if ignore_case {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    match pattern.split_once('*') {
        None => eq(pattern, s),
        Some((head, tail)) => {
            s.len() >= head.len() + tail.len()
                && s.is_char_boundary(head.len())
                && s.is_char_boundary(s.len() - tail.len())
                && eq(&s[..head.len()], head)
                && eq(&s[s.len() - tail.len()..], tail)
        }
    }
}

fn texts(rule: &XmlElement, name: &str) -> Result<Vec<String>, ConfigError> {
    let values: Vec<String> = rule
        .children
        .iter()
        .filter(|c| c.name == name)
        .map(|c| c.text.trim().to_string())
        .collect();
    if values.len() > RULE_ENTRIES_MAX {
        return Err(ConfigError::malformed(format!(
            "A CORSRule lists at most {RULE_ENTRIES_MAX} {name} entries"
        )));
    }
    if values.iter().any(|v| v.len() > ENTRY_BYTES_MAX) {
        return Err(ConfigError::malformed(format!(
            "A {name} is at most {ENTRY_BYTES_MAX} bytes"
        )));
    }
    Ok(values)
}

impl CorsRule {
    fn parse(rule: &XmlElement) -> Result<CorsRule, ConfigError> {
        for child in &rule.children {
            let known = [
                "ID",
                "AllowedOrigin",
                "AllowedMethod",
                "AllowedHeader",
                "ExposeHeader",
                "MaxAgeSeconds",
            ];
            if !known.contains(&child.name.as_str()) {
                return Err(ConfigError::malformed(format!(
                    "unexpected <{}> in CORSRule",
                    child.name
                )));
            }
        }
        let id = only_child(rule, "ID")?.map(|e| e.text.trim().to_string());
        if id.as_ref().is_some_and(|id| id.len() > 255) {
            return Err(ConfigError::invalid_argument(
                "A CORSRule ID is at most 255 characters",
            ));
        }
        let origins = texts(rule, "AllowedOrigin")?;
        let methods = texts(rule, "AllowedMethod")?;
        let headers = texts(rule, "AllowedHeader")?;
        let expose = texts(rule, "ExposeHeader")?;
        if origins.is_empty() || methods.is_empty() {
            return Err(ConfigError::malformed(
                "Every CORSRule needs an AllowedOrigin and an AllowedMethod",
            ));
        }
        for m in &methods {
            if !METHODS.contains(&m.as_str()) {
                return Err(ConfigError::invalid_request(format!(
                    "Found unsupported HTTP method in CORS config. Unsupported method is {m}"
                )));
            }
        }
        for o in origins.iter().chain(&headers) {
            if o.matches('*').count() > 1 {
                return Err(ConfigError::invalid_request(format!(
                    "AllowedOrigin/AllowedHeader \"{o}\" can not have more than one wildcard."
                )));
            }
        }
        let max_age_secs = match only_child(rule, "MaxAgeSeconds")? {
            None => None,
            Some(e) => Some(e.text.trim().parse::<u32>().map_err(|_| {
                ConfigError::malformed("MaxAgeSeconds must be a non-negative integer")
            })?),
        };
        Ok(CorsRule {
            id,
            origins,
            methods,
            headers,
            expose,
            max_age_secs,
        })
    }

    fn matches_origin(&self, origin: &str) -> bool {
        self.origins
            .iter()
            .any(|p| wildcard_match(p, origin, false))
    }

    /// Whether every header the browser asks to send is allowed.
    fn allows_headers(&self, requested: &[&str]) -> bool {
        requested
            .iter()
            .all(|h| self.headers.iter().any(|p| wildcard_match(p, h, true)))
    }

    /// What `Access-Control-Allow-Origin` answers: `*` when the matching
    /// pattern is `*` (no credentials then), else the request's origin.
    pub fn allow_origin<'a>(&self, origin: &'a str) -> &'a str {
        if self.origins.iter().any(|p| p == "*") {
            "*"
        } else {
            origin
        }
    }
}

impl Cors {
    pub fn parse(body: &[u8]) -> Result<Cors, ConfigError> {
        let root = parse_root(body, "CORSConfiguration")?;
        let mut rules = Vec::new();
        for child in &root.children {
            if child.name != "CORSRule" {
                return Err(ConfigError::malformed(format!(
                    "unexpected <{}> in CORSConfiguration",
                    child.name
                )));
            }
            if rules.len() == CORS_RULES_MAX {
                return Err(ConfigError::malformed(format!(
                    "A CORS configuration has at most {CORS_RULES_MAX} rules"
                )));
            }
            rules.push(CorsRule::parse(child)?);
        }
        if rules.is_empty() {
            return Err(ConfigError::malformed(
                "A CORS configuration needs at least one CORSRule",
            ));
        }
        Ok(Cors { rules })
    }

    pub fn to_xml(&self) -> String {
        let mut out = String::with_capacity(256 * self.rules.len() + 128);
        push_open_root(&mut out, "CORSConfiguration");
        for r in &self.rules {
            out.push_str("<CORSRule>");
            if let Some(id) = &r.id {
                push_element(&mut out, "ID", id);
            }
            for (name, values) in [
                ("AllowedHeader", &r.headers),
                ("AllowedMethod", &r.methods),
                ("AllowedOrigin", &r.origins),
                ("ExposeHeader", &r.expose),
            ] {
                for v in values {
                    push_element(&mut out, name, v);
                }
            }
            if let Some(age) = r.max_age_secs {
                push_number_element(&mut out, "MaxAgeSeconds", age as u64);
            }
            out.push_str("</CORSRule>");
        }
        out.push_str("</CORSConfiguration>");
        out
    }

    /// The first rule that allows `method` from `origin` with the
    /// `requested` headers (a preflight's `Access-Control-Request-Headers`;
    /// none for an actual request), as S3 picks it.
    pub fn find(&self, origin: &str, method: &str, requested: &[&str]) -> Option<&CorsRule> {
        self.rules.iter().find(|r| {
            r.matches_origin(origin)
                && r.methods.iter().any(|m| m == method)
                && r.allows_headers(requested)
        })
    }
}
