//! Request heads: limits, parsing with httparse, and the framing rules
//! (Content-Length / Transfer-Encoding / Connection / Expect).

use super::HttpError;

/// Bounds that keep one connection's memory and time finite.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Request line plus header fields plus the blank line.
    pub head_bytes_max: usize,
    /// Header fields in one request head.
    pub headers_count_max: usize,
    /// One chunk-size line (with extensions) or one trailer line, without CRLF.
    pub chunk_line_bytes_max: usize,
    /// From the first byte of a request head to its end.
    pub header_timeout_ms: u64,
    /// Waiting for the first byte of the next request.
    pub idle_timeout_ms: u64,
    /// One read or write of a body (and of a response) without progress.
    pub body_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head_bytes_max: 16 * 1024,
            headers_count_max: 100,
            chunk_line_bytes_max: 4 * 1024,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            body_timeout_ms: 30_000,
        }
    }
}

/// A parsed request head. Strings are kept raw (not percent-decoded): the
/// S3 layer needs the exact bytes for signature checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// The raw request-target as received.
    pub target: String,
    /// The raw part of `target` before the first '?'.
    pub path: String,
    /// The raw part of `target` after the first '?'; "" when there is none.
    pub query: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version_minor: u8,
    /// Header fields in arrival order: (name lowercased, value as received).
    pub headers: Vec<(String, Vec<u8>)>,
}

/// How the request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body (no Content-Length, or Content-Length: 0).
    Empty,
    /// Exactly this many bytes follow the head.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

impl RequestHead {
    /// The first value of a header field; `lower_name` must be lowercase.
    pub fn header(&self, lower_name: &str) -> Option<&[u8]> {
        debug_assert!(!lower_name.bytes().any(|b| b.is_ascii_uppercase()));
        self.headers
            .iter()
            .find(|(name, _)| name == lower_name)
            .map(|(_, value)| value.as_slice())
    }

    /// Every value of a header field, in arrival order.
    pub fn header_all<'a>(&'a self, lower_name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        debug_assert!(
            !lower_name.bytes().any(|b| b.is_ascii_uppercase()),
            "header names are stored lowercased"
        );
        self.headers
            .iter()
            .filter(move |(name, _)| name == lower_name)
            .map(|(_, value)| value.as_slice())
    }

    /// The first value of a header field as text; None when absent or not UTF-8.
    pub fn header_str(&self, lower_name: &str) -> Option<&str> {
        std::str::from_utf8(self.header(lower_name)?).ok()
    }

    /// The declared body length. Repeated fields and lists are accepted only
    /// when every value is the same, because disagreeing lengths are how
    /// request smuggling starts.
    pub fn content_length(&self) -> Result<Option<u64>, HttpError> {
        let mut length_bytes: Option<u64> = None;
        for value in self.header_all("content-length") {
            for item in value.split(|&b| b == b',') {
                let parsed = parse_decimal(trim_ows(item))
                    .ok_or(HttpError::BadRequest("invalid content-length"))?;
                if length_bytes.is_some_and(|seen| seen != parsed) {
                    return Err(HttpError::BadRequest("conflicting content-length"));
                }
                length_bytes = Some(parsed);
            }
        }
        Ok(length_bytes)
    }

    /// True for `Transfer-Encoding: chunked`, false without the field.
    /// Other codings are 501 (we decode none), a malformed list is 400.
    pub fn is_chunked(&self) -> Result<bool, HttpError> {
        if self.header("transfer-encoding").is_none() {
            return Ok(false);
        }
        let mut chunked_count = 0usize;
        let mut other_count = 0usize;
        for item in list_items(self.header_all("transfer-encoding")) {
            if item.eq_ignore_ascii_case(b"chunked") {
                chunked_count += 1;
            } else {
                other_count += 1;
            }
        }
        if other_count > 0 {
            return Err(HttpError::NotImplemented);
        }
        match chunked_count {
            0 => Err(HttpError::BadRequest("empty transfer-encoding")),
            1 => Ok(true),
            _ => Err(HttpError::BadRequest("chunked applied more than once")),
        }
    }

    /// Whether the client lets the connection stay open after this exchange.
    pub fn keep_alive(&self) -> bool {
        let mut close = false;
        let mut keep_alive = false;
        for item in list_items(self.header_all("connection")) {
            close |= item.eq_ignore_ascii_case(b"close");
            keep_alive |= item.eq_ignore_ascii_case(b"keep-alive");
        }
        if close {
            return false;
        }
        self.version_minor >= 1 || keep_alive
    }

    /// `Expect: 100-continue` on an HTTP/1.1 request (1.0 clients do not
    /// understand 1xx replies, so the field is ignored for them).
    pub fn expects_continue(&self) -> bool {
        self.version_minor >= 1
            && self
                .header("expect")
                .is_some_and(|v| trim_ows(v).eq_ignore_ascii_case(b"100-continue"))
    }

    /// The body framing, applying RFC 9112 section 6 strictly.
    pub fn body_framing(&self) -> Result<BodyFraming, HttpError> {
        let length_bytes = self.content_length()?;
        if self.header("transfer-encoding").is_some() {
            if length_bytes.is_some() {
                return Err(HttpError::BadRequest(
                    "both content-length and transfer-encoding",
                ));
            }
            if self.version_minor == 0 {
                // RFC 9112 6.1: framing of a 1.0 message with TE is faulty.
                return Err(HttpError::BadRequest("transfer-encoding in HTTP/1.0"));
            }
            // is_chunked() errors for anything but exactly "chunked".
            return if self.is_chunked()? {
                Ok(BodyFraming::Chunked)
            } else {
                Err(HttpError::BadRequest("invalid transfer-encoding"))
            };
        }
        Ok(match length_bytes {
            None | Some(0) => BodyFraming::Empty,
            Some(n) => BodyFraming::Length(n),
        })
    }

    fn from_parsed(req: &httparse::Request<'_, '_>) -> Result<Self, HttpError> {
        let method = req.method.ok_or(HttpError::BadRequest("missing method"))?;
        let target = req.path.ok_or(HttpError::BadRequest("missing target"))?;
        let version_minor = req.version.ok_or(HttpError::VersionNotSupported)?;
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let headers = req
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        Ok(RequestHead {
            method: method.to_owned(),
            target: target.to_owned(),
            path: path.to_owned(),
            query: query.to_owned(),
            version_minor,
            headers,
        })
    }
}

