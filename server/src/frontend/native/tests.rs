//! Unit tests of the native door's pure parts.

use super::*;
use percore_protocol::native::Range;

#[test]
fn ranges_resolve_like_http() {
    let r = |o, l| Range {
        offset: o,
        length: l,
    };
    assert_eq!(resolve_ranges(&[], 10), Ok(vec![r(0, 10)]));
    assert_eq!(resolve_ranges(&[], 0), Ok(vec![r(0, 0)]));
    assert_eq!(
        resolve_ranges(&[r(2, 3), r(8, 100), r(4, 0)], 10),
        Ok(vec![r(2, 3), r(8, 2), r(4, 6)])
    );
    assert!(resolve_ranges(&[r(10, 1)], 10).is_err());
    assert!(resolve_ranges(&[r(11, 1)], 10).is_err());
    assert_eq!(resolve_ranges(&[r(0, 5)], 0), Ok(vec![r(0, 0)]));
}
