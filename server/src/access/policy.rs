//! Bucket policies: the subset of IAM's JSON that names principals,
//! actions and resources, with Allow and Deny.
//!
//! Accepted: `Version` ("2012-10-17" or "2008-10-17"), `Id`, `Statement`
//! (one object or a list) of `Sid`, `Effect` (Allow|Deny), `Principal`
//! (`"*"`, `{"AWS": "*"}`, `{"AWS": [..]}` of user ARNs
//! `arn:aws:iam::<any account>:user/NAME`, `arn:aws:iam::<account>:root`
//! for the root principal, or bare names), `Action` (`s3:` names with `*`
//! and `?`), `Resource` (`arn:aws:s3:::BUCKET` or `arn:aws:s3:::BUCKET/…`
//! of this bucket, with `*` and `?`). Refused rather than ignored, because
//! ignoring them would grant more than was written: `Condition`,
//! `NotPrincipal`, `NotAction`, `NotResource` (501), anything else (400
//! MalformedPolicy).

use serde_json::Value;

use super::Principal;
use crate::bucket_config::ConfigError;

/// S3's limit on a bucket policy's size.
pub const POLICY_BYTES_MAX: usize = 20 * 1024;
/// Bounds on what one policy lists.
const STATEMENTS_MAX: usize = 100;
const ENTRIES_MAX: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    Everyone,
    /// User names; `root` is the root principal.
    Users(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Statement {
    effect: Verdict,
    who: Who,
    /// Lower-cased, as characters (matched case-insensitively).
    actions: Vec<Vec<char>>,
    resources: Vec<Vec<char>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    statements: Vec<Statement>,
}

fn malformed(message: impl Into<String>) -> ConfigError {
    ConfigError {
        status: 400,
        code: "MalformedPolicy",
        message: message.into(),
    }
}

/// IAM wildcards: `*` any run, `?` one character.
pub fn glob(pattern: &str, s: &str, ignore_case: bool) -> bool {
    let fold = |x: &str| {
        if ignore_case {
            x.to_lowercase().chars().collect::<Vec<char>>()
        } else {
            x.chars().collect()
        }
    };
    glob_chars(&fold(pattern), &fold(s))
}

/// [`glob`] on characters, as patterns are kept (compiled at parse time).
/// Greedy with one backtrack point: O(|p|·|t|) at worst, linear for the
/// usual `prefix*` patterns; a policy's patterns are bounded by its size.
fn glob_chars(p: &[char], t: &[char]) -> bool {
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// A string or a list of strings, as IAM allows for most fields.
fn strings(v: &Value, field: &str) -> Result<Vec<String>, ConfigError> {
    let list = match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| malformed(format!("{field} must list strings")))?,
        _ => return Err(malformed(format!("{field} must be a string or a list"))),
    };
    if list.is_empty() || list.len() > ENTRIES_MAX {
        return Err(malformed(format!(
            "{field} lists 1 to {ENTRIES_MAX} entries"
        )));
    }
    Ok(list)
}

/// A principal entry as a user name (`root` for the root principal).
fn user_of(entry: &str) -> Result<String, ConfigError> {
    if let Some(rest) = entry.strip_prefix("arn:aws:iam::") {
        let (_account, what) = rest
            .split_once(':')
            .ok_or_else(|| malformed(format!("Invalid principal in policy: {entry}")))?;
        if what == "root" {
            return Ok(super::users::ROOT_NAME.to_string());
        }
        let name = what
            .strip_prefix("user/")
            .ok_or_else(|| malformed(format!("Invalid principal in policy: {entry}")))?;
        return Ok(name.rsplit('/').next().unwrap_or(name).to_string());
    }
    if entry.is_empty() || entry.contains(':') || entry.contains('*') {
        return Err(malformed(format!("Invalid principal in policy: {entry}")));
    }
    Ok(entry.to_string())
}

fn parse_who(v: &Value) -> Result<Who, ConfigError> {
    match v {
        Value::String(s) if s == "*" => Ok(Who::Everyone),
        Value::Object(map) => {
            let mut users = Vec::new();
            for (kind, entries) in map {
                if kind != "AWS" {
                    return Err(ConfigError::not_implemented(format!(
                        "{kind} principals in bucket policies are not implemented by percore yet"
                    )));
                }
                for e in strings(entries, "Principal")? {
                    if e == "*" {
                        return Ok(Who::Everyone);
                    }
                    users.push(user_of(&e)?);
                }
            }
            if users.is_empty() {
                return Err(malformed("Principal names no one"));
            }
            Ok(Who::Users(users))
        }
        _ => Err(malformed("Principal must be \"*\" or {\"AWS\": ...}")),
    }
}

