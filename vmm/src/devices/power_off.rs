//! The agent's power-off port: one I/O port the guest's agent writes just
//! before it reboots to end the VM, so that the reset that follows is a
//! clean power-off and any other reset is not
//! ([`crate::exit_status::ExitStatus`]). The port is 0xf4, where QEMU's
//! `isa-debug-exit` sits (the box ends L1 through it); the VMM announces it
//! on the kernel command line ([`perfbed_agent::POWER_OFF_PORT_PARAM`]), so
//! the agent writes it only on this host.

use std::sync::atomic::{AtomicBool, Ordering};

use super::bus::BusDevice;

/// The port, as on QEMU's `isa-debug-exit`.
pub const POWER_OFF_PORT: u16 = 0xf4;

/// Remembers that the agent asked to power off.
#[derive(Debug, Default)]
pub struct PowerOffPort {
    requested: AtomicBool,
}

impl PowerOffPort {
    /// Whether the agent wrote the port.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }
}

impl BusDevice for PowerOffPort {
    fn read(&self, _vcpu: u32, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
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
        let port = PowerOffPort::default();
        let mut byte = [0u8];
        port.read(0, 0, &mut byte);
        assert_eq!(byte, [0xff]);
        assert!(!port.requested());
        port.write(1, 0, &[0]);
        assert!(port.requested());
    }
}
