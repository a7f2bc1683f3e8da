//! perfbed-vmm's exit statuses: the one table of how a run ended, which
//! the command line exits with, the box's `/init` passes on, and xtask
//! reads back and names (docs/vmm-and-box.md has the same table).
//!
//! A clean power-off is told apart from any other reset by the agent's
//! power-off register ([`crate::devices::power_off`]): the guest's agent
//! writes it just before it reboots (with `reboot=t`, a triple fault), so a reset
//! without that write (a triple fault of a broken guest, a `reboot` by
//! someone else) is unexpected.

use crate::vmm::{GuestEnd, VmmError};

/// How `perfbed-vmm` ended, as its exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitStatus {
    /// The agent powered the guest off (its register written, then the
    /// reset).
    PoweredOff = 0,
    /// The VMM itself failed (KVM set-up, I/O, a `KVM_RUN` error).
    HostError = 1,
    /// Bad command line or configuration.
    Usage = 2,
    /// The guest kernel panicked (the serial console showed the banner).
    GuestPanic = 3,
    /// SIGTERM or SIGINT stopped the VMM (its vCPUs joined, its log
    /// flushed, its figures reported).
    Terminated = 4,
    /// The guest reset or shut down without the agent's power-off and
    /// without a panic: a triple fault, or a reboot nobody asked for.
    UnexpectedReset = 5,
    /// KVM could not run the guest: a failed entry, an internal
    /// (emulation) error, or an exit the VMM does not handle.
    KvmFailure = 6,
}

impl ExitStatus {
    /// Every status, code order.
    pub const ALL: [ExitStatus; 7] = [
        ExitStatus::PoweredOff,
        ExitStatus::HostError,
        ExitStatus::Usage,
        ExitStatus::GuestPanic,
        ExitStatus::Terminated,
        ExitStatus::UnexpectedReset,
        ExitStatus::KvmFailure,
    ];

    /// The process's exit code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The status an exit code stands for, if it is one of the table's.
    pub fn from_code(code: u8) -> Option<ExitStatus> {
        ExitStatus::ALL.into_iter().find(|s| s.code() == code)
    }

    /// A short name, for reports (`exit=powered-off`).
    pub fn name(self) -> &'static str {
        match self {
            ExitStatus::PoweredOff => "powered-off",
            ExitStatus::HostError => "host-error",
            ExitStatus::Usage => "usage",
            ExitStatus::GuestPanic => "guest-panic",
            ExitStatus::Terminated => "terminated",
            ExitStatus::UnexpectedReset => "unexpected-reset",
            ExitStatus::KvmFailure => "kvm-failure",
        }
    }

    /// What it means, in a sentence's words.
    pub fn meaning(self) -> &'static str {
        match self {
            ExitStatus::PoweredOff => "the agent powered the guest off",
            ExitStatus::HostError => "perfbed-vmm failed (see its log)",
            ExitStatus::Usage => "perfbed-vmm's arguments were bad",
            ExitStatus::GuestPanic => "the guest kernel panicked",
            ExitStatus::Terminated => "perfbed-vmm was stopped by SIGTERM or SIGINT",
            ExitStatus::UnexpectedReset => {
                "the guest reset without the agent's power-off or a panic (a triple fault?)"
            }
            ExitStatus::KvmFailure => {
                "KVM could not run the guest (a failed entry or an internal error)"
            }
        }
    }

    /// The status of a run's outcome.
    pub fn of(outcome: &Result<GuestEnd, VmmError>) -> ExitStatus {
        match outcome {
            Ok(GuestEnd::PoweredOff) => ExitStatus::PoweredOff,
            Ok(GuestEnd::Panicked) => ExitStatus::GuestPanic,
            Ok(GuestEnd::UnexpectedReset) => ExitStatus::UnexpectedReset,
            Ok(GuestEnd::Terminated) => ExitStatus::Terminated,
            Ok(GuestEnd::KvmFailure(_)) => ExitStatus::KvmFailure,
            Err(_) => ExitStatus::HostError,
        }
    }

    /// The report's line for it, on stderr at the end of every run.
    pub fn report_line(self) -> String {
        format!(
            "perfbed-vmm: exit status {} ({}): {}",
            self.code(),
            self.name(),
            self.meaning()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_own_code_and_name_and_reads_back() {
        for (i, status) in ExitStatus::ALL.iter().enumerate() {
            assert_eq!(ExitStatus::from_code(status.code()), Some(*status));
            for other in &ExitStatus::ALL[i + 1..] {
                assert_ne!(status.code(), other.code());
                assert_ne!(status.name(), other.name());
            }
        }
        assert_eq!(ExitStatus::from_code(7), None);
        assert_eq!(
            ExitStatus::from_code(0x7f),
            None,
            "the box's own failure is not ours"
        );
        // What scripts and the box rely on: 0 is only a clean power-off.
        assert_eq!(ExitStatus::PoweredOff.code(), 0);
    }

    #[test]
    fn each_outcome_has_its_status() {
        let cases = [
            (Ok(GuestEnd::PoweredOff), ExitStatus::PoweredOff),
            (Ok(GuestEnd::Panicked), ExitStatus::GuestPanic),
            (Ok(GuestEnd::UnexpectedReset), ExitStatus::UnexpectedReset),
            (Ok(GuestEnd::Terminated), ExitStatus::Terminated),
            (
                Ok(GuestEnd::KvmFailure("entry".into())),
                ExitStatus::KvmFailure,
            ),
            (Err(VmmError::EventLoop("x".into())), ExitStatus::HostError),
        ];
        for (outcome, status) in cases {
            assert_eq!(ExitStatus::of(&outcome), status, "{outcome:?}");
        }
    }
}
