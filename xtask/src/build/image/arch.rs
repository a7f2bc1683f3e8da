//! The guest's architecture: x86-64 (the default: microvm, PVH, the IOAPIC)
//! or arm64 (QEMU's `virt` board: GICv3, PSCI, a device tree), and what
//! building for each takes from Debian (docs/arm64.md).

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Arch {
    #[default]
    #[value(name = "x86_64")]
    X86_64,
    #[value(name = "arm64")]
    Arm64,
}

impl Arch {
    /// The kernel's name for it (`ARCH=`).
    pub fn kernel_arch(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86",
            Arch::Arm64 => "arm64",
        }
    }

    /// `CROSS_COMPILE=` for the kernel, and the prefix of the C compiler
    /// whose version keys the kernel (none: the host's own gcc).
    pub fn cross_compile(self) -> Option<&'static str> {
        match self {
            Arch::X86_64 => None,
            Arch::Arm64 => Some("aarch64-linux-gnu-"),
        }
    }

    /// The C compiler that builds the kernel and its modules.
    pub fn gcc(self) -> String {
        format!("{}gcc", self.cross_compile().unwrap_or(""))
    }

    /// The Rust target of the guest's user space (the agent).
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Whether the guest's CPU 0 can go offline: arm64's is an ordinary
    /// hotpluggable CPU (PSCI `CPU_OFF`); x86's kernel gives it no
    /// `online` file.
    pub fn cpu0_goes_offline(self) -> bool {
        match self {
            Arch::X86_64 => false,
            Arch::Arm64 => true,
        }
    }

    /// Debian's architecture name (`dpkg --add-architecture`, `pkg:arch`).
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }
}
