//! Connection tests: real loopback sockets between a glommio executor (the
//! server side) and a std client thread, plus a scripted stream where exact
//! read sizes or write counts matter.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use glommio::net::{TcpListener, TcpStream};
use glommio::{LocalExecutor, LocalExecutorBuilder};

use super::*;

type Conn = HttpConn<TcpStream>;
type Client = Box<dyn FnOnce(std::net::TcpStream) -> Vec<u8> + Send>;

/// Bounds every client read so a broken server fails the test, not hangs it.
const CLIENT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `server` on one accepted connection in a glommio executor while
/// `client` drives a std socket from another thread. Returns both results.
fn exchange<T, F, Fut>(limits: Limits, client: Client, server: F) -> (T, Vec<u8>)
where
    F: FnOnce(Conn) -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let executor = LocalExecutorBuilder::default()
        .spawn(move || async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client_thread = std::thread::spawn(move || {
                let stream = std::net::TcpStream::connect(addr).unwrap();
                stream.set_read_timeout(Some(CLIENT_READ_TIMEOUT)).unwrap();
                stream.set_nodelay(true).unwrap();
                client(stream)
            });
            let stream = listener.accept().await.unwrap();
            // The connection is dropped (and closed) when `server` returns.
            let result = server(HttpConn::new(stream, limits)).await;
            (result, client_thread)
        })
        .unwrap();
    let (result, client_thread) = executor.join().unwrap();
    (result, client_thread.join().unwrap())
}

/// Reads until EOF; a reset (the server closing with unread input) or a
/// timeout ends the read too, the test then judges what arrived.
fn read_all(stream: &mut std::net::TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return received,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Sends `request` in one write, half-closes, reads the replies.
fn send(request: impl Into<Vec<u8>>) -> Client {
    let request = request.into();
    Box::new(move |mut stream| {
        stream.write_all(&request).unwrap();
        let _ = stream.shutdown(Shutdown::Write);
        read_all(&mut stream)
    })
}

/// Sends `request` one byte per write with a pause, so the server sees
/// many partial reads.
fn trickle(request: impl Into<Vec<u8>>) -> Client {
    let request = request.into();
    Box::new(move |mut stream| {
        for byte in &request {
            stream.write_all(std::slice::from_ref(byte)).unwrap();
            std::thread::sleep(Duration::from_micros(300));
        }
        let _ = stream.shutdown(Shutdown::Write);
        read_all(&mut stream)
    })
}

/// Sends `request`, then keeps the connection open for `hold`.
fn send_and_hold(request: impl Into<Vec<u8>>, hold: Duration) -> Client {
    let request = request.into();
    Box::new(move |mut stream| {
        stream.write_all(&request).unwrap();
        std::thread::sleep(hold);
        Vec::new()
    })
}

/// Reads the whole body of the current request with `out_bytes` reads.
async fn read_body_all(conn: &mut Conn, out_bytes: usize) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    let mut out = vec![0u8; out_bytes];
    loop {
        let n = conn.read_body(&mut out).await?;
        if n == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&out[..n]);
    }
}

async fn reply(conn: &mut Conn, status: u16, body: &[u8], close: bool) {
    conn.write_response(&ResponseHead::new(status), body.len() as u64, close)
        .await
        .unwrap();
    conn.write_body(body).await.unwrap();
    conn.flush().await.unwrap();
}

