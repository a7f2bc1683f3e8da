//! perfbed-vmm: a small VMM on KVM, built from rust-vmm crates, that boots
//! perfbed's guest with the monitoring device on its MMIO bus.
//!
//! Laid out like rust-vmm's vmm-reference and Firecracker:
//! - [`config`]: the plain structs a [`Vmm`] is built from, and their checks;
//! - [`builder`]: [`VmmBuilder`], which builds a [`Vmm`] from them;
//! - [`device_manager`]: the buses, and where each device goes (MMIO range,
//!   GSI, command-line announcement), from [`allocator`]'s windows and GSIs;
//! - [`memory`]: the guest's address space and RAM;
//! - [`boot`]: kernel and initramfs loading, command line, E820, MP table;
//! - [`vcpu`]: vCPUs, their CPUID, registers and run loop, and the handles
//!   (kick, pause, stop, join) of their threads;
//! - [`devices`]: the buses, the 8250 serial port, virtio-mmio with a
//!   virtio console, and the monitoring device;
//! - [`agent_channel`]: the agent socket served from the event loop;
//! - [`gdb`]: gdb's remote protocol for the guest (a stub thread, vCPUs
//!   as threads, software breakpoints and single-step through KVM);
//! - [`vmm`]: running a VM, and stopping it (every vCPU joined before the
//!   report); [`termination`]: SIGTERM and SIGINT as an event;
//! - [`bench`]: the exit-cost benchmark; [`stats`]: the VMM's own figures;
//!   [`panic_report`]: those figures and the serial log on a panic too.
//!
//! - [`exit_status`]: how a run ended, as the process's exit status.
//! - [`logger`]: the `log` crate's records to stderr.
//!
//! The command line (`src/main.rs`) is a thin layer over [`VmmConfig`].

pub mod agent_channel;
pub mod allocator;
pub mod bench;
pub mod boot;
pub mod builder;
pub mod config;
pub mod device_manager;
pub mod devices;
pub mod exit_status;
pub mod gdb;
pub mod logger;
pub mod memory;
pub mod panic_report;
pub mod stats;
pub mod termination;
pub mod vcpu;
pub mod vmm;

pub use builder::VmmBuilder;
pub use config::VmmConfig;
pub use exit_status::ExitStatus;
pub use vmm::{GuestEnd, Vmm, VmmError};
