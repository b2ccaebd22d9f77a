//! The routing table, walked request by request.

use super::*;

fn head(method: &str, target: &str, headers: &[(&str, &str)]) -> RequestHead {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    RequestHead {
        method: method.to_string(),
        target: target.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        version_minor: 1,
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect(),
    }
}

const COPY: &[(&str, &str)] = &[("x-amz-copy-source", "/b/src")];

/// (method, target, headers, the operation it names).
type Case = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    S3Op,
);

#[test]
fn table() {
    use S3Op::*;
    let cases: &[Case] = &[
        ("GET", "/", &[], ListBuckets),
        ("PUT", "/", &[], MethodNotAllowed),
        ("PUT", "/bucket", &[], CreateBucket),
        ("PUT", "/bucket/", &[], CreateBucket),
        // The case the two old tables disagreed on (dispatch answered 501,
        // the metrics counted a CreateBucket); a sub-resource is never a
        // CreateBucket.
        ("PUT", "/bucket?tagging", &[], PutBucketTagging),
        ("PUT", "/bucket?website", &[], NotImplemented),
        ("PUT", "/bucket?acl", &[], PutBucketAcl),
        ("GET", "/bucket?acl", &[], GetBucketAcl),
        ("HEAD", "/bucket", &[], HeadBucket),
        ("HEAD", "/bucket?anything", &[], HeadBucket),
        ("DELETE", "/bucket", &[], DeleteBucket),
        ("DELETE", "/bucket?tagging", &[], DeleteBucketTagging),
        ("GET", "/bucket?location", &[], GetBucketLocation),
        ("GET", "/bucket?uploads", &[], ListMultipartUploads),
        ("GET", "/bucket?versions", &[], ListObjectVersions),
        ("GET", "/bucket?versioning", &[], GetBucketVersioning),
        ("PUT", "/bucket?versioning", &[], PutBucketVersioning),
        ("POST", "/bucket?delete", &[], DeleteObjects),
        ("POST", "/bucket?batchGet", &[], BatchGet),
        ("POST", "/bucket?delete&batchGet", &[], DeleteObjects),
        ("POST", "/bucket", &[], NotImplemented),
        ("GET", "/bucket?list-type=2&prefix=a", &[], ListObjectsV2),
        ("GET", "/bucket?list-type=1", &[], ListObjects),
        ("GET", "/bucket", &[], ListObjects),
        ("GET", "/bucket?prefix=a&marker=b", &[], ListObjects),
        ("GET", "/bucket?tagging", &[], GetBucketTagging),
        ("PUT", "/bucket/key", &[], PutObject),
        ("PUT", "/bucket/key", COPY, CopyObject),
        ("PUT", "/bucket/key?tagging", &[], PutObjectTagging),
        ("GET", "/bucket/a/b/c", &[], GetObject),
        ("GET", "/bucket/key?acl", &[], GetObjectAcl),
        ("PUT", "/bucket/key?acl", &[], PutObjectAcl),
        ("DELETE", "/bucket/key?acl", &[], NotImplemented),
        ("GET", "/bucket/key?versionId=null", &[], GetObject),
        ("HEAD", "/bucket/key", &[], HeadObject),
        ("HEAD", "/bucket/key?retention", &[], NotImplemented),
        ("DELETE", "/bucket/key", &[], DeleteObject),
        ("POST", "/bucket/key", &[], MethodNotAllowed),
        ("PATCH", "/bucket/key", &[], MethodNotAllowed),
        ("GET", "/bucket/key?attributes", &[], GetObjectAttributes),
        ("POST", "/bucket/key?uploads", &[], CreateMultipartUpload),
        (
            "PUT",
            "/bucket/key?partNumber=1&uploadId=u",
            &[],
            UploadPart,
        ),
        (
            "PUT",
            "/bucket/key?partNumber=1&uploadId=u",
            COPY,
            UploadPartCopy,
        ),
        (
            "POST",
            "/bucket/key?uploadId=u",
            &[],
            CompleteMultipartUpload,
        ),
        (
            "POST",
            "/bucket/key?uploads&uploadId=u",
            &[],
            CompleteMultipartUpload,
        ),
        (
            "DELETE",
            "/bucket/key?uploadId=u",
            &[],
            AbortMultipartUpload,
        ),
        ("GET", "/bucket/key?uploadId=u", &[], ListParts),
        ("GET", "/bucket/key?uploadId=u&attributes", &[], ListParts),
        ("HEAD", "/bucket/key?uploadId=u", &[], MethodNotAllowed),
        // Percent-encoded names are routed decoded.
        ("GET", "/bucket/key?%75ploadId=u", &[], ListParts),
        ("GET", "/bucket?%6Cist-type=2", &[], ListObjectsV2),
        ("GET", "/bucket/a%2Fb", &[], GetObject),
    ];
    for &(method, target, headers, want) in cases {
        let r = route(&head(method, target, headers), None);
        assert!(r.target.is_ok(), "{method} {target}: {:?}", r.target);
        assert_eq!(r.op, want, "{method} {target}");
    }
}

