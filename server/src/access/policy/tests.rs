use super::*;
use std::rc::Rc;

fn user(n: &str) -> Principal {
    Principal::User(Rc::from(n))
}

#[test]
fn globs() {
    assert!(glob("s3:Get*", "s3:GetObject", true));
    assert!(glob("S3:get*", "s3:GetObject", true));
    assert!(!glob("s3:Get*", "s3:PutObject", true));
    assert!(glob(
        "arn:aws:s3:::b/pub/*",
        "arn:aws:s3:::b/pub/a/b",
        false
    ));
    assert!(!glob("arn:aws:s3:::b/pub/*", "arn:aws:s3:::b/Pub/a", false));
    assert!(glob("a?c", "abc", false) && !glob("a?c", "ac", false));
    assert!(glob("*", "", false) && glob("**a", "xa", false));
    assert!(!glob("a*b*c", "aXbY", false));
}

#[test]
fn allow_deny_and_principals() {
    let p = Policy::parse(
        br#"{"Version":"2012-10-17","Statement":[
          {"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/pub/*"},
          {"Effect":"Allow","Principal":{"AWS":["arn:aws:iam::123:user/alice","bob"]},
           "Action":["s3:*"],"Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]},
          {"Effect":"Deny","Principal":{"AWS":"bob"},"Action":"s3:Delete*","Resource":"arn:aws:s3:::b/*"}]}"#,
        "b",
    )
    .unwrap();
    let get = |who: &Principal, key: &str| {
        p.evaluate(who, "s3:GetObject", &format!("arn:aws:s3:::b/{key}"))
    };
    assert_eq!(get(&Principal::Anonymous, "pub/x"), Some(Verdict::Allow));
    assert_eq!(get(&Principal::Anonymous, "priv/x"), None);
    assert_eq!(get(&user("carol"), "priv/x"), None);
    assert_eq!(get(&user("alice"), "priv/x"), Some(Verdict::Allow));
    assert_eq!(
        p.evaluate(&user("bob"), "s3:DeleteObject", "arn:aws:s3:::b/k"),
        Some(Verdict::Deny)
    );
    assert_eq!(
        p.evaluate(&user("alice"), "s3:DeleteObject", "arn:aws:s3:::b/k"),
        Some(Verdict::Allow)
    );
    assert_eq!(
        p.evaluate(&user("alice"), "s3:ListBucket", "arn:aws:s3:::b"),
        Some(Verdict::Allow)
    );
    assert!(p.is_public());
}

#[test]
fn refused_policies() {
    let bad: &[(&str, &str)] = &[
        ("not json", "MalformedPolicy"),
        (r#"{"Statement":[]}"#, "MalformedPolicy"),
        (
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}}"#,
            "MalformedPolicy",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::bb/*"}}"#,
            "MalformedPolicy",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"iam:Get","Resource":"arn:aws:s3:::b/*"}}"#,
            "MalformedPolicy",
        ),
        (
            r#"{"Statement":{"Effect":"Maybe","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            "MalformedPolicy",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{"IpAddress":{"aws:SourceIp":"1.2.3.4/32"}}}}"#,
            "NotImplemented",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","NotPrincipal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            "NotImplemented",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Principal":{"CanonicalUser":"x"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            "NotImplemented",
        ),
        (
            r#"{"Version":"2099-01-01","Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            "MalformedPolicy",
        ),
    ];
    for (body, code) in bad {
        assert_eq!(
            Policy::parse(body.as_bytes(), "b").unwrap_err().code,
            *code,
            "{body}"
        );
    }
    let big = format!(r#"{{"Id":"{}"}}"#, "x".repeat(POLICY_BYTES_MAX));
    assert_eq!(
        Policy::parse(big.as_bytes(), "b").unwrap_err().code,
        "PolicyTooLarge"
    );
}
