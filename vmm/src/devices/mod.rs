//! Device models and the buses they sit on. Devices know nothing of KVM:
//! they see `(vcpu, offset, bytes)` and an interrupt eventfd.

pub mod access_record;
pub mod bus;
pub mod perfbed;
pub mod power_off;
pub mod serial;
pub mod virtio;
