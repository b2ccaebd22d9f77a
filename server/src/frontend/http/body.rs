//! Request body framing as a pure state machine over buffered bytes, so the
//! I/O loop in `conn.rs` stays small and the decoder is testable alone.

use super::head::BodyFraming;
use super::HttpError;

/// What the decoder wants next, given the bytes buffered so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Framing bytes (a chunk-size line, a CRLF, a trailer line) to drop.
    Framing { consumed_bytes: usize },
    /// Body data comes next; at most this many bytes belong to the body
    /// (or to the current chunk). Report what was taken via `data_consumed`.
    Data { remaining_bytes: u64 },
    /// The buffered bytes end inside a framing line; read more.
    NeedMore,
    /// End of body after dropping these framing bytes.
    Done { consumed_bytes: usize },
}

#[derive(Debug)]
pub(crate) enum BodyState {
    /// No body, or the body was read to its end.
    Empty,
    Length {
        remaining_bytes: u64,
    },
    Chunked(ChunkedDecoder),
}

impl BodyState {
    pub(crate) fn new(
        framing: BodyFraming,
        line_bytes_max: usize,
        trailer_bytes_max: usize,
    ) -> Self {
        match framing {
            BodyFraming::Empty => BodyState::Empty,
            BodyFraming::Length(remaining_bytes) => BodyState::Length { remaining_bytes },
            BodyFraming::Chunked => {
                BodyState::Chunked(ChunkedDecoder::new(line_bytes_max, trailer_bytes_max))
            }
        }
    }

    pub(crate) fn step(&mut self, input: &[u8]) -> Result<Step, HttpError> {
        match self {
            BodyState::Empty => Ok(Step::Done { consumed_bytes: 0 }),
            BodyState::Length { remaining_bytes: 0 } => Ok(Step::Done { consumed_bytes: 0 }),
            BodyState::Length { remaining_bytes } => Ok(Step::Data {
                remaining_bytes: *remaining_bytes,
            }),
            BodyState::Chunked(decoder) => decoder.step(input),
        }
    }

    /// Records that `taken_bytes` of body data (at most what `Step::Data`
    /// allowed) were handed to the caller.
    pub(crate) fn data_consumed(&mut self, taken_bytes: usize) {
        match self {
            BodyState::Empty => debug_assert_eq!(taken_bytes, 0),
            BodyState::Length { remaining_bytes } => {
                debug_assert!(taken_bytes as u64 <= *remaining_bytes);
                *remaining_bytes = remaining_bytes.saturating_sub(taken_bytes as u64);
            }
            BodyState::Chunked(decoder) => decoder.data_consumed(taken_bytes),
        }
    }

