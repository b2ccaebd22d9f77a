//! `percore_server::fuzz::segment_scan` on arbitrary bytes; the property (what must
//! hold besides "no panic") is documented there, and a stable unit test
//! replays this target's corpus (fuzz/corpus/segment_scan) in CI.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    percore_server::fuzz::segment_scan(data);
});
