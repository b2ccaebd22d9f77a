//! One HTTP/1.1 server connection: request heads, request bodies, response
//! heads and bodies over any async byte stream, with bounded memory and
//! timeouts on every wait.

use std::io;
use std::time::{Duration, Instant};

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::body::{BodyState, Step};
use super::date::DateCache;
use super::head::{next_head, BodyFraming, Limits, RequestHead};
use super::response::{encode_head, FramingFields, ResponseHead};
use super::timeout::within;
use super::HttpError;

/// Read-buffer room beyond the head limit, for body bytes that arrive with
/// the head and for chunk framing. The buffer never grows past
/// `head_bytes_max + BODY_WINDOW_BYTES`.
pub const BODY_WINDOW_BYTES: usize = 256 * 1024;
/// `discard_body` reads at most this much; a larger unread body costs more
/// than a new connection, so the caller closes instead.
pub const DISCARD_BODY_BYTES_MAX: u64 = 1024 * 1024;
/// `discard_body` reads at most this many bytes off the wire, chunk framing
/// included: a chunked body of 1-byte chunks with long extensions carries
/// kilobytes of framing per byte of data.
pub const DISCARD_WIRE_BYTES_MAX: u64 = 2 * DISCARD_BODY_BYTES_MAX;
/// Responses whose head and body fit in this go out in one write.
pub const WRITE_COALESCE_BYTES: usize = 16 * 1024;
const READ_BUF_INITIAL_BYTES: usize = 8 * 1024;
/// Body reads at least this large bypass the read buffer (no extra copy).
const DIRECT_READ_MIN_BYTES: usize = 16 * 1024;
const CONTINUE_LINE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
/// Timeouts are clamped to a day: longer is "never" in practice, and
/// `Instant + Duration` must not overflow.
const TIMEOUT_MS_MAX: u64 = 24 * 3600 * 1000;

/// Server side of one HTTP/1.x connection.
///
/// Usage per request: `read_head`, then `read_body` until it returns 0 (or
/// `discard_body`), then `write_response` + `write_body` + `flush`. After an
/// error from the read side the connection is out of sync: reply if
/// [`HttpError::should_reply`] with `close = true`, then drop it.
pub struct HttpConn<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// Whether SEND_ZC is still worth trying on this socket: cleared once
    /// the kernel reports a zero-copy send as copied (see `DataRing::send`).
    pub send_zc: bool,
    stream: S,
    limits: Limits,
    rbuf: super::buf::ReadBuf,
    wbuf: Vec<u8>,
    body: BodyState,
    /// `read_body` or `discard_body` ran for the current request, so
    /// `start_body` must not re-arm (that would restart a finished body).
    body_started: bool,
    /// The client asked for `100 Continue`, has sent no body byte yet, and
    /// we have not answered.
    continue_pending: bool,
    /// Version of the current request, for `Connection: keep-alive` on 1.0.
    request_version_minor: u8,
    /// A read-side error left the stream out of sync.
    read_failed: bool,
    date: DateCache,
    /// For metrics and access logs: the last status written, and body
    /// bytes read and written over the connection's life.
    pub last_status: u16,
    /// Headers added to every response to the current request (CORS),
    /// cleared when the next request's head is read.
    pub extra_headers: Vec<(std::borrow::Cow<'static, str>, String)>,
    pub body_bytes_read: u64,
    pub body_bytes_written: u64,
}

