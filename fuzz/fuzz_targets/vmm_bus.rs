#![no_main]
libfuzzer_sys::fuzz_target!(|input: perfbed_fuzz::vmm_bus::Input| perfbed_fuzz::vmm_bus::run(&input));