/// Index just past the first empty line (`\n\n` or `\n\r\n`) whose first
/// '\n' is at or after `from`. Cheap pre-check so that httparse runs once
/// per head instead of once per read (a byte-at-a-time client would
/// otherwise cost quadratic time).
pub(crate) fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut pos = from;
    while pos < buf.len() {
        let newline = pos + buf[pos..].iter().position(|&b| b == b'\n')?;
        match buf.get(newline + 1) {
            Some(b'\n') => return Some(newline + 2),
            Some(b'\r') if buf.get(newline + 2) == Some(&b'\n') => return Some(newline + 3),
            _ => pos = newline + 1,
        }
    }
    None
}

/// The next complete request head in `window` (the bytes read so far, the
/// head-size limit applied), and how many bytes it took. `scan_from` carries
/// the terminator scan across calls as the window grows, so a client that
/// sends one byte at a time costs linear time; start it at 0 for each
/// request. Blank lines before the request line are skipped (RFC 9112 2.2).
pub(crate) fn next_head(
    window: &[u8],
    scan_from: &mut usize,
    limits: &Limits,
) -> Result<Option<(RequestHead, usize)>, HttpError> {
    while let Some(end) = find_head_end(window, *scan_from) {
        if let Some(parsed) = parse_head(&window[..end], limits)? {
            return Ok(Some(parsed));
        }
        // Only blank lines so far; the next terminator may start at the
        // last '\n' of this one.
        *scan_from = end - 1;
    }
    // A terminator can straddle reads by at most two bytes.
    *scan_from = (*scan_from).max(window.len().saturating_sub(2));
    Ok(None)
}