impl<S> HttpConn<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    pub fn new(stream: S, limits: Limits) -> Self {
        let capacity_max_bytes = limits
            .head_bytes_max
            .max(1)
            .saturating_add(BODY_WINDOW_BYTES);
        HttpConn {
            send_zc: true,
            stream,
            rbuf: super::buf::ReadBuf::new(READ_BUF_INITIAL_BYTES, capacity_max_bytes),
            limits,
            wbuf: Vec::new(),
            body: BodyState::Empty,
            body_started: false,
            continue_pending: false,
            request_version_minor: 1,
            read_failed: false,
            date: DateCache::default(),
            last_status: 0,
            extra_headers: Vec::new(),
            body_bytes_read: 0,
            body_bytes_written: 0,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The stream, e.g. to send a file zero-copy after `write_response` and
    /// `flush`. Bytes already buffered for reading stay here.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Bytes received but not yet consumed (the rest of a body, pipelined
    /// requests).
    pub fn buffered(&self) -> &[u8] {
        self.rbuf.data()
    }

    /// The stream; unflushed response bytes and buffered request bytes are
    /// dropped (see `into_parts`).
    pub fn into_inner(self) -> S {
        self.into_parts().0
    }

    /// The stream and the buffered request bytes not consumed yet.
    pub fn into_parts(self) -> (S, Vec<u8>) {
        debug_assert!(self.wbuf.is_empty(), "flush() before into_parts()");
        (self.stream, self.rbuf.into_unread())
    }

    #[cfg(test)]
    pub(crate) fn read_buf_allocated_bytes(&self) -> usize {
        self.rbuf.allocated_bytes()
    }

    // ---- request heads ----

    /// The next request head; Ok(None) when the peer closed cleanly between
    /// requests (or an earlier request left the stream unusable). Any unread
    /// body of the previous request is discarded first.
    pub async fn read_head(&mut self) -> Result<Option<RequestHead>, HttpError> {
        self.extra_headers.clear();
        if !self.read_failed && !self.body.is_finished() && self.discard_body().await.is_err() {
            self.read_failed = true;
        }
        if self.read_failed {
            return Ok(None);
        }
        let result = self.read_head_unguarded().await;
        if result.is_err() {
            self.read_failed = true;
        }
        result
    }

    async fn read_head_unguarded(&mut self) -> Result<Option<RequestHead>, HttpError> {
        let header_timeout = timeout_duration(self.limits.header_timeout_ms);
        let idle_timeout = timeout_duration(self.limits.idle_timeout_ms);
        // The header clock starts with the first byte of the request.
        let mut deadline = (!self.rbuf.is_empty()).then(|| Instant::now() + header_timeout);
        let mut scan_from = 0usize;
        loop {
            if let Some(head) = self.try_parse_head(&mut scan_from)? {
                self.start_request(&head)?;
                return Ok(Some(head));
            }
            if self.rbuf.len() >= self.limits.head_bytes_max {
                return Err(HttpError::HeadTooLarge);
            }
            let wait = match deadline {
                None => idle_timeout,
                Some(at) => at.saturating_duration_since(Instant::now()),
            };
            let spare = self.rbuf.spare_mut();
            debug_assert!(!spare.is_empty(), "buffer bound exceeds head bound");
            let read_bytes = match within(wait, self.stream.read(spare)).await {
                Some(result) => result?,
                None if deadline.is_none() => return Err(HttpError::IdleTimeout),
                None => return Err(HttpError::Timeout),
            };
            if read_bytes == 0 {
                return self.eof_between_requests();
            }
            self.rbuf.commit(read_bytes);
            // A request line starts with a method token (after optional
            // blank lines): fail other bytes (a TLS handshake, binary junk)
            // at once instead of waiting out the header timeout.
            if let Some(&first) = self
                .rbuf
                .data()
                .iter()
                .find(|b| !matches!(b, b'\r' | b'\n'))
            {
                if !first.is_ascii_alphabetic() {
                    return Err(HttpError::BadRequest("not an HTTP request"));
                }
            }
            deadline.get_or_insert_with(|| Instant::now() + header_timeout);
        }
    }

    /// Parses a complete head from the buffer if one is there.
    fn try_parse_head(&mut self, scan_from: &mut usize) -> Result<Option<RequestHead>, HttpError> {
        let window_bytes = self.rbuf.len().min(self.limits.head_bytes_max);
        let window = &self.rbuf.data()[..window_bytes];
        let Some((head, head_bytes)) = next_head(window, scan_from, &self.limits)? else {
            return Ok(None);
        };
        self.rbuf.consume(head_bytes);
        Ok(Some(head))
    }

    fn eof_between_requests(&self) -> Result<Option<RequestHead>, HttpError> {
        // Stray CRLFs between requests are allowed (RFC 9112 2.2).
        if self.rbuf.data().iter().all(|&b| b == b'\r' || b == b'\n') {
            Ok(None)
        } else {
            Err(HttpError::UnexpectedEof)
        }
    }

    /// Arms the body decoder for a freshly read head.
    fn start_request(&mut self, head: &RequestHead) -> Result<(), HttpError> {
        let framing = head.body_framing()?;
        self.request_version_minor = head.version_minor;
        self.arm_body(framing);
        self.continue_pending =
            head.expects_continue() && framing != BodyFraming::Empty && self.rbuf.is_empty();
        Ok(())
    }

    fn arm_body(&mut self, framing: BodyFraming) {
        let capacity_bound_bytes = self.limits.head_bytes_max.saturating_add(BODY_WINDOW_BYTES);
        // A chunk line must fit in the buffer to be seen whole.
        let line_bytes_max = self
            .limits
            .chunk_line_bytes_max
            .min(capacity_bound_bytes - 2);
        self.body = BodyState::new(framing, line_bytes_max, self.limits.head_bytes_max);
        self.body_started = false;
    }

    // ---- request bodies ----

    /// Arms body reading for `head`. `read_head` already does this, so this
    /// is only needed for a head that did not come from `read_head`; it is a
    /// no-op once `read_body` or `discard_body` ran for the current request.
    pub fn start_body(&mut self, head: &RequestHead) -> Result<(), HttpError> {
        let framing = head.body_framing()?;
        if self.body_started {
            return Ok(());
        }
        self.arm_body(framing);
        Ok(())
    }

    /// True once the current request's body has been read to its end.
    pub fn body_finished(&self) -> bool {
        self.body.is_finished()
    }

    /// Whether `discard_body` can bring the connection back in sync after an
    /// early reply. Decide `close` with this before writing that reply.
    pub fn body_discardable(&self) -> bool {
        if self.read_failed {
            return false;
        }
        if self.body.is_finished() {
            return true;
        }
        // A client still waiting for 100 Continue may or may not send the
        // body after our final reply; only closing is unambiguous.
        if self.continue_pending {
            return false;
        }
        match self.body {
            BodyState::Length { remaining_bytes } => remaining_bytes <= DISCARD_BODY_BYTES_MAX,
            _ => true,
        }
    }

    /// Reads body bytes into `out` (which must not be empty); Ok(0) at the
    /// end of the body. Err(UnexpectedEof) when the peer closed early: the
    /// body is incomplete and must not be stored.
    pub async fn read_body(&mut self, out: &mut [u8]) -> Result<usize, HttpError> {
        if out.is_empty() {
            // Ok(0) would read as "end of body" and truncate an object.
            debug_assert!(false, "read_body with an empty buffer");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty read buffer").into());
        }
        if self.read_failed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "connection unusable").into());
        }
        self.body_started = true;
        let result = self.read_body_unguarded(out).await;
        match &result {
            Ok(n) => self.body_bytes_read += *n as u64,
            Err(_) => self.read_failed = true,
        }
        result
    }

    async fn read_body_unguarded(&mut self, out: &mut [u8]) -> Result<usize, HttpError> {
        loop {
            match self.body.step(self.rbuf.data())? {
                Step::Framing { consumed_bytes } => self.rbuf.consume(consumed_bytes),
                Step::NeedMore => self.fill().await?,
                Step::Done { consumed_bytes } => {
                    self.rbuf.consume(consumed_bytes);
                    self.body = BodyState::Empty;
                    return Ok(0);
                }
                Step::Data { remaining_bytes } => {
                    let read_bytes = self.read_data(out, remaining_bytes).await?;
                    debug_assert!(read_bytes > 0 && read_bytes as u64 <= remaining_bytes);
                    self.body.data_consumed(read_bytes);
                    self.continue_pending = false;
                    return Ok(read_bytes);
                }
            }
        }
    }

    /// Up to `remaining_bytes` of body data into `out`; never 0.
    async fn read_data(
        &mut self,
        out: &mut [u8],
        remaining_bytes: u64,
    ) -> Result<usize, HttpError> {
        let limit_bytes = clamp_to_usize(remaining_bytes).min(out.len());
        if self.rbuf.is_empty() && limit_bytes >= DIRECT_READ_MIN_BYTES {
            // Large reads go straight to the caller's buffer: no copy, and
            // never past the body, so pipelined bytes stay in the stream.
            return self.read_stream(&mut out[..limit_bytes]).await;
        }
        if self.rbuf.is_empty() {
            self.fill().await?;
        }
        let copied_bytes = limit_bytes.min(self.rbuf.len());
        out[..copied_bytes].copy_from_slice(&self.rbuf.data()[..copied_bytes]);
        self.rbuf.consume(copied_bytes);
        Ok(copied_bytes)
    }

    /// Reads more body bytes into the buffer; EOF is an error here.
    async fn fill(&mut self) -> Result<(), HttpError> {
        let wait = timeout_duration(self.limits.body_timeout_ms);
        let spare = self.rbuf.spare_mut();
        if spare.is_empty() {
            // Decoder lines are bounded below the buffer bound.
            debug_assert!(false, "read buffer full while decoding a body");
            return Err(HttpError::BadRequest("chunk line too long"));
        }
        let read_bytes = read_some(&mut self.stream, spare, wait).await?;
        self.rbuf.commit(read_bytes);
        Ok(())
    }

    async fn read_stream(&mut self, out: &mut [u8]) -> Result<usize, HttpError> {
        let wait = timeout_duration(self.limits.body_timeout_ms);
        read_some(&mut self.stream, out, wait).await
    }

    /// Reads and drops the rest of the current body, up to
    /// `DISCARD_BODY_BYTES_MAX` of data and `DISCARD_WIRE_BYTES_MAX` on the
    /// wire, within `header_timeout_ms` in all (a body nobody wants gets no
    /// more time than a request head: without a total deadline a client
    /// trickling a byte just inside the body timeout would hold the
    /// connection for days). On error the caller must close.
    pub async fn discard_body(&mut self) -> Result<(), HttpError> {
        if !self.body_discardable() {
            self.read_failed = true;
            return Err(HttpError::BodyTooLarge);
        }
        self.body_started = true;
        let result = self.discard_body_unguarded().await;
        if result.is_err() {
            self.read_failed = true;
        }
        result
    }

    async fn discard_body_unguarded(&mut self) -> Result<(), HttpError> {
        // Dropping the discard mid-way leaves the stream out of sync; the
        // caller marks the connection failed on any error.
        let deadline = timeout_duration(self.limits.header_timeout_ms);
        match within(deadline, self.discard_body_bounded()).await {
            Some(result) => result,
            None => Err(HttpError::Timeout),
        }
    }

    async fn discard_body_bounded(&mut self) -> Result<(), HttpError> {
        let mut discarded_bytes = 0u64;
        let mut wire_bytes = 0u64;
        loop {
            if wire_bytes > DISCARD_WIRE_BYTES_MAX {
                return Err(HttpError::BodyTooLarge);
            }
            match self.body.step(self.rbuf.data())? {
                Step::Framing { consumed_bytes } => {
                    self.rbuf.consume(consumed_bytes);
                    wire_bytes += consumed_bytes as u64;
                }
                Step::NeedMore => self.fill().await?,
                Step::Done { consumed_bytes } => {
                    self.rbuf.consume(consumed_bytes);
                    self.body = BodyState::Empty;
                    return Ok(());
                }
                Step::Data { remaining_bytes } => {
                    if self.rbuf.is_empty() {
                        self.fill().await?;
                    }
                    let dropped_bytes = clamp_to_usize(remaining_bytes).min(self.rbuf.len());
                    self.rbuf.consume(dropped_bytes);
                    self.body.data_consumed(dropped_bytes);
                    discarded_bytes += dropped_bytes as u64;
                    wire_bytes += dropped_bytes as u64;
                    if discarded_bytes > DISCARD_BODY_BYTES_MAX {
                        return Err(HttpError::BodyTooLarge);
                    }
                }
            }
        }
    }

    // ---- responses ----

    /// Sends `100 Continue` now (a no-op for HTTP/1.0 requests, whose
    /// clients do not understand 1xx).
    pub async fn send_continue(&mut self) -> Result<(), HttpError> {
        self.continue_pending = false;
        if self.request_version_minor == 0 {
            return Ok(());
        }
        self.wbuf.extend_from_slice(CONTINUE_LINE);
        self.flush().await
    }

    /// Buffers a response head (nothing is sent until the buffer fills or
    /// `flush`). Adds `Date`, `Server`, `Content-Length` (except for
    /// 1xx/204/304) and `Connection: close` when `close`.
    pub async fn write_response(
        &mut self,
        head: &ResponseHead,
        content_length: u64,
        close: bool,
    ) -> Result<(), HttpError> {
        let framing = FramingFields {
            content_length_bytes: Some(content_length),
            close,
            announce_keep_alive: self.request_version_minor == 0,
            date: self.date.now(),
        };
        let head = Self::with_extra(&self.extra_headers, head);
        encode_head(&mut self.wbuf, &head, &framing)?;
        self.last_status = head.status;
        if self.wbuf.len() >= WRITE_COALESCE_BYTES {
            self.write_buffered().await?;
        }
        Ok(())
    }

    /// Buffers the head of a response whose body follows in chunks
    /// (`Transfer-Encoding: chunked`: its length is not known up front);
    /// the body is `write_chunk` calls, then `finish_chunks`. HTTP/1.1
    /// requests only (a 1.0 client cannot parse chunks).
    pub async fn write_response_chunked(&mut self, head: &ResponseHead) -> Result<(), HttpError> {
        debug_assert!(self.request_version_minor >= 1);
        let framing = FramingFields {
            content_length_bytes: None,
            close: false,
            announce_keep_alive: false,
            date: self.date.now(),
        };
        let head = Self::with_extra(&self.extra_headers, head);
        encode_head(&mut self.wbuf, &head, &framing)?;
        self.last_status = head.status;
        Ok(())
    }

    /// `head` plus `extra` (borrowed as is when there are none).
    fn with_extra<'h>(
        extra: &[(std::borrow::Cow<'static, str>, String)],
        head: &'h ResponseHead,
    ) -> std::borrow::Cow<'h, ResponseHead> {
        if extra.is_empty() {
            return std::borrow::Cow::Borrowed(head);
        }
        let mut h = head.clone();
        h.headers.extend(extra.iter().cloned());
        std::borrow::Cow::Owned(h)
    }

    /// Whether the request was HTTP/1.1 or later (chunked responses).
    pub fn request_is_http11(&self) -> bool {
        self.request_version_minor >= 1
    }

    /// One chunk of a chunked body (nothing for empty `bytes`: an empty
    /// chunk would end the body).
    pub async fn write_chunk(&mut self, bytes: &[u8]) -> Result<(), HttpError>
    where
        S: std::os::fd::AsRawFd,
    {
        if bytes.is_empty() {
            return Ok(());
        }
        let line = format!("{:x}\r\n", bytes.len());
        self.write_body(line.as_bytes()).await?;
        self.write_body_direct(bytes).await?;
        self.write_body(b"\r\n").await
    }

    /// Ends a chunked body and sends what is buffered.
    pub async fn finish_chunks(&mut self) -> Result<(), HttpError> {
        self.write_body(b"0\r\n\r\n").await?;
        self.flush().await
    }

    /// Response body bytes; small ones are coalesced with the head.
    pub async fn write_body(&mut self, bytes: &[u8]) -> Result<(), HttpError> {
        self.body_bytes_written += bytes.len() as u64;
        if self.wbuf.len() + bytes.len() <= WRITE_COALESCE_BYTES {
            self.wbuf.extend_from_slice(bytes);
            return Ok(());
        }
        self.write_buffered().await?;
        if bytes.len() < WRITE_COALESCE_BYTES {
            self.wbuf.extend_from_slice(bytes);
            return Ok(());
        }
        let wait = timeout_duration(self.limits.body_timeout_ms);
        write_all_within(&mut self.stream, bytes, wait).await
    }

    /// Sends everything buffered and flushes the stream.
    pub async fn flush(&mut self) -> Result<(), HttpError> {
        self.write_buffered().await?;
        let wait = timeout_duration(self.limits.body_timeout_ms);
        match within(wait, self.stream.flush()).await {
            Some(result) => Ok(result?),
            None => Err(HttpError::Timeout),
        }
    }

    async fn write_buffered(&mut self) -> Result<(), HttpError> {
        let wait = timeout_duration(self.limits.body_timeout_ms);
        let result = write_all_within(&mut self.stream, &self.wbuf, wait).await;
        self.wbuf.clear();
        // One huge head must not pin its allocation for the connection's life.
        if self.wbuf.capacity() > 4 * WRITE_COALESCE_BYTES {
            self.wbuf.shrink_to(WRITE_COALESCE_BYTES);
        }
        result
    }
}

