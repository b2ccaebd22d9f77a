use super::cors::Cors;
use super::lifecycle::{Expiration, Lifecycle};
use super::tagging::{TagSet, BUCKET_TAGS_MAX, OBJECT_TAGS_MAX};
use super::{BucketConfig, ConfigKind};

const DAY: u64 = 86_400_000;

#[test]
fn tags_round_trip_and_limits() {
    let xml = b"<Tagging><TagSet><Tag><Key>team</Key><Value>vision</Value></Tag>\
        <Tag><Key>a b</Key><Value>x/y@z</Value></Tag></TagSet></Tagging>";
    let t = TagSet::parse_xml(xml, OBJECT_TAGS_MAX).unwrap();
    assert_eq!(t.0.len(), 2);
    assert_eq!(
        TagSet::parse_xml(t.to_xml().as_bytes(), OBJECT_TAGS_MAX).unwrap(),
        t
    );
    assert_eq!(
        TagSet::parse_query(&t.to_query(), OBJECT_TAGS_MAX).unwrap(),
        t
    );
    assert_eq!(
        TagSet::parse_query("a=1&b=two+words&c=%2F", 10).unwrap().0,
        vec![
            ("a".into(), "1".into()),
            ("b".into(), "two words".into()),
            ("c".into(), "/".into())
        ]
    );
    let eleven: String = (0..11).map(|i| format!("k{i}=v&")).collect();
    assert_eq!(
        TagSet::parse_query(&eleven, OBJECT_TAGS_MAX)
            .unwrap_err()
            .code,
        "BadRequest"
    );
    assert!(TagSet::parse_query(&eleven, BUCKET_TAGS_MAX).is_ok());
    for bad in [
        "a=1&a=2",
        "=v",
        "aws:x=1",
        "k=<script>",
        &format!("{}=v", "k".repeat(129)),
    ] {
        assert_eq!(
            TagSet::parse_query(bad, 10).unwrap_err().code,
            "InvalidTag",
            "{bad}"
        );
    }
    assert!(TagSet::parse_query(&format!("k={}", "v".repeat(256)), 10).is_ok());
    assert!(TagSet::parse_query(&format!("k={}", "v".repeat(257)), 10).is_err());
}

