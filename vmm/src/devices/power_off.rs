//! The agent's power-off register: one MMIO page the guest's agent writes
//! just before it reboots to end the VM, so that the reset that follows is
//! a clean power-off and any other reset is not
//! ([`crate::exit_status::ExitStatus`]). The VMM announces its address on
//! the kernel command line ([`perfbed_agent::POWER_OFF_PARAM`]), so the
//! agent writes it only on this host. It is MMIO, not an I/O port like
//! QEMU's `isa-debug-exit` (which the box uses for L1): perfbed's guest
//! kernel has no `ioperm` (`CONFIG_X86_IOPL_IOPERM` is off) and no
//! `/dev/port`, while the agent already maps device pages through
//! `/dev/mem`.

use std::sync::atomic::{AtomicBool, Ordering};

use super::bus::BusDevice;

/// The register's page.
pub const POWER_OFF_SIZE: u64 = 0x1000;

/// Remembers that the agent asked to power off.
#[derive(Debug, Default)]
pub struct PowerOff {
    requested: AtomicBool,
}

impl PowerOff {
    /// Whether the agent wrote the register.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }
}

impl BusDevice for PowerOff {
    fn read(&self, _vcpu: u32, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, _vcpu: u32, _offset: u64, _data: &[u8]) {
        // The write retires before the guest's reboot, on whichever vCPU
        // resets: SeqCst makes it visible to the run's end.
        self.requested.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_a_power_off_request_and_a_read_is_not() {
        let register = PowerOff::default();
        let mut bytes = [0xffu8; 8];
        register.read(0, 0, &mut bytes);
        assert_eq!(bytes, [0; 8]);
        assert!(!register.requested());
        register.write(1, 0, &[0; 8]);
        assert!(register.requested());
    }
}
