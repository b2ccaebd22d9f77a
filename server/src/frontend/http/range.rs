//! `Range: bytes=...` as S3 answers it (RFC 9110 14.1-14.2): a syntactically
//! invalid header is ignored (200 with the whole object); a valid one with
//! no satisfiable range is 416.

/// More ranges than this in one header are treated as an invalid header
/// (whole object): answering thousands of tiny parts is an amplification.
pub const RANGES_COUNT_MAX: usize = 64;

/// What to send for a `Range` header. Ranges are inclusive (start, end) and
/// already clamped to the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeSpec {
    /// Ignore the header: 200 with the whole object.
    Whole,
    /// 206 with `Content-Range: bytes start-end/size`.
    Single(u64, u64),
    /// Two or more satisfiable ranges, in request order (not merged), for a
    /// multipart/byteranges 206.
    Multi(Vec<(u64, u64)>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// 416 with `Content-Range: bytes */size`.
    #[error("range not satisfiable for size {size}")]
    Unsatisfiable { size: u64 },
}

impl RangeError {
    pub fn status(&self) -> u16 {
        416
    }

    /// Value of the `Content-Range` header for the 416 reply.
    pub fn content_range(&self) -> String {
        match self {
            RangeError::Unsatisfiable { size } => format!("bytes */{size}"),
        }
    }
}

/// `Content-Range` value for a 206 part.
pub fn content_range(start: u64, end: u64, size: u64) -> String {
    debug_assert!(start <= end && end < size);
    format!("bytes {start}-{end}/{size}")
}

/// One range as written, before it meets the object size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RawRange {
    /// `a-b` (b may be absent: `a-`).
    FromStart { first: u64, last: Option<u64> },
    /// `-n`: the last n bytes.
    Suffix { length_bytes: u64 },
}

/// Interprets a `Range` header value for an object of `size` bytes.
pub fn parse_range(value: &[u8], size: u64) -> Result<RangeSpec, RangeError> {
    let Some(raw_ranges) = parse_raw_ranges(value) else {
        return Ok(RangeSpec::Whole);
    };
    debug_assert!(!raw_ranges.is_empty() && raw_ranges.len() <= RANGES_COUNT_MAX);
    let mut satisfiable: Vec<(u64, u64)> = raw_ranges
        .iter()
        .filter_map(|raw| resolve(*raw, size))
        .collect();
    match satisfiable.len() {
        0 => Err(RangeError::Unsatisfiable { size }),
        // One satisfiable range of several may be sent as a plain 206.
        1 => {
            let (start, end) = satisfiable.remove(0);
            Ok(RangeSpec::Single(start, end))
        }
        _ => Ok(RangeSpec::Multi(satisfiable)),
    }
}

/// Inclusive (start, end) within `size`, or None when unsatisfiable.
fn resolve(raw: RawRange, size: u64) -> Option<(u64, u64)> {
    let last_index = size.checked_sub(1)?;
    match raw {
        RawRange::FromStart { first, .. } if first >= size => None,
        RawRange::FromStart { first, last } => {
            Some((first, last.map_or(last_index, |l| l.min(last_index))))
        }
        RawRange::Suffix { length_bytes: 0 } => None,
        RawRange::Suffix { length_bytes } => Some((size.saturating_sub(length_bytes), last_index)),
    }
}

/// None when the header is not a valid `bytes=` range set (and so ignored).
fn parse_raw_ranges(value: &[u8]) -> Option<Vec<RawRange>> {
    let value = trim(value);
    let (unit, set) = split_once(value, b'=')?;
    if !trim(unit).eq_ignore_ascii_case(b"bytes") {
        return None;
    }
    let mut ranges = Vec::new();
    // Empty list elements are allowed by the list syntax (RFC 9110 5.6.1).
    for item in set
        .split(|&b| b == b',')
        .map(trim)
        .filter(|i| !i.is_empty())
    {
        if ranges.len() == RANGES_COUNT_MAX {
            return None;
        }
        ranges.push(parse_one(item)?);
    }
    if ranges.is_empty() {
        return None;
    }
    Some(ranges)
}

fn parse_one(item: &[u8]) -> Option<RawRange> {
    let (first, last) = split_once(item, b'-')?;
    if first.is_empty() {
        return Some(RawRange::Suffix {
            length_bytes: parse_digits_saturating(last)?,
        });
    }
    let first = parse_digits_saturating(first)?;
    if last.is_empty() {
        return Some(RawRange::FromStart { first, last: None });
    }
    let last = parse_digits_saturating(last)?;
    // RFC 9110 14.1.1: last < first makes the whole header invalid.
    if last < first {
        return None;
    }
    Some(RawRange::FromStart {
        first,
        last: Some(last),
    })
}