/// Parses a head from `buf`. Ok(None) when httparse needs more bytes
/// (e.g. `buf` held only blank lines that precede the request line).
pub(crate) fn parse_head(
    buf: &[u8],
    limits: &Limits,
) -> Result<Option<(RequestHead, usize)>, HttpError> {
    // A field line takes at least 3 bytes ("a:\n"), so a longer array than
    // this could never fill; the clamp only guards a silly configuration.
    let headers_count_max = limits.headers_count_max.min(buf.len() / 3 + 1);
    let mut headers = vec![httparse::EMPTY_HEADER; headers_count_max];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(head_bytes)) => {
            debug_assert!(head_bytes <= buf.len());
            Ok(Some((RequestHead::from_parsed(&req)?, head_bytes)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HttpError::TooManyHeaders),
        Err(httparse::Error::Version) => Err(version_error(buf)),
        Err(httparse::Error::HeaderName) => Err(HttpError::BadRequest("invalid header name")),
        Err(httparse::Error::HeaderValue) => Err(HttpError::BadRequest("invalid header value")),
        Err(httparse::Error::NewLine) => Err(HttpError::BadRequest("invalid line ending")),
        Err(_) => Err(HttpError::BadRequest("invalid request line")),
    }
}

/// httparse reports any non-1.x version as a syntax error; a well-formed
/// `HTTP/d.d` deserves 505, anything else 400.
fn version_error(buf: &[u8]) -> HttpError {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n');
    let line = start.map_or(&buf[..0], |s| {
        let rest = &buf[s..];
        let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        &rest[..end]
    });
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let version = line.rsplit(|&b| b == b' ').next().unwrap_or(&[]);
    match version {
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            HttpError::VersionNotSupported
        }
        _ => HttpError::BadRequest("invalid HTTP version"),
    }
}

/// Items of a comma-separated field list across repeated fields, trimmed,
/// empty items skipped (RFC 9110 5.6.1).
pub(crate) fn list_items<'a>(
    values: impl Iterator<Item = &'a [u8]> + 'a,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .map(trim_ows)
        .filter(|item| !item.is_empty())
}

pub(crate) fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

