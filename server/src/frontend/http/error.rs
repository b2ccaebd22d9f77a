//! Errors of the HTTP/1.1 connection layer and the reply each one maps to.

/// Why reading or writing an HTTP/1.1 exchange failed.
///
/// After any error from the read side the request stream is out of sync:
/// the caller replies (when [`HttpError::should_reply`]) with
/// `Connection: close` and drops the connection.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The socket failed; nothing more can be sent.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer was too slow while a request (head or body) was in progress,
    /// or stopped reading our response.
    #[error("timed out")]
    Timeout,
    /// No request started within the idle timeout; close quietly (a 408 here
    /// would race with a request the client may be sending right now).
    #[error("idle connection timed out")]
    IdleTimeout,
    /// The request head exceeded `Limits::head_bytes_max`.
    #[error("request head too large")]
    HeadTooLarge,
    /// The request had more than `Limits::headers_count_max` header fields.
    #[error("too many request header fields")]
    TooManyHeaders,
    /// The request violates HTTP/1.1 syntax or framing rules.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// The request line names an HTTP version other than 1.0 or 1.1.
    #[error("HTTP version not supported")]
    VersionNotSupported,
    /// The request uses a transfer-coding we do not implement.
    #[error("transfer-coding not implemented")]
    NotImplemented,
    /// The peer closed the connection in the middle of a request; any body
    /// read so far is incomplete and must not be stored.
    #[error("unexpected end of stream")]
    UnexpectedEof,
    /// More body than we are willing to read (or discard).
    #[error("request body too large")]
    BodyTooLarge,
    /// The caller handed us a response header that cannot be sent safely
    /// (CR/LF injection, invalid name). Nothing was written.
    #[error("invalid response header: {0}")]
    InvalidResponse(&'static str),
}

impl HttpError {
    /// The status code to reply with, where [`HttpError::should_reply`] is true.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::Timeout | HttpError::IdleTimeout => 408,
            HttpError::HeadTooLarge | HttpError::TooManyHeaders => 431,
            HttpError::VersionNotSupported => 505,
            HttpError::NotImplemented => 501,
            HttpError::BodyTooLarge => 413,
            HttpError::InvalidResponse(_) => 500,
            HttpError::BadRequest(_) | HttpError::Io(_) | HttpError::UnexpectedEof => 400,
        }
    }

    /// False when the connection is dead or idle, so no reply can or should be
    /// sent.
    pub fn should_reply(&self) -> bool {
        !matches!(
            self,
            HttpError::Io(_) | HttpError::UnexpectedEof | HttpError::IdleTimeout
        )
    }
}