/// Bodies smaller than this are copied behind the buffered head (one
/// small copy is cheaper than a vectored send).
const DIRECT_BODY_MIN_BYTES: usize = 2 * 1024;

impl<S> HttpConn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + std::os::fd::AsRawFd,
{
    /// Like `write_body`, for a body that stays in the caller's buffer: the
    /// buffered head and `bytes` leave in one `sendmsg` (no copy into the
    /// write buffer, one syscall and one wake-up of the peer instead of
    /// two); what the socket does not take at once is written as usual,
    /// within the body timeout.
    pub async fn write_body_direct(&mut self, bytes: &[u8]) -> Result<(), HttpError> {
        if bytes.len() < DIRECT_BODY_MIN_BYTES {
            return self.write_body(bytes).await;
        }
        self.body_bytes_written += bytes.len() as u64;
        let fd = self.stream.as_raw_fd();
        let sent = match crate::frontend::datapath::send_pair_nonblocking(fd, &self.wbuf, bytes) {
            Ok(n) => n,
            Err(e) => {
                self.wbuf.clear();
                return Err(e.into());
            }
        };
        let head_sent = sent.min(self.wbuf.len());
        let body_sent = sent - head_sent;
        let wait = timeout_duration(self.limits.body_timeout_ms);
        if head_sent < self.wbuf.len() {
            let result = write_all_within(&mut self.stream, &self.wbuf[head_sent..], wait).await;
            self.wbuf.clear();
            result?;
        }
        self.wbuf.clear();
        write_all_within(&mut self.stream, &bytes[body_sent..], wait).await
    }
}

/// One read of at least a byte; EOF and stalls are errors (mid-request).
async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    out: &mut [u8],
    wait: Duration,
) -> Result<usize, HttpError> {
    debug_assert!(!out.is_empty());
    match within(wait, stream.read(out)).await {
        None => Err(HttpError::Timeout),
        Some(Err(e)) => Err(e.into()),
        Some(Ok(0)) => Err(HttpError::UnexpectedEof),
        Some(Ok(read_bytes)) => Ok(read_bytes),
    }
}

/// Writes all of `bytes`, failing if any single write stalls past `wait`.
async fn write_all_within<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut bytes: &[u8],
    wait: Duration,
) -> Result<(), HttpError> {
    while !bytes.is_empty() {
        match within(wait, stream.write(bytes)).await {
            None => return Err(HttpError::Timeout),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(0)) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
            Some(Ok(written_bytes)) => bytes = &bytes[written_bytes.min(bytes.len())..],
        }
    }
    Ok(())
}

fn timeout_duration(timeout_ms: u64) -> Duration {
    Duration::from_millis(timeout_ms.min(TIMEOUT_MS_MAX))
}

fn clamp_to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}
