#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_replay::request_ids(data));
