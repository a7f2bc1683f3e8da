//! The hosts: which VMM runs the guest ([`Host`]), chosen from `--host`
//! and what this machine can do ([`choose_host`], [`choose_accel`]), and
//! what each needs built ([`build_host`]).
//!
//! Everything else boots a guest through [`vm::Vm`] whatever the host; each
//! host's own command line lives in its file ([`qemu`], [`vmm`],
//! [`the_box`]), and none of them imports another.

pub mod cmdline;
pub mod config;
pub mod console;
pub mod control_proxy;
pub mod cpu_state;
pub mod monitor;
pub mod qemu;
pub mod qemu_virt;
pub mod symbols;
pub mod the_box;
pub mod vm;
pub mod vmm;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::build::box_image::{self, BoxImages};
use crate::build::image::arch::Arch;

/// Which VMM runs the guest, and where.
#[derive(Debug, Clone)]
pub enum Host {
    /// perfbed's QEMU with the device shim (`config.qemu`), KVM or TCG.
    Qemu,
    /// perfbed's aarch64 QEMU running an arm64 guest on the `virt` board,
    /// TCG (`qemu_virt.rs`, docs/arm64.md).
    QemuVirt,
    /// perfbed-vmm on this machine's /dev/kvm (a CPU with VT-x/SVM).
    VmmNative { vmm: PathBuf },
    /// perfbed-vmm inside the box (an L1 Linux with KVM under `config.qemu`).
    VmmBox(BoxImages),
}

impl Host {
    pub fn name(&self) -> &'static str {
        match self {
            Host::Qemu => "qemu",
            Host::QemuVirt => "qemu (arm64 virt)",
            Host::VmmNative { .. } => "vmm (native KVM)",
            Host::VmmBox(_) => "vmm (in the box)",
        }
    }

    /// The guest's architecture: arm64 on `virt`, x86-64 on every other host.
    /// Whether perfbed-vmm runs the guest (it prints its own report).
    pub fn is_vmm(&self) -> bool {
        matches!(self, Host::VmmNative { .. } | Host::VmmBox(_))
    }

    pub fn arch(&self) -> Arch {
        match self {
            Host::QemuVirt => Arch::Arm64,
            Host::Qemu | Host::VmmNative { .. } | Host::VmmBox(_) => Arch::X86_64,
        }
    }
}

/// What `--host` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostChoice {
    /// perfbed-vmm on native KVM where the CPU has VT-x/SVM, else QEMU.
    Auto,
    /// perfbed's QEMU (KVM where usable, else TCG).
    Qemu,
    /// perfbed-vmm: on native KVM where usable, else in the box.
    Vmm,
}

impl HostChoice {
    /// The `--host` value that asks for this (clap's own spelling of it).
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .expect("no choice is skipped")
            .get_name()
            .to_string()
    }
}

/// Where perfbed-vmm can run, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Qemu,
    VmmNative,
    VmmBox,
}

/// Resolves `--host` on this machine: `auto` takes native KVM when the CPU
/// has VT-x/SVM, else the QEMU host; `vmm` without it takes the box.
pub fn choose_host(choice: HostChoice, accel: &Accel) -> (Placement, String) {
    match (choice, accel.kvm) {
        (HostChoice::Qemu, _) => (Placement::Qemu, "asked for (--host qemu)".into()),
        (HostChoice::Auto, true) | (HostChoice::Vmm, true) => {
            (Placement::VmmNative, accel.reason.clone())
        }
        (HostChoice::Auto, false) => (
            Placement::Qemu,
            format!(
                "no native KVM for perfbed-vmm: {}; `--host vmm` runs it in the box",
                accel.reason
            ),
        ),
        (HostChoice::Vmm, false) => (
            Placement::VmmBox,
            format!(
                "no native KVM ({}): an L1 Linux with KVM under QEMU TCG runs it",
                accel.reason
            ),
        ),
    }
}

/// How QEMU runs the guest's CPUs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accel {
    pub kvm: bool,
    pub reason: String,
}

/// KVM only where the CPU has VT-x/SVM and `/dev/kvm` opens; otherwise TCG.
pub fn choose_accel() -> Accel {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .find(|f| *f == "vmx" || *f == "svm")
        .map(str::to_string);
    let kvm_dev = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm");
    match (hw, kvm_dev) {
        (Some(flag), Ok(_)) => Accel { kvm: true, reason: format!("the CPU has {flag} and /dev/kvm is usable") },
        (Some(flag), Err(e)) => Accel { kvm: false, reason: format!("the CPU has {flag} but /dev/kvm cannot be opened ({e})") },
        (None, Ok(_)) => Accel {
            kvm: false,
            reason: "/dev/kvm exists but the CPU has no VT-x/SVM (a software hypervisor, too slow for a stock kernel)".into(),
        },
        (None, Err(_)) => Accel { kvm: false, reason: "no hardware virtualization and no /dev/kvm".into() },
    }
}

/// The host `placement` names, with what it needs built: perfbed-vmm, and
/// for the box its L1 kernel and an initramfs holding this guest.
pub fn build_host(
    workspace: &Path,
    placement: Placement,
    guest_vmlinux: &Path,
    guest_initramfs: &Path,
) -> Result<Host> {
    Ok(match placement {
        Placement::Qemu => Host::Qemu,
        Placement::VmmNative => Host::VmmNative {
            vmm: box_image::build_binaries(workspace)?.0,
        },
        Placement::VmmBox => Host::VmmBox(box_image::ensure(
            workspace,
            guest_vmlinux,
            guest_initramfs,
        )?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_choice_names_the_flag_value_that_asks_for_it() {
        use clap::ValueEnum;
        for choice in HostChoice::value_variants() {
            assert_eq!(HostChoice::from_str(&choice.name(), false), Ok(*choice));
        }
    }
}