/// The error `read_head` gives for `request`, with the reply written.
fn head_error(limits: Limits, request: impl Into<Vec<u8>>) -> (HttpError, Vec<u8>) {
    exchange(limits, send(request), |mut conn| async move {
        let error = conn.read_head().await.unwrap_err();
        if error.should_reply() {
            reply(&mut conn, error.status(), b"", true).await;
        }
        error
    })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn body_pattern(len_bytes: usize) -> Vec<u8> {
    (0..len_bytes).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn simple_get() {
    let request =
        "GET /bucket/key%20a?list-type=2&x= HTTP/1.1\r\nHost: localhost\r\nX-Amz-Date: 1\r\n\r\n";
    let (head, response) = exchange(Limits::default(), send(request), |mut conn| async move {
        let head = conn.read_head().await.unwrap().unwrap();
        assert!(conn.body_finished());
        let mut out = [0u8; 16];
        assert_eq!(conn.read_body(&mut out).await.unwrap(), 0);
        let reply_head = ResponseHead::new(200).with_header("ETag", "\"e\"");
        conn.write_response(&reply_head, 5, false).await.unwrap();
        conn.write_body(b"hello").await.unwrap();
        conn.flush().await.unwrap();
        assert!(conn.read_head().await.unwrap().is_none(), "clean EOF");
        head
    });
    assert_eq!(head.method, "GET");
    assert_eq!(head.path, "/bucket/key%20a");
    assert_eq!(head.query, "list-type=2&x=");
    assert_eq!(head.version_minor, 1);
    assert_eq!(head.header_str("x-amz-date"), Some("1"));
    assert!(head.keep_alive());
    let response = text(&response);
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\nServer: percore\r\n"));
    assert!(response.contains("\r\nETag: \"e\"\r\n"));
    assert!(response.contains("\r\nContent-Length: 5\r\n"));
    assert!(!response.contains("Connection:"));
    assert!(response.ends_with("\r\n\r\nhello"));
    let date_line = response.lines().find(|l| l.starts_with("Date: ")).unwrap();
    assert_eq!(date_line.len(), "Date: ".len() + 29);
    assert!(date_line.ends_with(" GMT"));
}

#[test]
fn pipelined_requests_in_one_write() {
    let requests = "GET /one HTTP/1.1\r\nHost: h\r\n\r\n\
                    PUT /two HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc\
                    GET /three HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    let (paths, response) = exchange(Limits::default(), send(requests), |mut conn| async move {
        let mut paths = Vec::new();
        while let Some(head) = conn.read_head().await.unwrap() {
            let body = read_body_all(&mut conn, 64).await.unwrap();
            let echo = format!("{}:{}", head.path, text(&body));
            reply(&mut conn, 200, echo.as_bytes(), !head.keep_alive()).await;
            let keep_alive = head.keep_alive();
            paths.push(head.path);
            if !keep_alive {
                break;
            }
        }
        paths
    });
    assert_eq!(paths, ["/one", "/two", "/three"]);
    let response = text(&response);
    assert_eq!(
        response.matches("HTTP/1.1 200 OK\r\n").count(),
        3,
        "{response}"
    );
    let one = response.find("\r\n\r\n/one:").unwrap();
    let two = response.find("\r\n\r\n/two:abc").unwrap();
    let three = response.find("Connection: close\r\n\r\n/three:").unwrap();
    assert!(one < two && two < three);
}

#[test]
fn head_and_body_one_byte_at_a_time() {
    let request =
        "PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nX-Long: abcdefghij\r\n\r\nbody";
    let ((head, body), _) = exchange(Limits::default(), trickle(request), |mut conn| async move {
        let head = conn.read_head().await.unwrap().unwrap();
        let body = read_body_all(&mut conn, 3).await.unwrap();
        assert!(conn.read_head().await.unwrap().is_none());
        (head, body)
    });
    assert_eq!(head.header_str("x-long"), Some("abcdefghij"));
    assert_eq!(head.content_length().unwrap(), Some(4));
    assert_eq!(body, b"body");
}