impl Statement {
    fn parse(v: &Value, bucket: &str) -> Result<Statement, ConfigError> {
        let map = v
            .as_object()
            .ok_or_else(|| malformed("Every Statement must be an object"))?;
        for key in map.keys() {
            match key.as_str() {
                "Sid" | "Effect" | "Principal" | "Action" | "Resource" => {}
                "Condition" | "NotPrincipal" | "NotAction" | "NotResource" => {
                    return Err(ConfigError::not_implemented(format!(
                        "{key} in bucket policies is not implemented by percore yet"
                    )))
                }
                other => return Err(malformed(format!("Unknown field {other} in Statement"))),
            }
        }
        let effect = match map.get("Effect").and_then(Value::as_str) {
            Some("Allow") => Verdict::Allow,
            Some("Deny") => Verdict::Deny,
            _ => return Err(malformed("Effect must be Allow or Deny")),
        };
        let who = parse_who(
            map.get("Principal")
                .ok_or_else(|| malformed("Statement needs a Principal"))?,
        )?;
        let actions = strings(
            map.get("Action")
                .ok_or_else(|| malformed("Statement needs an Action"))?,
            "Action",
        )?;
        for a in &actions {
            if a != "*" && !a.to_ascii_lowercase().starts_with("s3:") {
                return Err(malformed(format!("Policy has an invalid action: {a}")));
            }
        }
        let resources = strings(
            map.get("Resource")
                .ok_or_else(|| malformed("Statement needs a Resource"))?,
            "Resource",
        )?;
        let own = format!("arn:aws:s3:::{bucket}");
        for r in &resources {
            let inside = r == &own
                || r.strip_prefix(&own)
                    .is_some_and(|rest| rest.starts_with('/'));
            if !inside {
                return Err(malformed(format!(
                    "Policy has invalid resource: {r} (resources must be in this bucket, {own})"
                )));
            }
        }
        Ok(Statement {
            effect,
            who,
            actions: actions
                .iter()
                .map(|a| a.to_lowercase().chars().collect())
                .collect(),
            resources: resources.iter().map(|r| r.chars().collect()).collect(),
        })
    }

    /// `action` lower-cased and `resource`, as characters.
    fn applies(&self, principal: &Principal, action: &[char], resource: &[char]) -> bool {
        let who = match (&self.who, principal.name()) {
            (Who::Everyone, _) => true,
            (Who::Users(names), Some(name)) => names.iter().any(|n| n == name),
            (Who::Users(_), None) => false,
        };
        who && self.actions.iter().any(|a| glob_chars(a, action))
            && self.resources.iter().any(|r| glob_chars(r, resource))
    }
}

impl Policy {
    /// Parses and checks a policy for `bucket`.
    pub fn parse(body: &[u8], bucket: &str) -> Result<Policy, ConfigError> {
        if body.len() > POLICY_BYTES_MAX {
            return Err(ConfigError {
                status: 400,
                code: "PolicyTooLarge",
                message: format!("Policies are at most {POLICY_BYTES_MAX} bytes"),
            });
        }
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| malformed(format!("Policies must be valid JSON: {e}")))?;
        let map = v
            .as_object()
            .ok_or_else(|| malformed("A policy is a JSON object"))?;
        for key in map.keys() {
            if !matches!(key.as_str(), "Version" | "Id" | "Statement") {
                return Err(malformed(format!("Unknown field {key} in the policy")));
            }
        }
        match map.get("Version").and_then(Value::as_str) {
            None | Some("2012-10-17" | "2008-10-17") => {}
            Some(v) => return Err(malformed(format!("Unsupported policy version {v}"))),
        }
        let statements: Vec<&Value> = match map.get("Statement") {
            Some(Value::Array(items)) => items.iter().collect(),
            Some(one @ Value::Object(_)) => vec![one],
            _ => return Err(malformed("A policy needs a Statement")),
        };
        if statements.is_empty() || statements.len() > STATEMENTS_MAX {
            return Err(malformed(format!(
                "A policy has 1 to {STATEMENTS_MAX} statements"
            )));
        }
        Ok(Policy {
            statements: statements
                .into_iter()
                .map(|s| Statement::parse(s, bucket))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Deny if a Deny statement applies, else Allow if an Allow does.
    pub fn evaluate(&self, principal: &Principal, action: &str, resource: &str) -> Option<Verdict> {
        let action: Vec<char> = action.to_lowercase().chars().collect();
        let resource: Vec<char> = resource.chars().collect();
        let mut allowed = false;
        for s in &self.statements {
            if s.applies(principal, &action, &resource) {
                if s.effect == Verdict::Deny {
                    return Some(Verdict::Deny);
                }
                allowed = true;
            }
        }
        allowed.then_some(Verdict::Allow)
    }

    /// Whether any Allow names everyone (GetBucketPolicyStatus).
    pub fn is_public(&self) -> bool {
        self.statements
            .iter()
            .any(|s| s.effect == Verdict::Allow && s.who == Who::Everyone)
    }
}

#[cfg(test)]
mod tests;
