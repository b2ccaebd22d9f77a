//! HTTP/1.1 server-side connection layer: request heads and bodies in,
//! responses out, with bounded buffers and timeouts (see [`Limits`]).
//!
//! Nothing here knows about S3; `parse_range` only implements the S3 reading
//! of the `Range` header for the object layer to use.

mod body;
mod buf;
mod conn;
mod date;
mod error;
mod head;
mod range;
mod response;
pub(crate) mod timeout;

#[cfg(any(test, fuzzing))]
pub(crate) use body::{BodyState, Step};
pub use conn::{
    HttpConn, BODY_WINDOW_BYTES, DISCARD_BODY_BYTES_MAX, DISCARD_WIRE_BYTES_MAX,
    WRITE_COALESCE_BYTES,
};
pub(crate) use date::civil_from_days;
pub use date::imf_fixdate;
pub use error::HttpError;
#[cfg(any(test, fuzzing))]
pub(crate) use head::{next_head, parse_head};
pub use head::{BodyFraming, Limits, RequestHead};
pub use range::{content_range, parse_range, RangeError, RangeSpec, RANGES_COUNT_MAX};
pub use response::{reason_phrase, ResponseHead};
pub(crate) use timeout::within;

#[cfg(test)]
mod tests;
