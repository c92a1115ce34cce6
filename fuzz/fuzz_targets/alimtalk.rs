#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| outbox_relay::fuzzing::alimtalk(data));