#[test]
fn content_length_body_small_and_large_reads() {
    for out_bytes in [1000, 64 * 1024] {
        let body = body_pattern(700_000);
        let mut request = format!(
            "PUT /big HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        request.extend_from_slice(b"GET /after HTTP/1.1\r\n\r\n");
        let (received, response) = exchange(
            Limits::default(),
            send(request),
            move |mut conn| async move {
                conn.read_head().await.unwrap().unwrap();
                let received = read_body_all(&mut conn, out_bytes).await.unwrap();
                assert!(conn.read_buf_allocated_bytes() <= 16 * 1024 + BODY_WINDOW_BYTES);
                reply(&mut conn, 200, b"", false).await;
                let next = conn.read_head().await.unwrap().unwrap();
                assert_eq!(next.path, "/after");
                received
            },
        );
        assert!(received == body, "body differs for reads of {out_bytes}");
        assert!(text(&response).starts_with("HTTP/1.1 200 OK"));
    }
}

const CHUNKED_REQUEST: &str = "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
     5;name=value\r\nhello\r\n\
     6 ; a=\"b c\";d\r\n world\r\n\
     1A\r\nabcdefghijklmnopqrstuvwxyz\r\n\
     0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n\
     GET /next HTTP/1.1\r\nHost: h\r\n\r\n";
const CHUNKED_BODY: &[u8] = b"hello worldabcdefghijklmnopqrstuvwxyz";

async fn read_chunked_then_next(mut conn: Conn) -> (Vec<u8>, String) {
    let head = conn.read_head().await.unwrap().unwrap();
    assert!(head.is_chunked().unwrap());
    let body = read_body_all(&mut conn, 7).await.unwrap();
    let next = conn.read_head().await.unwrap().unwrap();
    (body, next.path)
}

#[test]
fn chunked_body_with_extensions_and_trailers() {
    let ((body, next), _) = exchange(
        Limits::default(),
        send(CHUNKED_REQUEST),
        read_chunked_then_next,
    );
    assert_eq!(body, CHUNKED_BODY);
    assert_eq!(next, "/next");
}

#[test]
fn chunked_body_one_byte_at_a_time() {
    let ((body, next), _) = exchange(
        Limits::default(),
        trickle(CHUNKED_REQUEST),
        read_chunked_then_next,
    );
    assert_eq!(body, CHUNKED_BODY);
    assert_eq!(next, "/next");
}

#[test]
fn early_eof_in_content_length_body() {
    let request = "PUT /k HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
    let ((received, error), _) =
        exchange(Limits::default(), send(request), |mut conn| async move {
            conn.read_head().await.unwrap().unwrap();
            let mut out = [0u8; 64];
            let mut received = Vec::new();
            let error = loop {
                match conn.read_body(&mut out).await {
                    Ok(0) => panic!("a truncated body must not end cleanly"),
                    Ok(n) => received.extend_from_slice(&out[..n]),
                    Err(e) => break e,
                }
            };
            assert!(conn.read_head().await.unwrap().is_none());
            (received, error)
        });
    assert_eq!(received, b"abc");
    assert!(matches!(error, HttpError::UnexpectedEof), "{error:?}");
    assert!(!error.should_reply());
}

#[test]
fn early_eof_in_chunked_body() {
    let request = "PUT /k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nab";
    let (error, _) = exchange(Limits::default(), send(request), |mut conn| async move {
        conn.read_head().await.unwrap().unwrap();
        read_body_all(&mut conn, 64).await.unwrap_err()
    });
    assert!(matches!(error, HttpError::UnexpectedEof), "{error:?}");
}

#[test]
fn oversized_head_is_431() {
    let request = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000));
    let (error, response) = head_error(Limits::default(), request);
    assert!(matches!(error, HttpError::HeadTooLarge), "{error:?}");
    assert_eq!(error.status(), 431);
    assert!(text(&response).starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
}

#[test]
fn head_size_limit_is_exact() {
    let limits = || Limits {
        head_bytes_max: 1024,
        ..Limits::default()
    };
    let head_of = |len_bytes: usize| {
        let fixed = "GET / HTTP/1.1\r\nX: \r\n\r\n".len();
        format!(
            "GET / HTTP/1.1\r\nX: {}\r\n\r\n",
            "v".repeat(len_bytes - fixed)
        )
    };
    let (fits, _) = exchange(limits(), send(head_of(1024)), |mut conn| async move {
        conn.read_head().await.map(|h| h.is_some())
    });
    assert!(fits.unwrap());
    let (error, _) = head_error(limits(), head_of(1025));
    assert!(matches!(error, HttpError::HeadTooLarge), "{error:?}");
}

#[test]
fn too_many_headers_is_431() {
    let headers =
        |count: usize| -> String { (0..count).map(|i| format!("X-{i}: v\r\n")).collect() };
    let (error, _) = head_error(
        Limits::default(),
        format!("GET / HTTP/1.1\r\n{}\r\n", headers(101)),
    );
    assert!(matches!(error, HttpError::TooManyHeaders), "{error:?}");
    assert_eq!(error.status(), 431);
    let request = format!("GET / HTTP/1.1\r\n{}\r\n", headers(100));
    let (head, _) = exchange(Limits::default(), send(request), |mut conn| async move {
        conn.read_head().await.unwrap().unwrap()
    });
    assert_eq!(head.headers.len(), 100);
}

#[test]
fn content_length_with_transfer_encoding_is_400() {
    let request =
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let (error, response) = head_error(Limits::default(), request);
    assert!(matches!(error, HttpError::BadRequest(_)), "{error:?}");
    let response = text(&response);
    assert!(
        response.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{response}"
    );
    assert!(response.contains("\r\nConnection: close\r\n"));
}

