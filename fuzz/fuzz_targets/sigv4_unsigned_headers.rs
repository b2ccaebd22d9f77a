//! `percore_server::fuzz::sigv4_unsigned_headers` on arbitrary bytes; the property (what must
//! hold besides "no panic") is documented there, and a stable unit test
//! replays this target's corpus (fuzz/corpus/sigv4_unsigned_headers) in CI.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    percore_server::fuzz::sigv4_unsigned_headers(data);
});