    /// True once no further body bytes will be read from the stream.
    pub(crate) fn is_finished(&self) -> bool {
        matches!(
            self,
            BodyState::Empty | BodyState::Length { remaining_bytes: 0 }
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkPhase {
    SizeLine,
    Data {
        remaining_bytes: u64,
    },
    /// The CRLF that closes a chunk's data.
    DataEnd,
    Trailer,
    Done,
}

/// `Transfer-Encoding: chunked` (RFC 9112 7.1). Framing lines must end in
/// CRLF: accepting a bare LF here is a known request-smuggling vector when
/// a proxy in front disagrees.
#[derive(Debug)]
pub(crate) struct ChunkedDecoder {
    phase: ChunkPhase,
    line_bytes_max: usize,
    trailer_bytes_max: usize,
    trailer_bytes: usize,
}

impl ChunkedDecoder {
    pub(crate) fn new(line_bytes_max: usize, trailer_bytes_max: usize) -> Self {
        ChunkedDecoder {
            phase: ChunkPhase::SizeLine,
            line_bytes_max,
            trailer_bytes_max,
            trailer_bytes: 0,
        }
    }

    fn step(&mut self, input: &[u8]) -> Result<Step, HttpError> {
        match self.phase {
            ChunkPhase::SizeLine => self.step_size_line(input),
            ChunkPhase::Data { remaining_bytes } => {
                debug_assert!(remaining_bytes > 0, "empty data phase must not exist");
                Ok(Step::Data { remaining_bytes })
            }
            ChunkPhase::DataEnd => self.step_data_end(input),
            ChunkPhase::Trailer => self.step_trailer(input),
            ChunkPhase::Done => Ok(Step::Done { consumed_bytes: 0 }),
        }
    }

    fn step_size_line(&mut self, input: &[u8]) -> Result<Step, HttpError> {
        let Some((line, consumed_bytes)) = take_line(input, self.line_bytes_max)? else {
            return Ok(Step::NeedMore);
        };
        let size_bytes = parse_chunk_size(line)?;
        self.phase = if size_bytes == 0 {
            ChunkPhase::Trailer
        } else {
            ChunkPhase::Data {
                remaining_bytes: size_bytes,
            }
        };
        Ok(Step::Framing { consumed_bytes })
    }

    fn step_data_end(&mut self, input: &[u8]) -> Result<Step, HttpError> {
        match input {
            [b'\r', b'\n', ..] => {
                self.phase = ChunkPhase::SizeLine;
                Ok(Step::Framing { consumed_bytes: 2 })
            }
            [] | [b'\r'] => Ok(Step::NeedMore),
            _ => Err(HttpError::BadRequest("missing CRLF after chunk data")),
        }
    }

    fn step_trailer(&mut self, input: &[u8]) -> Result<Step, HttpError> {
        let Some((line, consumed_bytes)) = take_line(input, self.line_bytes_max)? else {
            return Ok(Step::NeedMore);
        };
        if line.is_empty() {
            self.phase = ChunkPhase::Done;
            return Ok(Step::Done { consumed_bytes });
        }
        // Trailer fields are dropped: nothing in S3 needs them here, and the
        // signature layer reads aws-chunked trailers from the body itself.
        self.trailer_bytes = self.trailer_bytes.saturating_add(consumed_bytes);
        if self.trailer_bytes > self.trailer_bytes_max {
            return Err(HttpError::BadRequest("trailer section too large"));
        }
        Ok(Step::Framing { consumed_bytes })
    }

    fn data_consumed(&mut self, taken_bytes: usize) {
        if let ChunkPhase::Data { remaining_bytes } = &mut self.phase {
            debug_assert!(taken_bytes as u64 <= *remaining_bytes);
            *remaining_bytes = remaining_bytes.saturating_sub(taken_bytes as u64);
            if *remaining_bytes == 0 {
                self.phase = ChunkPhase::DataEnd;
            }
        } else {
            debug_assert_eq!(taken_bytes, 0, "data taken outside a data phase");
        }
    }
}

/// One CRLF-terminated line at the start of `input`: (line without CRLF,
/// bytes including CRLF). Ok(None) when incomplete but still within bounds.
fn take_line(input: &[u8], line_bytes_max: usize) -> Result<Option<(&[u8], usize)>, HttpError> {
    let window_bytes = input.len().min(line_bytes_max.saturating_add(2));
    let window = &input[..window_bytes];
    match window.iter().position(|&b| b == b'\n') {
        Some(newline) if newline > 0 && window[newline - 1] == b'\r' => {
            Ok(Some((&window[..newline - 1], newline + 1)))
        }
        Some(_) => Err(HttpError::BadRequest("bare LF in chunked framing")),
        None if window_bytes >= line_bytes_max.saturating_add(2) => {
            Err(HttpError::BadRequest("chunk line too long"))
        }
        None => Ok(None),
    }
}

/// `chunk-size [ BWS ";" chunk-ext ]`; extensions are ignored but must not
/// hold control characters.
fn parse_chunk_size(line: &[u8]) -> Result<u64, HttpError> {
    let digits_len = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits_len == 0 {
        return Err(HttpError::BadRequest("invalid chunk size"));
    }
    let size_bytes = line[..digits_len]
        .iter()
        .try_fold(0u64, |acc, &b| {
            let digit = (b as char).to_digit(16)?;
            acc.checked_mul(16)?.checked_add(u64::from(digit))
        })
        .ok_or(HttpError::BadRequest("chunk size overflow"))?;
    let rest = &line[digits_len..];
    let rest_start = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(rest.len());
    let extensions = &rest[rest_start..];
    if !extensions.is_empty() && extensions[0] != b';' {
        return Err(HttpError::BadRequest("invalid chunk size"));
    }
    if extensions
        .iter()
        .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return Err(HttpError::BadRequest("invalid chunk extension"));
    }
    Ok(size_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `wire` to a decoder `split_bytes` at a time (as a socket might
    /// deliver it) and returns the decoded data and the bytes left over.
    fn decode(wire: &[u8], split_bytes: usize) -> Result<(Vec<u8>, Vec<u8>), HttpError> {
        let mut state = BodyState::new(BodyFraming::Chunked, 64, 256);
        let mut buffered: Vec<u8> = Vec::new();
        let mut fed_bytes = 0;
        let mut data = Vec::new();
        loop {
            match state.step(&buffered)? {
                Step::Framing { consumed_bytes } => {
                    buffered.drain(..consumed_bytes);
                }
                Step::Data { remaining_bytes } => {
                    if buffered.is_empty() {
                        if fed_bytes == wire.len() {
                            return Err(HttpError::UnexpectedEof);
                        }
                        let end = (fed_bytes + split_bytes).min(wire.len());
                        buffered.extend_from_slice(&wire[fed_bytes..end]);
                        fed_bytes = end;
                        continue;
                    }
                    let take = buffered.len().min(remaining_bytes as usize);
                    data.extend(buffered.drain(..take));
                    state.data_consumed(take);
                }
                Step::NeedMore => {
                    if fed_bytes == wire.len() {
                        return Err(HttpError::UnexpectedEof);
                    }
                    let end = (fed_bytes + split_bytes).min(wire.len());
                    buffered.extend_from_slice(&wire[fed_bytes..end]);
                    fed_bytes = end;
                }
                Step::Done { consumed_bytes } => {
                    buffered.drain(..consumed_bytes);
                    buffered.extend_from_slice(&wire[fed_bytes..]);
                    return Ok((data, buffered));
                }
            }
        }
    }

    const WIRE: &[u8] =
        b"5;name=val\r\nhello\r\n6 ; x=\"y z\"\r\n world\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\nNEXT";

    #[test]
    fn decodes_at_every_split_size() {
        for split_bytes in 1..=WIRE.len() {
            let (data, rest) = decode(WIRE, split_bytes).unwrap();
            assert_eq!(data, b"hello world", "split {split_bytes}");
            assert_eq!(rest, b"NEXT", "split {split_bytes}");
        }
    }

    #[test]
    fn truncation_anywhere_is_an_eof() {
        let body_end = WIRE.len() - 4;
        for cut in 0..body_end {
            assert!(
                matches!(decode(&WIRE[..cut], 3), Err(HttpError::UnexpectedEof)),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn rejects_bad_framing() {
        let cases: &[&[u8]] = &[
            b"x\r\n",
            b"\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5 junk\r\nhello\r\n0\r\n\r\n",
            b"5;a\x01\r\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            b"0\r\nT: 1\n\r\n",
        ];
        for wire in cases {
            assert!(
                matches!(decode(wire, 100), Err(HttpError::BadRequest(_))),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn bounds_lines_and_trailers() {
        let long_size_line = format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(70));
        assert!(matches!(
            decode(long_size_line.as_bytes(), 1),
            Err(HttpError::BadRequest("chunk line too long"))
        ));
        let ok_size_line = format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(62));
        assert_eq!(decode(ok_size_line.as_bytes(), 1).unwrap().0, b"x");
        let many_trailers = format!("0\r\n{}\r\n", "T: v\r\n".repeat(60));
        assert!(matches!(
            decode(many_trailers.as_bytes(), 7),
            Err(HttpError::BadRequest("trailer section too large"))
        ));
    }

    #[test]
    fn max_chunk_size_parses() {
        assert_eq!(parse_chunk_size(b"ffffffffffffffff").unwrap(), u64::MAX);
        assert_eq!(parse_chunk_size(b"000000000000000000001A").unwrap(), 26);
    }

    #[test]
    fn length_state() {
        let mut state = BodyState::new(BodyFraming::Length(3), 64, 64);
        assert_eq!(state.step(b"").unwrap(), Step::Data { remaining_bytes: 3 });
        state.data_consumed(2);
        assert!(!state.is_finished());
        state.data_consumed(1);
        assert!(state.is_finished());
        assert_eq!(state.step(b"x").unwrap(), Step::Done { consumed_bytes: 0 });
    }
}