/// 1*DIGIT as u64; None when empty, non-digit or overflowing.
pub(crate) fn parse_decimal(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RequestHead, HttpError> {
        let limits = Limits::default();
        let end = find_head_end(text.as_bytes(), 0).expect("test head must be complete");
        parse_head(&text.as_bytes()[..end], &limits).map(|r| r.expect("complete").0)
    }

    fn with_headers(version: &str, headers: &str) -> RequestHead {
        parse(&format!("GET / HTTP/1.{version}\r\n{headers}\r\n")).unwrap()
    }

    #[test]
    fn splits_target_and_lowercases_names() {
        let head =
            parse("PUT /b/k%20x?uploadId=1&a= HTTP/1.1\r\nHost: h\r\nX-Amz-Meta-A: V a\r\n\r\n")
                .unwrap();
        assert_eq!(head.method, "PUT");
        assert_eq!(head.target, "/b/k%20x?uploadId=1&a=");
        assert_eq!(head.path, "/b/k%20x");
        assert_eq!(head.query, "uploadId=1&a=");
        assert_eq!(head.version_minor, 1);
        assert_eq!(head.header("x-amz-meta-a"), Some(&b"V a"[..]));
        assert_eq!(head.header_str("host"), Some("h"));
        assert_eq!(head.header("missing"), None);
        let no_query = parse("GET /a HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(
            (no_query.path.as_str(), no_query.query.as_str()),
            ("/a", "")
        );
    }

    #[test]
    fn header_str_rejects_non_utf8() {
        let mut head = with_headers("1", "");
        head.headers.push(("x".into(), vec![0xff, 0xfe]));
        assert_eq!(head.header("x"), Some(&[0xff, 0xfe][..]));
        assert_eq!(head.header_str("x"), None);
    }

    #[test]
    fn content_length_rules() {
        let cl = |v: &str| with_headers("1", &format!("Content-Length: {v}\r\n")).content_length();
        assert_eq!(cl("0").unwrap(), Some(0));
        assert_eq!(cl("12345").unwrap(), Some(12345));
        assert_eq!(cl("7, 7").unwrap(), Some(7));
        for bad in [
            "-1",
            "abc",
            "1, 2",
            "+1",
            "1.0",
            "18446744073709551616",
            "0x10",
            ",",
        ] {
            assert!(matches!(cl(bad), Err(HttpError::BadRequest(_))), "{bad}");
        }
        let twice = with_headers("1", "Content-Length: 3\r\nContent-Length: 4\r\n");
        assert!(matches!(
            twice.content_length(),
            Err(HttpError::BadRequest(_))
        ));
        let same = with_headers("1", "Content-Length: 3\r\nContent-Length: 3\r\n");
        assert_eq!(same.content_length().unwrap(), Some(3));
        assert_eq!(with_headers("1", "").content_length().unwrap(), None);
    }

    #[test]
    fn transfer_encoding_rules() {
        let te = |v: &str| with_headers("1", &format!("Transfer-Encoding: {v}\r\n"));
        assert!(te("chunked").is_chunked().unwrap());
        assert!(te("CHUNKED").is_chunked().unwrap());
        assert!(matches!(
            te("gzip, chunked").is_chunked(),
            Err(HttpError::NotImplemented)
        ));
        assert!(matches!(
            te("identity").is_chunked(),
            Err(HttpError::NotImplemented)
        ));
        assert!(matches!(
            te("chunked, chunked").is_chunked(),
            Err(HttpError::BadRequest(_))
        ));
        assert!(matches!(
            te(",").is_chunked(),
            Err(HttpError::BadRequest(_))
        ));
        assert!(!with_headers("1", "").is_chunked().unwrap());
        assert_eq!(te("chunked").body_framing().unwrap(), BodyFraming::Chunked);
        let both = with_headers("1", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n");
        assert!(matches!(both.body_framing(), Err(HttpError::BadRequest(_))));
        let old = with_headers("0", "Transfer-Encoding: chunked\r\n");
        assert!(matches!(old.body_framing(), Err(HttpError::BadRequest(_))));
        let zero = with_headers("1", "Content-Length: 0\r\n");
        assert_eq!(zero.body_framing().unwrap(), BodyFraming::Empty);
        let five = with_headers("1", "Content-Length: 5\r\n");
        assert_eq!(five.body_framing().unwrap(), BodyFraming::Length(5));
    }

    #[test]
    fn keep_alive_and_expect() {
        assert!(with_headers("1", "").keep_alive());
        assert!(!with_headers("1", "Connection: close\r\n").keep_alive());
        assert!(!with_headers("1", "Connection: keep-alive, Close\r\n").keep_alive());
        assert!(!with_headers("0", "").keep_alive());
        assert!(with_headers("0", "Connection: Keep-Alive\r\n").keep_alive());
        assert!(with_headers("1", "Expect: 100-Continue\r\n").expects_continue());
        assert!(!with_headers("0", "Expect: 100-continue\r\n").expects_continue());
        assert!(!with_headers("1", "Expect: something\r\n").expects_continue());
    }

    #[test]
    fn version_and_syntax_errors() {
        assert!(matches!(
            parse("GET / HTTP/2.0\r\n\r\n"),
            Err(HttpError::VersionNotSupported)
        ));
        assert!(matches!(
            parse("GET / HTTP/1.2\r\n\r\n"),
            Err(HttpError::VersionNotSupported)
        ));
        assert!(matches!(
            parse("GET / HTTP/x\r\n\r\n"),
            Err(HttpError::BadRequest(_))
        ));
        assert!(matches!(
            parse("GET /\r\n\r\n"),
            Err(HttpError::BadRequest(_))
        ));
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nBad Name: v\r\n\r\n"),
            Err(HttpError::BadRequest(_))
        ));
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n"),
            Err(HttpError::BadRequest(_))
        ));
        assert!(matches!(
            parse("G(T / HTTP/1.1\r\n\r\n"),
            Err(HttpError::BadRequest(_))
        ));
    }

    #[test]
    fn finds_head_end() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nBODY", 0), Some(18));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\nBODY", 0), Some(16));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r", 0), None);
        assert_eq!(find_head_end(b"\r\n\r\nGET", 0), Some(4));
        assert_eq!(
            find_head_end(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", 3),
            Some(22)
        );
    }

    #[test]
    fn leading_blank_lines_are_skipped() {
        let limits = Limits::default();
        let buf = b"\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        assert!(parse_head(&buf[..4], &limits).unwrap().is_none());
        let (head, used) = parse_head(buf, &limits).unwrap().unwrap();
        assert_eq!((head.method.as_str(), used), ("GET", buf.len()));
    }

    #[test]
    fn decimal_and_ows() {
        assert_eq!(parse_decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
    }
}
