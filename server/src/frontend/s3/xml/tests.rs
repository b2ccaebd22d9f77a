//! XML rendering and parsing tests.

use super::*;
use crate::frontend::http::civil_from_days;

const DECL: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
/// 2013-05-24T00:00:00Z.
const MAY_24_2013_MS: u64 = 1_369_353_600_000;

fn object(key: &str) -> ObjectEntry {
    ObjectEntry {
        key: key.to_string(),
        size: 11,
        etag: "\"5eb63bbbe01eeed093cb22bb8f5acdc3\"".to_string(),
        last_modified_unix_ms: MAY_24_2013_MS + 1234,
    }
}

#[test]
fn escape_specials_and_controls() {
    assert_eq!(escape("plain ü ☃"), "plain ü ☃");
    assert_eq!(escape("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
    assert_eq!(
        escape("x\u{1}y\tz\r\n\u{1f}"),
        "x&#x1;y&#x9;z&#xD;&#xA;&#x1F;"
    );
    assert_eq!(escape(""), "");
    assert_eq!(escape("&&"), "&amp;&amp;");
}

#[test]
fn error_body_shape() {
    assert_eq!(
        error_body("NoSuchKey", "The specified key does not exist.", "/b/a&b", "req-1"),
        format!(
            "{DECL}<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message>\
             <Resource>/b/a&amp;b</Resource><RequestId>req-1</RequestId></Error>"
        )
    );
}

#[test]
fn iso8601_dates() {
    assert_eq!(iso8601_ms(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(iso8601_ms(MAY_24_2013_MS), "2013-05-24T00:00:00.000Z");
    assert_eq!(
        iso8601_ms(MAY_24_2013_MS + 3_723_004),
        "2013-05-24T01:02:03.004Z"
    );
    assert_eq!(iso8601_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(iso8601_ms(951_868_799_999), "2000-02-29T23:59:59.999Z");
    assert_eq!(iso8601_ms(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    assert_eq!(iso8601_ms(1_709_164_800_000), "2024-02-29T00:00:00.000Z");
    assert_eq!(iso8601_ms(1_735_689_599_000), "2024-12-31T23:59:59.000Z");
    // Every day for 1000 years is consecutive and well-formed.
    let mut previous = (1969, 12, 31);
    for day in 0..365_243 {
        let current = civil_from_days(day);
        let next_day_same_month = (previous.0, previous.1, previous.2 + 1);
        let next_month = (previous.0, previous.1 + 1, 1);
        let next_year = (previous.0 + 1, 1, 1);
        assert!(
            current == next_day_same_month || current == next_month || current == next_year,
            "{previous:?} -> {current:?}"
        );
        previous = current;
    }
    assert_eq!(previous, (2969, 12, 31));
}

#[test]
fn list_buckets_shape() {
    let buckets = [
        BucketEntry {
            name: "alpha".into(),
            created_unix_ms: MAY_24_2013_MS,
        },
        BucketEntry {
            name: "beta".into(),
            created_unix_ms: MAY_24_2013_MS + 1,
        },
    ];
    assert_eq!(
        list_buckets("owner<1>", &buckets),
        format!(
            "{DECL}<ListAllMyBucketsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Owner><ID>owner&lt;1&gt;</ID><DisplayName>owner&lt;1&gt;</DisplayName></Owner>\
             <Buckets><Bucket><Name>alpha</Name><CreationDate>2013-05-24T00:00:00.000Z</CreationDate></Bucket>\
             <Bucket><Name>beta</Name><CreationDate>2013-05-24T00:00:00.001Z</CreationDate></Bucket>\
             </Buckets></ListAllMyBucketsResult>"
        )
    );
    assert!(list_buckets("o", &[]).contains("<Buckets></Buckets>"));
}

fn sample_v2() -> ListV2 {
    ListV2 {
        bucket: "bucket".into(),
        prefix: "photos/".into(),
        delimiter: Some("/".into()),
        max_keys: 2,
        key_count: 2,
        is_truncated: true,
        continuation_token: Some("tok+1/=".into()),
        next_continuation_token: Some("tok&2".into()),
        start_after: None,
        encoding_url: false,
        contents: vec![object("photos/a&b.jpg")],
        common_prefixes: vec!["photos/2024/".into()],
        fetch_owner: false,
    }
}

#[test]
fn list_v2_plain() {
    assert_eq!(
        list_objects_v2(&sample_v2()),
        format!(
            "{DECL}<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Name>bucket</Name><Prefix>photos/</Prefix><Delimiter>/</Delimiter>\
             <ContinuationToken>tok+1/=</ContinuationToken><NextContinuationToken>tok&amp;2</NextContinuationToken>\
             <KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>\
             <Contents><Key>photos/a&amp;b.jpg</Key><LastModified>2013-05-24T00:00:01.234Z</LastModified>\
             <ETag>&quot;5eb63bbbe01eeed093cb22bb8f5acdc3&quot;</ETag><Size>11</Size>\
             <StorageClass>STANDARD</StorageClass></Contents>\
             <CommonPrefixes><Prefix>photos/2024/</Prefix></CommonPrefixes></ListBucketResult>"
        )
    );
}

#[test]
fn list_v2_url_encoding_and_owner() {
    let mut list = sample_v2();
    list.encoding_url = true;
    list.fetch_owner = true;
    list.prefix = "a b+c/".into();
    list.start_after = Some("a b+c/ü=1".into());
    list.contents = vec![object("a b+c/ü=1&\u{1}.txt")];
    list.common_prefixes = vec!["a b+c/~x y/".into()];
    let xml = list_objects_v2_with_owner(&list, "me");
    assert!(xml.contains("<Prefix>a%20b%2Bc/</Prefix>"), "{xml}");
    assert!(xml.contains("<Delimiter>/</Delimiter>"));
    assert!(xml.contains("<StartAfter>a%20b%2Bc/%C3%BC%3D1</StartAfter>"));
    assert!(xml.contains("<Key>a%20b%2Bc/%C3%BC%3D1%26%01.txt</Key>"));
    assert!(xml.contains("<CommonPrefixes><Prefix>a%20b%2Bc/~x%20y/</Prefix></CommonPrefixes>"));
    assert!(xml.contains("<EncodingType>url</EncodingType>"));
    assert!(xml.contains(
        "<Size>11</Size><Owner><ID>me</ID><DisplayName>me</DisplayName></Owner><StorageClass>"
    ));
    // Tokens are opaque: escaped, never URL-encoded.
    assert!(xml.contains("<ContinuationToken>tok+1/=</ContinuationToken>"));
    assert!(list_objects_v2(&list).contains("<Owner><ID>percore</ID>"));
    // Parses back as XML with the expected values.
    let root = parse_xml(xml.as_bytes()).unwrap().unwrap();
    assert_eq!(root.name, "ListBucketResult");
    assert_eq!(root.child("KeyCount").unwrap().text, "2");
    assert_eq!(
        root.child("Contents").unwrap().child("ETag").unwrap().text,
        "\"5eb63bbbe01eeed093cb22bb8f5acdc3\""
    );
}

#[test]
fn list_v2_minimal() {
    let list = ListV2 {
        bucket: "b".into(),
        prefix: String::new(),
        delimiter: None,
        max_keys: 1000,
        key_count: 0,
        is_truncated: false,
        continuation_token: None,
        next_continuation_token: None,
        start_after: None,
        encoding_url: false,
        contents: Vec::new(),
        common_prefixes: Vec::new(),
        fetch_owner: false,
    };
    assert_eq!(
        list_objects_v2(&list),
        format!(
            "{DECL}<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Name>b</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>\
             <IsTruncated>false</IsTruncated></ListBucketResult>"
        )
    );
}

#[test]
fn list_v1_shape() {
    let list = ListV1 {
        bucket: "b".into(),
        prefix: "p q/".into(),
        delimiter: Some("/".into()),
        marker: "p q/a".into(),
        next_marker: Some("p q/c".into()),
        max_keys: 1,
        is_truncated: true,
        encoding_url: true,
        contents: vec![object("p q/b")],
        common_prefixes: vec![],
    };
    assert_eq!(
        list_objects_v1(&list),
        format!(
            "{DECL}<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Name>b</Name><Prefix>p%20q/</Prefix><Marker>p%20q/a</Marker><NextMarker>p%20q/c</NextMarker>\
             <MaxKeys>1</MaxKeys><Delimiter>/</Delimiter><EncodingType>url</EncodingType>\
             <IsTruncated>true</IsTruncated><Contents><Key>p%20q/b</Key>\
             <LastModified>2013-05-24T00:00:01.234Z</LastModified>\
             <ETag>&quot;5eb63bbbe01eeed093cb22bb8f5acdc3&quot;</ETag><Size>11</Size>\
             <StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>"
        )
    );
}

#[test]
fn location_constraint_shape() {
    let xmlns = "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"";
    assert_eq!(
        location_constraint("us-east-1"),
        format!("{DECL}<LocationConstraint {xmlns}/>")
    );
    assert_eq!(
        location_constraint(""),
        format!("{DECL}<LocationConstraint {xmlns}/>")
    );
    assert_eq!(
        location_constraint("eu-west-1"),
        format!("{DECL}<LocationConstraint {xmlns}>eu-west-1</LocationConstraint>")
    );
}

#[test]
fn create_bucket_bodies() {
    assert_eq!(parse_create_bucket(b""), Ok(None));
    assert_eq!(parse_create_bucket(b" \r\n\t "), Ok(None));
    assert_eq!(
        parse_create_bucket(
            b"<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
              <LocationConstraint>eu-central-1</LocationConstraint></CreateBucketConfiguration>"
        ),
        Ok(Some("eu-central-1".into()))
    );
    // As boto3 sends it: declaration, newlines, indentation.
    let boto = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
                <CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\n  \
                <LocationConstraint> us-west-2 </LocationConstraint>\n</CreateBucketConfiguration>\n";
    assert_eq!(
        parse_create_bucket(boto.as_bytes()),
        Ok(Some("us-west-2".into()))
    );
    assert_eq!(
        parse_create_bucket(b"\xef\xbb\xbf<!-- hi --><s3:CreateBucketConfiguration xmlns:s3='x'><s3:LocationConstraint>a&amp;b&#x41;&#66;</s3:LocationConstraint></s3:CreateBucketConfiguration>"),
        Ok(Some("a&bAB".into()))
    );
    assert_eq!(
        parse_create_bucket(b"<CreateBucketConfiguration><LocationConstraint><![CDATA[x<y]]></LocationConstraint></CreateBucketConfiguration>"),
        Ok(Some("x<y".into()))
    );
    assert_eq!(
        parse_create_bucket(b"<CreateBucketConfiguration/>"),
        Ok(None)
    );
    assert_eq!(
        parse_create_bucket(
            b"<CreateBucketConfiguration><LocationConstraint/></CreateBucketConfiguration>"
        ),
        Ok(None)
    );
    assert_eq!(
        parse_create_bucket(b"<CreateBucketConfiguration><Bucket><Type>Directory</Type></Bucket><LocationConstraint>r</LocationConstraint></CreateBucketConfiguration>"),
        Ok(Some("r".into()))
    );
}

#[test]
fn create_bucket_malformed() {
    let bad: &[&[u8]] = &[
        b"<CreateBucketConfiguration>",
        b"<CreateBucketConfiguration><LocationConstraint>x</CreateBucketConfiguration>",
        b"<CreateBucketConfiguration><LocationConstraint>x</LocationConstraint>",
        b"<Other><LocationConstraint>x</LocationConstraint></Other>",
        b"<CreateBucketConfiguration></CreateBucketConfiguration><Again/>",
        b"text<CreateBucketConfiguration/>",
        b"<CreateBucketConfiguration/>trailing",
        b"</CreateBucketConfiguration>",
        b"<CreateBucketConfiguration><LocationConstraint>&bogus;</LocationConstraint></CreateBucketConfiguration>",
        b"<CreateBucketConfiguration><LocationConstraint>a &amp b</LocationConstraint></CreateBucketConfiguration>",
        b"<!DOCTYPE x [<!ENTITY a \"b\">]><CreateBucketConfiguration/>",
        b"<CreateBucketConfiguration",
        b"< CreateBucketConfiguration/>",
        b"\xff\xfe",
        b"<CreateBucketConfiguration><LocationConstraint>a</LocationConstraint><LocationConstraint>b</LocationConstraint></CreateBucketConfiguration>",
        b"<!-- unterminated",
    ];
    for body in bad {
        assert!(
            parse_create_bucket(body).is_err(),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let deep = "<a>".repeat(PARSE_DEPTH_MAX + 1);
    assert!(parse_xml(deep.as_bytes()).unwrap_err().contains("deep"));
    let huge = vec![b' '; PARSE_BODY_BYTES_MAX + 1];
    assert!(parse_xml(&huge).is_err());
}

#[test]
fn escaped_output_parses_back() {
    let nasty = "k&<>\"' ü\t";
    let body = error_body("Code", nasty, nasty, "id");
    let root = parse_xml(body.as_bytes()).unwrap().unwrap();
    assert_eq!(root.child("Message").unwrap().text, nasty);
    assert_eq!(root.child("Resource").unwrap().text, nasty);
}