#[test]
fn cors_parse_match_and_render() {
    let xml = br#"<CORSConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
      <CORSRule><AllowedOrigin>https://*.example.com</AllowedOrigin>
        <AllowedMethod>PUT</AllowedMethod><AllowedMethod>GET</AllowedMethod>
        <AllowedHeader>x-amz-*</AllowedHeader><AllowedHeader>Content-Type</AllowedHeader>
        <ExposeHeader>ETag</ExposeHeader><MaxAgeSeconds>600</MaxAgeSeconds></CORSRule>
      <CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule>
    </CORSConfiguration>"#;
    let c = Cors::parse(xml).unwrap();
    assert_eq!(Cors::parse(c.to_xml().as_bytes()).unwrap(), c);
    let r = c
        .find(
            "https://app.example.com",
            "PUT",
            &["x-amz-date", "content-type"],
        )
        .unwrap();
    assert_eq!(r.max_age_secs, Some(600));
    assert_eq!(
        r.allow_origin("https://app.example.com"),
        "https://app.example.com"
    );
    assert!(c
        .find("https://app.example.com", "PUT", &["authorization"])
        .is_none());
    assert!(c.find("https://evil.com", "PUT", &[]).is_none());
    assert!(
        c.find("https://example.com", "PUT", &[]).is_none(),
        "the * needs its dot"
    );
    let any = c.find("https://evil.com", "GET", &[]).unwrap();
    assert_eq!(any.allow_origin("https://evil.com"), "*");
    assert!(c.find("https://evil.com", "DELETE", &[]).is_none());
    for bad in [
        &b"<CORSConfiguration/>"[..],
        b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin></CORSRule></CORSConfiguration>",
        b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>PATCH</AllowedMethod></CORSRule></CORSConfiguration>",
        b"<CORSConfiguration><CORSRule><AllowedOrigin>*.*</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule></CORSConfiguration>",
        b"<Tagging/>",
    ] {
        assert!(Cors::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn lifecycle_parse_render_and_expiry() {
    let xml = br#"<LifecycleConfiguration>
      <Rule><ID>ckpt</ID><Filter><Prefix>ckpt/</Prefix></Filter><Status>Enabled</Status>
        <Expiration><Days>7</Days></Expiration></Rule>
      <Rule><Filter><And><Prefix>tmp/</Prefix><Tag><Key>k</Key><Value>v</Value></Tag>
        <ObjectSizeGreaterThan>10</ObjectSizeGreaterThan></And></Filter><Status>Disabled</Status>
        <Expiration><Date>2020-01-01T00:00:00Z</Date></Expiration></Rule>
      <Rule><ID>mpu</ID><Prefix></Prefix><Status>Enabled</Status>
        <AbortIncompleteMultipartUpload><DaysAfterInitiation>2</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule>
      <Rule><ID>old</ID><Filter/><Status>Enabled</Status>
        <NoncurrentVersionExpiration><NoncurrentDays>3</NoncurrentDays>
          <NewerNoncurrentVersions>5</NewerNoncurrentVersions></NoncurrentVersionExpiration></Rule>
    </LifecycleConfiguration>"#;
    let l = Lifecycle::parse(xml).unwrap();
    assert_eq!(Lifecycle::parse(l.to_xml().as_bytes()).unwrap(), l);
    assert_eq!(l.rules[1].id, "rule-2");
    assert_eq!(l.enabled().count(), 3);
    assert_eq!(
        (l.rules[3].noncurrent_days, l.rules[3].newer_noncurrent),
        (Some(3), Some(5))
    );
    assert_eq!(
        l.rules[1].expiration,
        Some(Expiration::Date(1_577_836_800_000))
    );
    assert!(l.rules[1].filter.matches("tmp/a", 11));
    assert!(!l.rules[1].filter.matches("tmp/a", 10));
    assert!(!l.rules[1].filter.matches("tm", 100));
    // Seven days after, rounded up to midnight UTC.
    let mtime = 1_700_000_000_000; // 2023-11-14T22:13:20Z
    assert_eq!(
        l.rules[0].expires_at_ms(mtime, DAY),
        Some(1_700_611_200_000)
    );
    assert_eq!(l.rules[0].expires_at_ms(7 * DAY, DAY), Some(14 * DAY));
    assert_eq!(l.rules[0].expires_at_ms(1500, 1000), Some(9000));
    for bad in [
        &b"<LifecycleConfiguration/>"[..],
        b"<LifecycleConfiguration><Rule><Status>Enabled</Status></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><Status>On</Status><Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Days>0</Days></Expiration></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Date>2020-01-01T10:00:00Z</Date></Expiration></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><Status>Enabled</Status><Transition><Days>1</Days><StorageClass>GLACIER</StorageClass></Transition></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><ID>a</ID><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule><Rule><ID>a</ID><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><Filter><Tag><Key>k</Key><Value>v</Value></Tag></Filter><Status>Enabled</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>1</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><Status>Enabled</Status><NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays><NewerNoncurrentVersions>0</NewerNoncurrentVersions></NoncurrentVersionExpiration></Rule></LifecycleConfiguration>",
        b"<LifecycleConfiguration><Rule><Status>Enabled</Status><NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays><NewerNoncurrentVersions>101</NewerNoncurrentVersions></NoncurrentVersionExpiration></Rule></LifecycleConfiguration>",
    ] {
        assert!(Lifecycle::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    let transition = b"<LifecycleConfiguration><Rule><Status>Enabled</Status><Transition><Days>1</Days></Transition></Rule></LifecycleConfiguration>";
    assert_eq!(Lifecycle::parse(transition).unwrap_err().status, 501);
}

#[test]
fn midnight_dates() {
    use super::lifecycle::parse_midnight_for_tests as p;
    assert_eq!(p("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(p("2024-02-29T00:00:00.000Z"), Some(19_782 * DAY));
    assert_eq!(p("2023-02-29T00:00:00Z"), None);
    assert_eq!(p("2024-13-01T00:00:00Z"), None);
    assert_eq!(p("2024-01-01"), None);
}

#[test]
fn applies_follow_the_write_order() {
    let mut c = BucketConfig::default();
    let cors = Cors::parse(
        b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule></CORSConfiguration>",
    )
    .unwrap()
    .to_xml();
    assert!(c.apply("b", ConfigKind::Cors, 5, Some(cors.as_bytes())));
    assert!(
        !c.apply("b", ConfigKind::Cors, 4, None),
        "an older removal arrives late"
    );
    assert!(c.cors.is_some());
    assert!(c.apply("b", ConfigKind::Cors, 6, None));
    assert!(c.cors.is_none());
    assert!(c.apply("b", ConfigKind::Tagging, 1, Some(b"not xml")));
    assert!(c.tagging.is_none());
}
