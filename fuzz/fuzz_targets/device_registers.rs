#![no_main]
libfuzzer_sys::fuzz_target!(|input: perfbed_fuzz::registers::Input| perfbed_fuzz::registers::run(&input));
