//! `percore_server::fuzz::s3_route` on arbitrary bytes; the property (what must
//! hold besides "no panic") is documented there, and a stable unit test
//! replays this target's corpus (fuzz/corpus/s3_route) in CI.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    percore_server::fuzz::s3_route(data);
});
