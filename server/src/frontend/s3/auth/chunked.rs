//! The `aws-chunked` body decoder for streaming uploads: chunk headers,
//! per-chunk signatures (each chained to the one before), trailers and the
//! trailer signature, all with bounded buffers.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChunkVariant {
    Signed,
    SignedTrailer,
    UnsignedTrailer,
}

impl ChunkVariant {
    fn chunks_signed(self) -> bool {
        self != Self::UnsignedTrailer
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ChunkState {
    /// Reading `hex(size)[;chunk-signature=..]\r\n`.
    Header,
    /// Copying chunk payload.
    Data {
        remaining_bytes: u64,
    },
    /// Expecting the CRLF after chunk data (`last`: after the final chunk).
    Crlf {
        matched_bytes: u8,
        last: bool,
    },
    /// Reading trailer lines after the final chunk.
    Trailer,
    /// Trailer signature verified; expecting the closing empty line.
    TrailerEnd,
    Done,
    Failed(AuthError),
}

/// Incremental decoder for `Content-Encoding: aws-chunked` bodies.
///
/// Decoded bytes are appended to `out` as they arrive, before the chunk's
/// signature (which follows the data) can be checked: a caller must treat
/// everything it got as unauthenticated until `feed` returns for the end of
/// that chunk without error, and discard the whole body on any error.
pub struct ChunkedDecoder {
    variant: ChunkVariant,
    state: ChunkState,
    signing_key: [u8; 32],
    amz_date: String,
    scope: String,
    /// Signature of the previous chunk (the seed for the first one).
    previous_signature: [u8; 32],
    /// Signature announced by the current chunk's header.
    chunk_signature: [u8; 32],
    chunk_hasher: Sha256,
    trailer_hasher: Sha256,
    /// Current header or trailer line, bounded by CHUNK_LINE_BYTES_MAX.
    line: Vec<u8>,
    trailers: Vec<(String, String)>,
    /// Tolerates one empty line between the final chunk and signed trailers.
    skipped_blank_line: bool,
    decoded_bytes: u64,
    decoded_bytes_expected: Option<u64>,
}

impl ChunkedDecoder {
    /// `mode` must be one of the Streaming* modes; any other mode yields a
    /// decoder whose first `feed` fails. `decoded_content_length` is
    /// x-amz-decoded-content-length, checked against the decoded total.
    pub fn new(
        mode: &PayloadMode,
        verified: &Verified,
        decoded_content_length: Option<u64>,
    ) -> Self {
        let variant = match mode {
            PayloadMode::StreamingSigned => Some(ChunkVariant::Signed),
            PayloadMode::StreamingSignedTrailer => Some(ChunkVariant::SignedTrailer),
            PayloadMode::StreamingUnsignedTrailer => Some(ChunkVariant::UnsignedTrailer),
            PayloadMode::Unsigned | PayloadMode::Sha256(_) => None,
        };
        // A non-streaming mode gives a decoder that is failed from the start
        // (its variant is then never looked at).
        let state = match variant {
            Some(_) => ChunkState::Header,
            None => ChunkState::Failed(AuthError::ChunkMalformed(
                "payload mode is not aws-chunked".into(),
            )),
        };
        Self {
            variant: variant.unwrap_or(ChunkVariant::UnsignedTrailer),
            state,
            signing_key: verified.signing_key,
            amz_date: verified.amz_date.clone(),
            scope: verified.scope.clone(),
            previous_signature: verified.seed_signature,
            chunk_signature: [0; 32],
            chunk_hasher: Sha256::new(),
            trailer_hasher: Sha256::new(),
            line: Vec::with_capacity(128),
            trailers: Vec::new(),
            skipped_blank_line: false,
            decoded_bytes: 0,
            decoded_bytes_expected: decoded_content_length,
        }
    }

    /// Feed input bytes; appends decoded payload bytes to `out`; returns how
    /// many input bytes were consumed. Consumes everything unless the body
    /// ends inside `input` (then the rest is not part of this body). After
    /// an error every later call fails with the same error.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, AuthError> {
        if let ChunkState::Failed(err) = &self.state {
            return Err(err.clone());
        }
        let mut consumed = 0;
        while consumed < input.len() && self.state != ChunkState::Done {
            match self.step(&input[consumed..], out) {
                Ok(used) => {
                    debug_assert!(used > 0, "every step must make progress");
                    consumed += used;
                }
                Err(err) => {
                    self.state = ChunkState::Failed(err.clone());
                    return Err(err);
                }
            }
        }
        Ok(consumed)
    }

    /// The final 0-size chunk (and the trailers, if any) have been consumed.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Call at end of input: an unfinished body is IncompleteBody.
    pub fn finish(&self) -> Result<(), AuthError> {
        match &self.state {
            ChunkState::Done => Ok(()),
            ChunkState::Failed(err) => Err(err.clone()),
            _ => Err(AuthError::IncompleteBody),
        }
    }

    /// Trailer headers (lowercased name, trimmed value), e.g. x-amz-checksum-crc32.
    pub fn trailers(&self) -> &[(String, String)] {
        &self.trailers
    }

    /// Payload bytes decoded so far.
    pub fn decoded_bytes(&self) -> u64 {
        self.decoded_bytes
    }

    /// Consume at least one byte of `input` (non-empty) and advance.
    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, AuthError> {
        debug_assert!(!input.is_empty());
        match self.state {
            ChunkState::Header => self.step_line(input, Self::on_chunk_header),
            ChunkState::Data { remaining_bytes } => self.step_data(input, remaining_bytes, out),
            ChunkState::Crlf {
                matched_bytes,
                last,
            } => self.step_crlf(input[0], matched_bytes, last),
            ChunkState::Trailer => self.step_line(input, Self::on_trailer_line),
            ChunkState::TrailerEnd => self.step_line(input, Self::on_trailer_end),
            ChunkState::Done | ChunkState::Failed(_) => {
                debug_assert!(false, "feed does not step a finished decoder");
                Err(AuthError::ChunkMalformed("decoder already finished".into()))
            }
        }
    }

    /// Accumulate a CRLF-terminated line; once complete, hand its content
    /// (CRLF stripped) to `on_line`.
    fn step_line(
        &mut self,
        input: &[u8],
        on_line: fn(&mut Self, &[u8]) -> Result<(), AuthError>,
    ) -> Result<usize, AuthError> {
        let (piece, complete) = match input.iter().position(|&b| b == b'\n') {
            Some(end) => (&input[..=end], true),
            None => (input, false),
        };
        if self.line.len() + piece.len() > CHUNK_LINE_BYTES_MAX + 2 {
            return Err(AuthError::ChunkMalformed(format!(
                "line longer than {CHUNK_LINE_BYTES_MAX} bytes"
            )));
        }
        self.line.extend_from_slice(piece);
        if complete {
            let mut line = std::mem::take(&mut self.line);
            let content = line
                .strip_suffix(b"\r\n")
                .ok_or_else(|| AuthError::ChunkMalformed("line not terminated by CRLF".into()))?;
            let result = on_line(self, content);
            line.clear();
            self.line = line; // keep the allocation
            result?;
        }
        Ok(piece.len())
    }

    fn on_chunk_header(&mut self, line: &[u8]) -> Result<(), AuthError> {
        let variant = self.variant;
        let (size_bytes, signature) = parse_chunk_header(line, variant.chunks_signed())?;
        if let Some(signature) = signature {
            self.chunk_signature = signature;
        }
        let decoded_after = self.decoded_bytes + size_bytes;
        if self
            .decoded_bytes_expected
            .is_some_and(|expected| decoded_after > expected)
        {
            return Err(AuthError::IncompleteBody);
        }
        if size_bytes > 0 {
            self.state = ChunkState::Data {
                remaining_bytes: size_bytes,
            };
            return Ok(());
        }
        // The final, empty chunk.
        if self
            .decoded_bytes_expected
            .is_some_and(|expected| self.decoded_bytes != expected)
        {
            return Err(AuthError::IncompleteBody);
        }
        if variant.chunks_signed() {
            self.verify_chunk_signature()?;
        }
        self.state = match variant {
            ChunkVariant::Signed => ChunkState::Crlf {
                matched_bytes: 0,
                last: true,
            },
            ChunkVariant::SignedTrailer | ChunkVariant::UnsignedTrailer => ChunkState::Trailer,
        };
        Ok(())
    }

    fn step_data(
        &mut self,
        input: &[u8],
        remaining_bytes: u64,
        out: &mut Vec<u8>,
    ) -> Result<usize, AuthError> {
        debug_assert!(remaining_bytes > 0);
        let take = remaining_bytes.min(input.len() as u64) as usize;
        let data = &input[..take];
        out.extend_from_slice(data);
        if self.variant.chunks_signed() {
            self.chunk_hasher.update(data);
        }
        self.decoded_bytes += take as u64;
        let remaining_bytes = remaining_bytes - take as u64;
        if remaining_bytes > 0 {
            self.state = ChunkState::Data { remaining_bytes };
            return Ok(take);
        }
        if self.variant.chunks_signed() {
            self.verify_chunk_signature()?;
        }
        self.state = ChunkState::Crlf {
            matched_bytes: 0,
            last: false,
        };
        Ok(take)
    }

    fn step_crlf(&mut self, byte: u8, matched_bytes: u8, last: bool) -> Result<usize, AuthError> {
        debug_assert!(matched_bytes < 2);
        let expected = if matched_bytes == 0 { b'\r' } else { b'\n' };
        if byte != expected {
            return Err(AuthError::ChunkMalformed(
                "chunk data not followed by CRLF".into(),
            ));
        }
        self.state = match (matched_bytes, last) {
            (0, _) => ChunkState::Crlf {
                matched_bytes: 1,
                last,
            },
            (_, true) => ChunkState::Done,
            (_, false) => ChunkState::Header,
        };
        Ok(1)
    }

    /// Chunk string-to-sign: "AWS4-HMAC-SHA256-PAYLOAD\n" date \n scope \n
    /// previous-signature \n sha256("") \n sha256(chunk data), all hex.
    fn verify_chunk_signature(&mut self) -> Result<(), AuthError> {
        let data_hash: [u8; 32] = std::mem::take(&mut self.chunk_hasher).finalize().into();
        let mut previous_hex = [0u8; 64];
        let mut data_hash_hex = [0u8; 64];
        hex_encode32(&self.previous_signature, &mut previous_hex);
        hex_encode32(&data_hash, &mut data_hash_hex);
        let expected = hmac_sha256(
            &self.signing_key,
            &[
                b"AWS4-HMAC-SHA256-PAYLOAD\n",
                self.amz_date.as_bytes(),
                b"\n",
                self.scope.as_bytes(),
                b"\n",
                &previous_hex,
                b"\n",
                EMPTY_SHA256_HEX.as_bytes(),
                b"\n",
                &data_hash_hex,
            ],
        );
        if !bool::from(expected.ct_eq(&self.chunk_signature)) {
            return Err(AuthError::SignatureDoesNotMatch);
        }
        self.previous_signature = self.chunk_signature;
        Ok(())
    }

    fn on_trailer_line(&mut self, line: &[u8]) -> Result<(), AuthError> {
        let signed = self.variant == ChunkVariant::SignedTrailer;
        if line.is_empty() {
            if !signed {
                self.state = ChunkState::Done;
                return Ok(());
            }
            // Some writers put the final chunk's CRLF before signed trailers.
            if self.trailers.is_empty() && !self.skipped_blank_line {
                self.skipped_blank_line = true;
                return Ok(());
            }
            return Err(AuthError::ChunkMalformed(
                "missing x-amz-trailer-signature".into(),
            ));
        }
        let (name, value) = split_trailer(line)?;
        if name.eq_ignore_ascii_case("x-amz-trailer-signature") {
            if !signed {
                return Err(AuthError::ChunkMalformed(
                    "unexpected trailer signature".into(),
                ));
            }
            let signature = parse_hex32(value).ok_or_else(|| {
                AuthError::ChunkMalformed("invalid x-amz-trailer-signature".into())
            })?;
            self.verify_trailer_signature(&signature)?;
            self.state = ChunkState::TrailerEnd;
            return Ok(());
        }
        if self.trailers.len() >= TRAILERS_MAX {
            return Err(AuthError::ChunkMalformed(format!(
                "more than {TRAILERS_MAX} trailers"
            )));
        }
        if signed {
            // The trailer signature covers each line as sent, "name:value\n".
            self.trailer_hasher.update(line);
            self.trailer_hasher.update(b"\n");
        }
        self.trailers
            .push((name.to_ascii_lowercase(), value.to_string()));
        Ok(())
    }

    fn on_trailer_end(&mut self, line: &[u8]) -> Result<(), AuthError> {
        if !line.is_empty() {
            return Err(AuthError::ChunkMalformed(
                "data after x-amz-trailer-signature".into(),
            ));
        }
        self.state = ChunkState::Done;
        Ok(())
    }

    /// Trailer string-to-sign: "AWS4-HMAC-SHA256-TRAILER\n" date \n scope \n
    /// previous-signature \n sha256(trailer lines), all hex.
    fn verify_trailer_signature(&mut self, provided: &[u8; 32]) -> Result<(), AuthError> {
        let trailer_hash: [u8; 32] = std::mem::take(&mut self.trailer_hasher).finalize().into();
        let mut previous_hex = [0u8; 64];
        let mut trailer_hash_hex = [0u8; 64];
        hex_encode32(&self.previous_signature, &mut previous_hex);
        hex_encode32(&trailer_hash, &mut trailer_hash_hex);
        let expected = hmac_sha256(
            &self.signing_key,
            &[
                b"AWS4-HMAC-SHA256-TRAILER\n",
                self.amz_date.as_bytes(),
                b"\n",
                self.scope.as_bytes(),
                b"\n",
                &previous_hex,
                b"\n",
                &trailer_hash_hex,
            ],
        );
        if !bool::from(expected.ct_eq(provided)) {
            return Err(AuthError::SignatureDoesNotMatch);
        }
        self.previous_signature = *provided;
        Ok(())
    }
}

/// `hex(size);chunk-signature=<64 hex>` (signed) or `hex(size)[;ext]` (unsigned).
pub(super) fn parse_chunk_header(
    line: &[u8],
    signed: bool,
) -> Result<(u64, Option<[u8; 32]>), AuthError> {
    let malformed = || AuthError::ChunkMalformed("invalid chunk header".into());
    let line = std::str::from_utf8(line).map_err(|_| malformed())?;
    let (size_hex, extension) = match line.split_once(';') {
        Some((size, ext)) => (size, Some(ext)),
        None => (line, None),
    };
    if size_hex.is_empty()
        || size_hex.len() > 16
        || !size_hex.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(malformed());
    }
    let size_bytes = u64::from_str_radix(size_hex, 16).map_err(|_| malformed())?;
    if size_bytes > CHUNK_BYTES_MAX {
        return Err(AuthError::ChunkMalformed(format!(
            "chunk of {size_bytes} bytes exceeds {CHUNK_BYTES_MAX}"
        )));
    }
    if !signed {
        return Ok((size_bytes, None));
    }
    let signature = extension
        .and_then(|ext| ext.strip_prefix("chunk-signature="))
        .and_then(parse_hex32)
        .ok_or_else(|| AuthError::ChunkMalformed("missing or invalid chunk-signature".into()))?;
    Ok((size_bytes, Some(signature)))
}

pub(super) fn split_trailer(line: &[u8]) -> Result<(&str, &str), AuthError> {
    let malformed = || AuthError::ChunkMalformed("invalid trailer line".into());
    let line = std::str::from_utf8(line).map_err(|_| malformed())?;
    let (name, value) = line.split_once(':').ok_or_else(malformed)?;
    let name = trim_ows(name);
    if name.is_empty() || !name.bytes().all(is_token_byte) {
        return Err(malformed());
    }
    Ok((name, trim_ows(value)))
}