#[test]
fn unknown_transfer_coding_is_501() {
    let request = "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
    let (error, _) = head_error(Limits::default(), request);
    assert!(matches!(error, HttpError::NotImplemented), "{error:?}");
    assert_eq!(error.status(), 501);
}

#[test]
fn invalid_content_length_is_400() {
    for value in ["-1", "abc", "1, 2", "", "99999999999999999999"] {
        let request = format!("PUT / HTTP/1.1\r\nContent-Length: {value}\r\n\r\n");
        let (error, _) = head_error(Limits::default(), request);
        assert!(
            matches!(error, HttpError::BadRequest(_)),
            "{value:?}: {error:?}"
        );
    }
}

#[test]
fn http_2_is_505() {
    let (error, response) = head_error(Limits::default(), "GET / HTTP/2.0\r\nHost: h\r\n\r\n");
    assert!(matches!(error, HttpError::VersionNotSupported), "{error:?}");
    assert!(text(&response).starts_with("HTTP/1.1 505 HTTP Version Not Supported\r\n"));
    let (error, _) = head_error(Limits::default(), "GET / FTP/1.1\r\n\r\n");
    assert!(matches!(error, HttpError::BadRequest(_)), "{error:?}");
}

#[test]
fn eof_mid_head_is_unexpected() {
    let (error, _) = head_error(Limits::default(), "GET / HTTP/1.1\r\nHost:");
    assert!(matches!(error, HttpError::UnexpectedEof), "{error:?}");
}

fn short_timeouts() -> Limits {
    Limits {
        header_timeout_ms: 200,
        idle_timeout_ms: 200,
        ..Limits::default()
    }
}

/// Runs `read_head` against `client` and times it.
fn timed_head_error(client: Client) -> (HttpError, Duration) {
    let (result, _) = exchange(short_timeouts(), client, |mut conn| async move {
        let started = Instant::now();
        let error = conn.read_head().await.unwrap_err();
        (error, started.elapsed())
    });
    result
}

