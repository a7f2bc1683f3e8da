//! Looking inside a guest: gdb on QEMU's gdbstub with perfbed.ko's symbols.
//! (A failed VM's vCPU state is recorded by the host, `host::monitor`.)

pub mod gdb;
