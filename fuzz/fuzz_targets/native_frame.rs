//! The native protocol's decoders on arbitrary bytes: the 24-byte frame
//! header, then the message header of every kind (first byte = kind).
//! Nothing may panic; what decodes must re-encode to the same value. The
//! property lives in `percore_protocol::native::fuzz_decode` so that a
//! stable unit test replays this target's corpus in CI.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    percore_protocol::native::fuzz_decode(data);
});