#[test]
fn header_timeout_on_half_a_head() {
    let client = send_and_hold("GET /slow HTTP/1.1\r\nHost:", Duration::from_millis(3000));
    let (error, elapsed) = timed_head_error(client);
    assert!(matches!(error, HttpError::Timeout), "{error:?}");
    assert!(error.should_reply() && error.status() == 408);
    assert!(elapsed >= Duration::from_millis(190), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
}

#[test]
fn header_timeout_is_not_reset_by_trickling_bytes() {
    let client: Client = Box::new(|mut stream| {
        for _ in 0..100 {
            if stream.write_all(b"X").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        Vec::new()
    });
    let (error, elapsed) = timed_head_error(client);
    assert!(matches!(error, HttpError::Timeout), "{error:?}");
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
}

#[test]
fn idle_timeout_returns() {
    let (error, elapsed) = timed_head_error(send_and_hold("", Duration::from_millis(3000)));
    assert!(matches!(error, HttpError::IdleTimeout), "{error:?}");
    assert!(!error.should_reply());
    assert!(elapsed >= Duration::from_millis(190), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
}

#[test]
fn expect_100_continue() {
    let client: Client = Box::new(|mut stream| {
        let head =
            b"PUT /k HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
        stream.write_all(head).unwrap();
        let mut interim = [0u8; 25];
        stream.read_exact(&mut interim).unwrap();
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        stream.write_all(b"hello").unwrap();
        let _ = stream.shutdown(Shutdown::Write);
        read_all(&mut stream)
    });
    let (body, response) = exchange(Limits::default(), client, |mut conn| async move {
        let head = conn.read_head().await.unwrap().unwrap();
        assert!(head.expects_continue());
        assert!(
            !conn.body_discardable(),
            "client waits for 100: only closing is safe"
        );
        conn.send_continue().await.unwrap();
        let body = read_body_all(&mut conn, 64).await.unwrap();
        reply(&mut conn, 200, b"", false).await;
        body
    });
    assert_eq!(body, b"hello");
    assert!(text(&response).starts_with("HTTP/1.1 200 OK\r\n"));
}

#[test]
fn start_body_after_read_head_is_harmless() {
    let requests = "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n\
                    PUT /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nok";
    let (bodies, _) = exchange(Limits::default(), send(requests), |mut conn| async move {
        let mut bodies = Vec::new();
        while let Some(head) = conn.read_head().await.unwrap() {
            conn.start_body(&head).unwrap();
            bodies.push(read_body_all(&mut conn, 64).await.unwrap());
            // Too late to re-arm: must not restart the finished body.
            conn.start_body(&head).unwrap();
            assert!(conn.body_finished());
        }
        bodies
    });
    assert_eq!(bodies, [b"".to_vec(), b"ok".to_vec()]);
}

#[test]
fn early_reply_then_discard_keeps_the_connection() {
    let requests = "PUT /denied HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789\
                    PUT /chunked HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
                    GET /next HTTP/1.1\r\n\r\n";
    let (paths, response) = exchange(Limits::default(), send(requests), |mut conn| async move {
        let mut paths = Vec::new();
        // First: explicit discard after the reply.
        let head = conn.read_head().await.unwrap().unwrap();
        assert!(conn.body_discardable());
        reply(&mut conn, 403, b"", false).await;
        conn.discard_body().await.unwrap();
        assert!(conn.body_finished());
        paths.push(head.path);
        // Second: body left unread; read_head discards it.
        let head = conn.read_head().await.unwrap().unwrap();
        reply(&mut conn, 403, b"", false).await;
        paths.push(head.path);
        paths.push(conn.read_head().await.unwrap().unwrap().path);
        paths
    });
    assert_eq!(paths, ["/denied", "/chunked", "/next"]);
    assert_eq!(
        text(&response)
            .matches("HTTP/1.1 403 Forbidden\r\n")
            .count(),
        2
    );
}

#[test]
fn discard_has_a_total_deadline() {
    // A body trickled a byte at a time, each byte well inside the body
    // timeout: the discard must still end at the (header) deadline instead
    // of following the client for as long as it keeps trickling.
    let limits = Limits {
        header_timeout_ms: 300,
        body_timeout_ms: 1_000,
        ..Limits::default()
    };
    let client: Client = Box::new(|mut stream| {
        let head = "PUT /denied HTTP/1.1\r\nContent-Length: 1000\r\n\r\n";
        if stream.write_all(head.as_bytes()).is_err() {
            return Vec::new();
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(4_000) {
            if stream.write_all(b"x").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Vec::new()
    });
    let ((result, elapsed), _) = exchange(limits, client, |mut conn| async move {
        conn.read_head().await.unwrap().unwrap();
        assert!(conn.body_discardable());
        let started = Instant::now();
        let result = conn.discard_body().await;
        (result, started.elapsed())
    });
    assert!(matches!(result, Err(HttpError::Timeout)), "{result:?}");
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(2_000), "{elapsed:?}");
}

#[test]
fn discard_bounds_chunk_framing_bytes() {
    // 1-byte chunks behind 3000-byte chunk extensions: 1000 data bytes, but
    // about 3 MB on the wire. The data bound alone never trips; the wire
    // bound does.
    let mut request = b"PUT /denied HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let extension = "x".repeat(3000);
    for _ in 0..1000 {
        request.extend_from_slice(format!("1;{extension}\r\na\r\n").as_bytes());
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let wire_bytes = request.len() as u64;
    assert!(wire_bytes > DISCARD_WIRE_BYTES_MAX);
    let client: Client = Box::new(move |mut stream| {
        // The server stops reading part-way; a failed write is expected.
        let _ = stream.write_all(&request);
        let _ = stream.shutdown(Shutdown::Write);
        read_all(&mut stream)
    });
    let (result, _) = exchange(Limits::default(), client, |mut conn| async move {
        conn.read_head().await.unwrap().unwrap();
        assert!(conn.body_discardable());
        conn.discard_body().await
    });
    assert!(matches!(result, Err(HttpError::BodyTooLarge)), "{result:?}");
}

#[test]
fn large_unread_body_is_not_discarded() {
    let request = "PUT /huge HTTP/1.1\r\nContent-Length: 10485760\r\n\r\nabc";
    let (after, _) = exchange(Limits::default(), send(request), |mut conn| async move {
        conn.read_head().await.unwrap().unwrap();
        assert!(!conn.body_discardable());
        let error = conn.discard_body().await.unwrap_err();
        assert!(matches!(error, HttpError::BodyTooLarge), "{error:?}");
        conn.read_head().await.unwrap()
    });
    assert!(
        after.is_none(),
        "an out-of-sync connection yields no more requests"
    );
}

#[test]
fn http_1_0_keep_alive_is_announced() {
    let requests = "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n";
    let (keep_alives, response) =
        exchange(Limits::default(), send(requests), |mut conn| async move {
            let first = conn.read_head().await.unwrap().unwrap();
            reply(&mut conn, 200, b"", !first.keep_alive()).await;
            let second = conn.read_head().await.unwrap().unwrap();
            reply(&mut conn, 200, b"", !second.keep_alive()).await;
            (first.keep_alive(), second.keep_alive())
        });
    assert_eq!(keep_alives, (true, false));
    let response = text(&response);
    let first_end = response.find("\r\n\r\n").unwrap();
    assert!(
        response[..first_end].contains("Connection: keep-alive"),
        "{response}"
    );
    assert!(
        response[first_end..].contains("Connection: close"),
        "{response}"
    );
}

#[test]
fn invalid_response_header_writes_nothing() {
    let (error, response) = exchange(
        Limits::default(),
        send("GET / HTTP/1.1\r\n\r\n"),
        |mut conn| async move {
            conn.read_head().await.unwrap().unwrap();
            let bad = ResponseHead::new(200).with_header("x-amz-meta-a", "v\r\nInjected: 1");
            let error = conn.write_response(&bad, 0, false).await.unwrap_err();
            reply(&mut conn, error.status(), b"", true).await;
            error
        },
    );
    assert!(matches!(error, HttpError::InvalidResponse(_)));
    let response = text(&response);
    assert!(
        response.starts_with("HTTP/1.1 500 Internal Server Error\r\n"),
        "{response}"
    );
    assert!(!response.contains("Injected"));
}

#[test]
fn error_statuses() {
    let cases: [(HttpError, u16, bool); 10] = [
        (
            io::Error::from(io::ErrorKind::BrokenPipe).into(),
            400,
            false,
        ),
        (HttpError::Timeout, 408, true),
        (HttpError::IdleTimeout, 408, false),
        (HttpError::HeadTooLarge, 431, true),
        (HttpError::TooManyHeaders, 431, true),
        (HttpError::BadRequest("x"), 400, true),
        (HttpError::VersionNotSupported, 505, true),
        (HttpError::NotImplemented, 501, true),
        (HttpError::UnexpectedEof, 400, false),
        (HttpError::BodyTooLarge, 413, true),
    ];
    for (error, status, should_reply) in cases {
        assert_eq!(
            (error.status(), error.should_reply()),
            (status, should_reply),
            "{error:?}"
        );
    }
}

// ---- scripted stream: exact read sizes and write counts ----

/// Serves `input` at most `read_step_bytes` per read; records each write.
struct Scripted {
    input: Vec<u8>,
    read_pos: usize,
    read_step_bytes: usize,
    writes: Vec<Vec<u8>>,
}

impl Scripted {
    fn new(input: &[u8], read_step_bytes: usize) -> Self {
        Scripted {
            input: input.to_vec(),
            read_pos: 0,
            read_step_bytes,
            writes: Vec::new(),
        }
    }
}

impl futures_lite::AsyncRead for Scripted {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = out
            .len()
            .min(this.read_step_bytes)
            .min(this.input.len() - this.read_pos);
        out[..n].copy_from_slice(&this.input[this.read_pos..this.read_pos + n]);
        this.read_pos += n;
        Poll::Ready(Ok(n))
    }
}

impl futures_lite::AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().writes.push(bytes.to_vec());
        Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[test]
fn chunked_through_the_connection_at_every_read_size() {
    LocalExecutor::default().run(async {
        for read_step_bytes in 1..=CHUNKED_REQUEST.len() {
            let stream = Scripted::new(CHUNKED_REQUEST.as_bytes(), read_step_bytes);
            let mut conn = HttpConn::new(stream, Limits::default());
            conn.read_head().await.unwrap().unwrap();
            let mut body = Vec::new();
            let mut out = [0u8; 5];
            loop {
                let n = conn.read_body(&mut out).await.unwrap();
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&out[..n]);
            }
            assert_eq!(body, CHUNKED_BODY, "read size {read_step_bytes}");
            let next = conn.read_head().await.unwrap().unwrap();
            assert_eq!(next.path, "/next", "read size {read_step_bytes}");
            assert!(conn.read_head().await.unwrap().is_none());
        }
    });
}

#[test]
fn small_response_is_one_write_large_body_is_not_copied() {
    LocalExecutor::default().run(async {
        let mut conn = HttpConn::new(
            Scripted::new(b"GET / HTTP/1.1\r\n\r\n", 1 << 20),
            Limits::default(),
        );
        conn.read_head().await.unwrap().unwrap();
        conn.write_response(&ResponseHead::new(200), 5, false)
            .await
            .unwrap();
        conn.write_body(b"hello").await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(conn.get_ref().writes.len(), 1);
        let large = body_pattern(100_000);
        conn.write_response(&ResponseHead::new(200), large.len() as u64, false)
            .await
            .unwrap();
        conn.write_body(&large).await.unwrap();
        conn.flush().await.unwrap();
        let writes = &conn.get_ref().writes;
        assert_eq!(
            writes.len(),
            3,
            "head, then the body straight from the caller"
        );
        assert_eq!(writes[2], large);
    });
}

#[test]
fn slow_blank_lines_before_request() {
    LocalExecutor::default().run(async {
        let mut conn = HttpConn::new(
            Scripted::new(b"\r\n\r\nGET /x HTTP/1.1\r\n\r\n\r\n", 1),
            Limits::default(),
        );
        assert_eq!(conn.read_head().await.unwrap().unwrap().path, "/x");
        assert!(
            conn.read_head().await.unwrap().is_none(),
            "trailing CRLF then EOF is clean"
        );
    });
}

#[test]
fn extreme_limits_do_not_panic() {
    let limits = Limits {
        headers_count_max: usize::MAX,
        chunk_line_bytes_max: usize::MAX,
        header_timeout_ms: u64::MAX,
        idle_timeout_ms: u64::MAX,
        body_timeout_ms: u64::MAX,
        ..Limits::default()
    };
    LocalExecutor::default().run(async move {
        let request = b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let mut conn = HttpConn::new(Scripted::new(request, 2), limits);
        conn.read_head().await.unwrap().unwrap();
        let mut body = Vec::new();
        let mut out = [0u8; 8];
        loop {
            let n = conn.read_body(&mut out).await.unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&out[..n]);
        }
        assert_eq!(body, b"abc");
        let mut tiny = HttpConn::new(
            Scripted::new(b"GET / HTTP/1.1\r\n\r\n", 4),
            Limits {
                head_bytes_max: 0,
                headers_count_max: 0,
                ..Limits::default()
            },
        );
        assert!(matches!(
            tiny.read_head().await,
            Err(HttpError::HeadTooLarge)
        ));
    });
}

/// Random requests stitched from framing-relevant tokens: whatever the
/// bytes, the connection must answer with a value or an error, never panic
/// or loop.
#[test]
fn garbage_never_panics() {
    const TOKENS: &[&str] = &[
        "GET ",
        "PUT ",
        "/",
        "?",
        " HTTP/1.1",
        " HTTP/1.0",
        " HTTP/2.0",
        "\r\n",
        "\n",
        "\r",
        "Content-Length: ",
        "Transfer-Encoding: ",
        "chunked",
        "gzip",
        "Expect: 100-continue",
        "Connection: close",
        "5",
        "0",
        "ff",
        "-1",
        ",",
        ";",
        "a=b",
        ":",
        " ",
        "\t",
        "hello",
        "\u{e9}",
        "\0",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    LocalExecutor::default().run(async move {
        for _ in 0..3000 {
            let token_count = (next() % 40) as usize;
            let input: String = (0..token_count)
                .map(|_| TOKENS[(next() % TOKENS.len() as u64) as usize])
                .collect();
            let read_step_bytes = 1 + (next() % 16) as usize;
            let limits = Limits {
                head_bytes_max: 64,
                headers_count_max: 4,
                chunk_line_bytes_max: 8,
                ..Limits::default()
            };
            let mut conn = HttpConn::new(Scripted::new(input.as_bytes(), read_step_bytes), limits);
            let mut out = [0u8; 3];
            for _ in 0..100 {
                match conn.read_head().await {
                    Ok(Some(head)) => {
                        while let Ok(n) = conn.read_body(&mut out).await {
                            if n == 0 {
                                break;
                            }
                        }
                        let _ = parse_range(head.header("range").unwrap_or(b""), 10);
                        let _ = conn.write_response(&ResponseHead::new(200), 0, false).await;
                        let _ = conn.flush().await;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
    });
}
