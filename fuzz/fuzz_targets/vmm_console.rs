#![no_main]
libfuzzer_sys::fuzz_target!(|input: perfbed_fuzz::vmm_console::Input| perfbed_fuzz::vmm_console::run(&input));
