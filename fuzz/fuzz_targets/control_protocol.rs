#![no_main]
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| perfbed_fuzz::control::run(bytes));
