//! perfbed's fuzz targets' logic, one module per target (the files in
//! `fuzz_targets/` only hand libFuzzer's input over). Run them with
//! `cargo xtask fuzz [target] [--seconds N]`.

pub mod agent;
pub mod config;
pub mod control;
pub mod recorded;
pub mod registers;
pub mod vmm_rig;
pub mod vmm_bus;
pub mod vmm_console;