/// 1*DIGIT; values past u64::MAX saturate, which is the right answer for
/// both an offset (beyond any object) and a suffix (the whole object).
fn parse_digits_saturating(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(bytes.iter().fold(0u64, |acc, &b| {
        acc.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    }))
}

fn split_once(bytes: &[u8], separator: u8) -> Option<(&[u8], &[u8])> {
    let at = bytes.iter().position(|&b| b == separator)?;
    Some((&bytes[..at], &bytes[at + 1..]))
}

fn trim(bytes: &[u8]) -> &[u8] {
    super::head::trim_ows(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsat(size: u64) -> Result<RangeSpec, RangeError> {
        Err(RangeError::Unsatisfiable { size })
    }

    #[test]
    fn table() {
        use RangeSpec::*;
        let cases: &[(&str, u64, Result<RangeSpec, RangeError>)] = &[
            ("bytes=0-0", 10, Ok(Single(0, 0))),
            ("bytes=0-9", 10, Ok(Single(0, 9))),
            ("bytes=2-5", 10, Ok(Single(2, 5))),
            ("bytes=5-100", 10, Ok(Single(5, 9))),
            ("bytes=9-9", 10, Ok(Single(9, 9))),
            ("bytes=3-", 10, Ok(Single(3, 9))),
            ("bytes=0-", 10, Ok(Single(0, 9))),
            ("bytes=-3", 10, Ok(Single(7, 9))),
            ("bytes=-10", 10, Ok(Single(0, 9))),
            ("bytes=-11", 10, Ok(Single(0, 9))),
            ("bytes=-99999999999999999999999", 10, Ok(Single(0, 9))),
            ("bytes=0-99999999999999999999999", 10, Ok(Single(0, 9))),
            ("bytes=10-", 10, unsat(10)),
            ("bytes=10-20", 10, unsat(10)),
            ("bytes=99999999999999999999999-", 10, unsat(10)),
            ("bytes=-0", 10, unsat(10)),
            ("bytes=0-0", 0, unsat(0)),
            ("bytes=0-", 0, unsat(0)),
            ("bytes=-5", 0, unsat(0)),
            ("BYTES = 1-2 ", 10, Ok(Single(1, 2))),
            ("bytes=0-1,5-6", 10, Ok(Multi(vec![(0, 1), (5, 6)]))),
            ("bytes=0-1, -2", 10, Ok(Multi(vec![(0, 1), (8, 9)]))),
            ("bytes=0-1,,5-6,", 10, Ok(Multi(vec![(0, 1), (5, 6)]))),
            ("bytes=0-1,20-30", 10, Ok(Single(0, 1))),
            ("bytes=20-30,40-", 10, unsat(10)),
            ("bytes=0-1,5-6", 0, unsat(0)),
            // Syntactically invalid: ignored.
            ("bytes=5-2", 10, Ok(Whole)),
            ("bytes=abc", 10, Ok(Whole)),
            ("bytes=1-2-3", 10, Ok(Whole)),
            ("bytes=-", 10, Ok(Whole)),
            ("bytes=", 10, Ok(Whole)),
            ("bytes=,", 10, Ok(Whole)),
            ("bytes=+1-2", 10, Ok(Whole)),
            ("bytes=1 -2", 10, Ok(Whole)),
            ("items=0-1", 10, Ok(Whole)),
            ("bytes 0-1", 10, Ok(Whole)),
            ("", 10, Ok(Whole)),
            ("bytes=0-1,x", 10, Ok(Whole)),
            ("bytes=5-2", 0, Ok(Whole)),
        ];
        for (value, size, expected) in cases {
            assert_eq!(
                &parse_range(value.as_bytes(), *size),
                expected,
                "{value:?} size {size}"
            );
        }
    }

    #[test]
    fn range_count_is_bounded() {
        let at_max = vec!["0-0"; RANGES_COUNT_MAX].join(",");
        let spec = parse_range(format!("bytes={at_max}").as_bytes(), 10).unwrap();
        assert!(matches!(spec, RangeSpec::Multi(ref r) if r.len() == RANGES_COUNT_MAX));
        let over = vec!["0-0"; RANGES_COUNT_MAX + 1].join(",");
        assert_eq!(
            parse_range(format!("bytes={over}").as_bytes(), 10),
            Ok(RangeSpec::Whole)
        );
    }

    #[test]
    fn content_range_values() {
        let err = parse_range(b"bytes=10-", 10).unwrap_err();
        assert_eq!(err.content_range(), "bytes */10");
        assert_eq!(err.status(), 416);
        assert_eq!(content_range(0, 9, 10), "bytes 0-9/10");
    }
}
