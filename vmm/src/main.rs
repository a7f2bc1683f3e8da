//! perfbed-vmm: the rust-vmm host for the perfbed device.
//!
//! Not written yet (its own issue). Until then it says so and fails, rather
//! than pretending to boot anything.

fn main() -> std::process::ExitCode {
    eprintln!("perfbed-vmm is not implemented yet; guests boot under QEMU (`cargo xtask run`)");
    std::process::ExitCode::FAILURE
}
