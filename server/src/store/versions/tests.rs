use super::*;

#[test]
fn version_ids_round_trip_and_sort_newest_first() {
    for seq in [1u64, 2, 255, 1 << 40, u64::MAX - 1] {
        let id = version_id(Some(seq));
        assert_eq!(id.len(), 16);
        assert_eq!(Pick::parse(&id), Some(Pick::Id(seq)));
        assert_eq!(
            split_version_key(&version_key("a/b", seq)),
            Some(("a/b", seq))
        );
    }
    assert_eq!(version_id(None), "null");
    assert_eq!(Pick::parse("null"), Some(Pick::Null));
    for bad in [
        "",
        "NULL",
        "0123456789abcdeF",
        "0123456789abcde",
        "0123456789abcdef0",
        "zzzzzzzzzzzzzzzz",
    ] {
        assert_eq!(Pick::parse(bad), None, "{bad:?}");
    }
    // A newer version's key sorts before an older one's.
    assert!(version_key("k", 10) < version_key("k", 9));
}

#[test]
fn version_keys_keep_the_order_of_their_keys() {
    // Keys never hold NUL, so "k" + NUL sorts before "k" + anything: the
    // versions of a key come before those of the keys it prefixes.
    let keys = ["a", "a!", "a/b", "ab", "b", "\u{1}", "\u{10FFFF}"];
    for x in keys {
        for y in keys.iter().filter(|y| **y != x) {
            assert_eq!(
                x.cmp(*y),
                version_key(x, 5).cmp(&version_key(y, 7)),
                "{x:?} vs {y:?}"
            );
        }
    }
}
