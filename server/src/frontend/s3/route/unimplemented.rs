//! The S3 operation a request names when percore does not implement it,
//! so that a NotImplemented answer says which one ("PutBucketPolicy is not
//! implemented by percore yet") instead of a method and a query.

/// The name of the S3 operation `method` on a bucket (or, with `on_object`,
/// an object) with the sub-resource `query` names, among those percore
/// does not implement; None if the query names no such sub-resource.
pub fn unimplemented_name(method: &str, on_object: bool, query: &[(&str, &str)]) -> Option<String> {
    let verb = match method {
        "GET" | "HEAD" => "Get",
        "PUT" => "Put",
        "DELETE" => "Delete",
        "POST" => "Post",
        _ => return None,
    };
    query.iter().find_map(|(name, _)| {
        let base = if on_object {
            match *name {
                "acl" => "ObjectAcl",
                "tagging" => "ObjectTagging",
                "legal-hold" => "ObjectLegalHold",
                "retention" => "ObjectRetention",
                "torrent" => "ObjectTorrent",
                "restore" if verb == "Post" => return Some("RestoreObject".to_string()),
                "select" if verb == "Post" => return Some("SelectObjectContent".to_string()),
                _ => return None,
            }
        } else {
            match *name {
                "acl" => "BucketAcl",
                "cors" => "BucketCors",
                "encryption" => "BucketEncryption",
                "lifecycle" if verb == "Delete" => "BucketLifecycle",
                "lifecycle" => "BucketLifecycleConfiguration",
                "logging" => "BucketLogging",
                "notification" => "BucketNotificationConfiguration",
                "object-lock" => "ObjectLockConfiguration",
                "ownershipControls" => "BucketOwnershipControls",
                "policy" => "BucketPolicy",
                "policyStatus" => "BucketPolicyStatus",
                "publicAccessBlock" => "PublicAccessBlock",
                "replication" => "BucketReplication",
                "requestPayment" => "BucketRequestPayment",
                "tagging" => "BucketTagging",
                "versioning" => "BucketVersioning",
                "website" => "BucketWebsite",
                "accelerate" => "BucketAccelerateConfiguration",
                "analytics" => "BucketAnalyticsConfiguration",
                "metrics" => "BucketMetricsConfiguration",
                "inventory" => "BucketInventoryConfiguration",
                "intelligent-tiering" => "BucketIntelligentTieringConfiguration",
                _ => return None,
            }
        };
        (verb != "Post").then(|| format!("{verb}{base}"))
    })
}

#[cfg(test)]
mod tests {
    use super::unimplemented_name;

    #[test]
    fn names_follow_the_s3_api() {
        let n = |m, o, q: &str| unimplemented_name(m, o, &[(q, "")]);
        assert_eq!(
            n("PUT", false, "policy").as_deref(),
            Some("PutBucketPolicy")
        );
        assert_eq!(n("GET", true, "acl").as_deref(), Some("GetObjectAcl"));
        assert_eq!(
            n("PUT", true, "tagging").as_deref(),
            Some("PutObjectTagging")
        );
        assert_eq!(
            n("DELETE", false, "tagging").as_deref(),
            Some("DeleteBucketTagging")
        );
        assert_eq!(
            n("PUT", false, "lifecycle").as_deref(),
            Some("PutBucketLifecycleConfiguration")
        );
        assert_eq!(
            n("DELETE", false, "lifecycle").as_deref(),
            Some("DeleteBucketLifecycle")
        );
        assert_eq!(
            n("PUT", false, "encryption").as_deref(),
            Some("PutBucketEncryption")
        );
        assert_eq!(n("POST", true, "restore").as_deref(), Some("RestoreObject"));
        assert_eq!(n("GET", false, "nonsense"), None);
        assert_eq!(n("POST", false, "cors"), None);
    }
}
