//! Response heads: validation and encoding.

use std::borrow::Cow;
use std::io::Write as _;

use super::HttpError;

/// Status and caller headers. `Content-Length`, `Date`, `Server`,
/// `Connection` and `Transfer-Encoding` are written by the connection and
/// must not be set here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub headers: Vec<(Cow<'static, str>, String)>,
}

impl ResponseHead {
    pub fn new(status: u16) -> Self {
        ResponseHead {
            status,
            headers: Vec::new(),
        }
    }

    /// Builder form of [`ResponseHead::push_header`].
    pub fn with_header(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<String>,
    ) -> Self {
        self.push_header(name, value);
        self
    }

    pub fn push_header(&mut self, name: impl Into<Cow<'static, str>>, value: impl Into<String>) {
        self.headers.push((name.into(), value.into()));
    }
}

/// Header names the connection owns: a second copy from the caller would
/// break the framing of the response.
const RESERVED_HEADERS: [&str; 5] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "date",
    "server",
];

/// Standard reason phrase; "" (allowed by RFC 9112) for unknown codes.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "",
    }
}

/// Responses that never carry content, so no Content-Length is sent
/// (RFC 9110 8.6: forbidden for 1xx/204; for 304 only the 200's length
/// would be correct, which the caller may not know).
fn omits_content_length(status: u16) -> bool {
    (100..200).contains(&status) || status == 204 || status == 304
}

pub(crate) struct FramingFields<'a> {
    /// The body's length; None: `Transfer-Encoding: chunked` (the body is
    /// written in chunks, `HttpConn::write_chunk`).
    pub content_length_bytes: Option<u64>,
    pub close: bool,
    /// The request was HTTP/1.0: persistence must be announced explicitly.
    pub announce_keep_alive: bool,
    pub date: &'a [u8],
}

/// Appends the encoded head to `out`; on error `out` is left unchanged.
pub(crate) fn encode_head(
    out: &mut Vec<u8>,
    head: &ResponseHead,
    framing: &FramingFields<'_>,
) -> Result<(), HttpError> {
    validate(head)?;
    // Writes into a Vec cannot fail.
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\n",
        head.status,
        reason_phrase(head.status)
    );
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(framing.date);
    out.extend_from_slice(b"\r\nServer: percore\r\n");
    for (name, value) in &head.headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    if !omits_content_length(head.status) {
        match framing.content_length_bytes {
            Some(n) => {
                let _ = write!(out, "Content-Length: {n}\r\n");
            }
            None => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        }
    }
    if framing.close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if framing.announce_keep_alive {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

fn validate(head: &ResponseHead) -> Result<(), HttpError> {
    if !(100..=999).contains(&head.status) {
        return Err(HttpError::InvalidResponse("status out of range"));
    }
    for (name, value) in &head.headers {
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(HttpError::InvalidResponse("invalid header name"));
        }
        if RESERVED_HEADERS
            .iter()
            .any(|r| name.eq_ignore_ascii_case(r))
        {
            return Err(HttpError::InvalidResponse(
                "header is set by the connection",
            ));
        }
        // CR/LF here would let a value (e.g. echoed user metadata) split the
        // response.
        if !value
            .bytes()
            .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
        {
            return Err(HttpError::InvalidResponse("invalid header value"));
        }
    }
    Ok(())
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(head: &ResponseHead, length: u64, close: bool, keep_alive: bool) -> String {
        let mut out = Vec::new();
        let framing = FramingFields {
            content_length_bytes: Some(length),
            close,
            announce_keep_alive: keep_alive,
            date: b"Sun, 06 Nov 1994 08:49:37 GMT",
        };
        encode_head(&mut out, head, &framing).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn encodes_fields_in_order() {
        let head = ResponseHead::new(200).with_header("ETag", "\"abc\"");
        assert_eq!(
            encode(&head, 5, false, false),
            "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: percore\r\n\
             ETag: \"abc\"\r\nContent-Length: 5\r\n\r\n"
        );
        let closing = encode(&ResponseHead::new(404), 0, true, true);
        assert!(closing.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(closing.ends_with("Content-Length: 0\r\nConnection: close\r\n\r\n"));
        let old_client = encode(&ResponseHead::new(200), 0, false, true);
        assert!(old_client.ends_with("Connection: keep-alive\r\n\r\n"));
    }

    #[test]
    fn no_content_length_where_forbidden() {
        for status in [100, 204, 304] {
            let text = encode(&ResponseHead::new(status), 0, false, false);
            assert!(!text.contains("Content-Length"), "{status}");
        }
        assert!(encode(&ResponseHead::new(599), 0, false, false).starts_with("HTTP/1.1 599 \r\n"));
    }

    #[test]
    fn rejects_unsafe_headers() {
        let bad = [
            ResponseHead::new(200).with_header("X", "a\r\nSet-Cookie: x"),
            ResponseHead::new(200).with_header("X", "a\nb"),
            ResponseHead::new(200).with_header("X", "a\0b"),
            ResponseHead::new(200).with_header("X Y", "v"),
            ResponseHead::new(200).with_header("", "v"),
            ResponseHead::new(200).with_header("content-length", "1"),
            ResponseHead::new(200).with_header("Connection", "close"),
            ResponseHead::new(99),
            ResponseHead::new(1000),
        ];
        for head in &bad {
            let mut out = b"kept".to_vec();
            let framing = FramingFields {
                content_length_bytes: Some(0),
                close: false,
                announce_keep_alive: false,
                date: b"",
            };
            assert!(
                matches!(
                    encode_head(&mut out, head, &framing),
                    Err(HttpError::InvalidResponse(_))
                ),
                "{head:?}"
            );
            assert_eq!(out, b"kept");
        }
        let fine = ResponseHead::new(200).with_header("x-amz-meta-a", "tab\there é");
        assert!(encode(&fine, 0, false, false).contains("x-amz-meta-a: tab\there é\r\n"));
    }
}
