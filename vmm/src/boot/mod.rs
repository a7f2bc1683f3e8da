//! Everything the guest finds in memory when its first instruction runs:
//! the kernel and initramfs, the command line, the memory map and the MP
//! table.

pub mod cmdline;
pub mod e820;
pub mod loader;
pub mod mptable;

pub use loader::{load, BootEntry, LoadError};
