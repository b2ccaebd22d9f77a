//! Who may do what: users (several access keys, each owned by a named
//! user), bucket ownership, bucket policies (the IAM JSON subset of
//! `policy`) and the canned public-read bucket ACL, decided in one place
//! ([`decide`]) for the S3 and the native front doors.
//!
//! The rules, in order:
//! 1. the root principal (the server's own credentials) may do anything;
//! 2. a request on a bucket that does not exist (on the deciding shard's
//!    view) is refused: the front doors answer NoSuchBucket;
//! 3. an explicit Deny of the bucket's policy that matches refuses;
//! 4. the bucket's owner may do anything else;
//! 5. an Allow of the policy that matches allows;
//! 6. a bucket with the public-read ACL lets anyone list it;
//! 7. anything else is refused.
//!
//! Creating buckets and listing one's own needs any authenticated user;
//! an anonymous request (no signature) may only do what a policy or the
//! public-read ACL grants to everyone.

use std::rc::Rc;

use crate::bucket_config::BucketConfig;

pub mod policy;
pub mod users;

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The server's own credentials (`PERCORE_ACCESS_KEY`).
    Root,
    /// A user added with `percore user add`.
    User(Rc<str>),
    /// No signature at all.
    Anonymous,
}

impl Principal {
    /// The user name policies and ownership name (None: anonymous).
    pub fn name(&self) -> Option<&str> {
        match self {
            Principal::Root => Some(users::ROOT_NAME),
            Principal::User(n) => Some(n),
            Principal::Anonymous => None,
        }
    }

    /// Whether `owner` (a bucket's, None: root's) is this principal.
    pub fn owns(&self, owner: Option<&str>) -> bool {
        match (self, owner) {
            (Principal::Root, None) => true,
            (Principal::User(n), Some(o)) => **n == *o,
            _ => false,
        }
    }
}

/// The resource an action is on: a bucket, or an object of it.
pub fn resource(bucket: &str, key: Option<&str>) -> String {
    match key {
        Some(k) => format!("arn:aws:s3:::{bucket}/{k}"),
        None => format!("arn:aws:s3:::{bucket}"),
    }
}

/// Whether `principal` may do `action` (an IAM action name such as
/// `s3:GetObject`) on `key` of the bucket whose configuration is `config`
/// (None: the bucket does not exist, and only root may go on).
pub fn decide(
    principal: &Principal,
    action: &str,
    bucket: &str,
    key: Option<&str>,
    config: Option<&BucketConfig>,
) -> bool {
    if *principal == Principal::Root {
        return true;
    }
    // No such bucket (on this shard's view, which may be behind the
    // shard that will run the request): nothing to allow. Front doors
    // answer NoSuchBucket for it.
    let Some(config) = config else {
        return false;
    };
    let res = resource(bucket, key);
    let verdict = config
        .policy
        .as_ref()
        .and_then(|p| p.evaluate(principal, action, &res));
    if verdict == Some(policy::Verdict::Deny) {
        return false;
    }
    if principal.owns(config.owner.as_deref()) {
        return true;
    }
    if verdict == Some(policy::Verdict::Allow) {
        return true;
    }
    config.public_read && action == "s3:ListBucket"
}