/// The configuration sub-resources and CORS preflights.
#[test]
fn configuration_table() {
    use S3Op::*;
    let cases: &[Case] = &[
        ("DELETE", "/bucket?cors", &[], DeleteBucketCors),
        ("DELETE", "/bucket?lifecycle", &[], DeleteBucketLifecycle),
        ("PUT", "/bucket?cors", &[], PutBucketCors),
        (
            "GET",
            "/bucket?lifecycle",
            &[],
            GetBucketLifecycleConfiguration,
        ),
        (
            "PUT",
            "/bucket?lifecycle",
            &[],
            PutBucketLifecycleConfiguration,
        ),
        ("DELETE", "/bucket?website", &[], NotImplemented),
        ("GET", "/bucket?cors", &[], GetBucketCors),
        ("OPTIONS", "/bucket", &[], CorsPreflight),
        ("OPTIONS", "/bucket/key?uploadId=1", &[], CorsPreflight),
        ("OPTIONS", "/", &[], MethodNotAllowed),
        ("GET", "/bucket/key?tagging", &[], GetObjectTagging),
        ("DELETE", "/bucket/key?tagging", &[], DeleteObjectTagging),
        ("POST", "/bucket/key?tagging", &[], NotImplemented),
        ("PUT", "/bucket/key?legal-hold", &[], NotImplemented),
        ("PUT", "/bucket?policy", &[], PutBucketPolicy),
        ("GET", "/bucket?policyStatus", &[], GetBucketPolicyStatus),
    ];
    for &(method, target, headers, want) in cases {
        let r = route(&head(method, target, headers), None);
        assert_eq!(r.op, want, "{method} {target}");
    }
}

#[test]
fn virtual_host_table() {
    let h = |method, target| {
        let h = head(method, target, &[("host", "bucket.s3.example:9000")]);
        let vhost = virtual_host_bucket(&h, Some("s3.example"));
        assert_eq!(vhost.as_deref(), Some("bucket"));
        route(&h, vhost)
    };
    let r = h("GET", "/");
    assert_eq!(r.op, S3Op::ListObjects);
    assert_eq!(r.target.unwrap().bucket, "bucket");
    assert_eq!(h("PUT", "/?tagging").op, S3Op::PutBucketTagging);
    assert_eq!(h("PUT", "/?website").op, S3Op::NotImplemented);
    assert_eq!(h("PUT", "/").op, S3Op::CreateBucket);
    let r = h("PUT", "/dir/key");
    assert_eq!(r.op, S3Op::PutObject);
    let t = r.target.unwrap();
    assert_eq!((t.bucket.as_str(), t.key.as_str()), ("bucket", "dir/key"));
    // No domain configured, or a host outside it: path style.
    let plain = head("GET", "/", &[("host", "bucket.s3.example")]);
    assert_eq!(virtual_host_bucket(&plain, None), None);
    assert_eq!(virtual_host_bucket(&plain, Some("other.example")), None);
    assert_eq!(virtual_host_bucket(&plain, Some("bucket.s3.example")), None);
}

#[test]
fn refused_targets_keep_their_operation() {
    let long = format!("/bucket/{}", "k".repeat(S3_KEY_BYTES_MAX + 1));
    let cases = [
        ("PUT", long.as_str(), "KeyTooLongError", S3Op::PutObject),
        ("GET", "/bucket/%FF", "InvalidArgument", S3Op::GetObject),
        ("GET", "/bucket/a%00b", "InvalidArgument", S3Op::GetObject),
        ("PUT", "/%FF", "InvalidArgument", S3Op::CreateBucket),
        (
            "GET",
            "/bucket?prefix=%FF",
            "InvalidArgument",
            S3Op::ListObjects,
        ),
        (
            "PUT",
            "/bucket?website=%00",
            "InvalidArgument",
            S3Op::NotImplemented,
        ),
    ];
    for (method, target, code, op) in cases {
        let r = route(&head(method, target, &[]), None);
        assert_eq!(r.target.unwrap_err().code, code, "{method} {target}");
        assert_eq!(r.op, op, "{method} {target}");
    }
}

#[test]
fn names_are_unique_and_kept() {
    let mut names: Vec<&str> = S3Op::ALL.iter().map(|op| op.name()).collect();
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "two operations share a metric name");
    // Names the metrics and python tests already knew.
    for (op, name) in [
        (S3Op::PutObject, "PutObject"),
        (S3Op::GetObject, "GetObject"),
        (S3Op::ListObjectsV2, "ListObjectsV2"),
        (S3Op::MethodNotAllowed, "Other"),
    ] {
        assert_eq!(op.name(), name);
    }
}

#[test]
fn route_target_splits_and_decodes() {
    let t = route_target("/b/dir/a%20b", "x=1&y&z=%2B").unwrap();
    assert_eq!((t.bucket.as_str(), t.key.as_str()), ("b", "dir/a b"));
    assert_eq!(
        t.query,
        [("x", "1"), ("y", ""), ("z", "+")].map(|(n, v)| (n.to_string(), v.to_string()))
    );
}
