//! The C ABI behind `images/qemu/perfbed.h`: QEMU's shim creates the device,
//! forwards each MMIO access with the accessing vCPU's index, and frees it.
//!
//! Everything here is a thin, checked conversion between C and
//! [`perfbed_device::SharedDevice`]; the device itself validates every guest
//! access and never panics on one.

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::ptr;

use perfbed_device::cpus::parse_domain_list;
use perfbed_device::{ControlServer, DeviceConfig, SharedDevice};

/// What QEMU holds: the device and its control socket, which lives as long
/// as the device does.
pub struct PerfbedDevice {
    device: SharedDevice,
    _control: Option<ControlServer>,
}

/// The `trace_capacity` that means "the device's default"
/// (`PERFBED_TRACE_DEFAULT` in perfbed.h).
pub const TRACE_DEFAULT: u32 = u32::MAX;

/// The shim's properties; 0 means "the default" for all but
/// `trace_capacity`, where 0 means no trace and [`TRACE_DEFAULT`] the
/// default.
pub struct Properties<'a> {
    pub domains: &'a str,
    pub rmids: u32,
    pub slots: u32,
    pub width: u32,
    pub max_rate: u64,
    pub trace_capacity: u32,
}

/// Builds a device config from the shim's properties.
pub fn config_from_properties(p: &Properties<'_>) -> Result<DeviceConfig, String> {
    let Properties { domains, rmids, slots, width, max_rate, trace_capacity } = *p;
    let mut config = DeviceConfig::default();
    if !domains.is_empty() {
        config.domains = parse_domain_list(domains).map_err(|e| format!("domains={domains:?}: {e}"))?;
    }
    if rmids != 0 {
        config.rmids = rmids;
    }
    if slots != 0 {
        config.slots = slots;
    }
    if width != 0 {
        config.counter_width = width;
    }
    if max_rate != 0 {
        config.max_rate = max_rate;
    }
    if trace_capacity != TRACE_DEFAULT {
        config.trace_capacity = trace_capacity as usize;
    }
    Ok(config)
}

fn new_device(properties: &Properties<'_>, control: Option<&Path>) -> Result<PerfbedDevice, String> {
    let config = config_from_properties(properties)?;
    let device = SharedDevice::new(config).map_err(|e| e.to_string())?;
    let control = match control {
        Some(path) => Some(
            device
                .serve_control(path)
                .map_err(|e| format!("control socket {}: {e}", path.display()))?,
        ),
        None => None,
    };
    Ok(PerfbedDevice { device, _control: control })
}

/// # Safety
/// `domains` must be a valid C string; `control` NULL or a valid C string;
/// `error` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_new(
    domains: *const c_char,
    rmids: u32,
    slots: u32,
    width: u32,
    max_rate: u64,
    control: *const c_char,
    trace_capacity: u32,
    error: *mut *mut c_char,
) -> *mut PerfbedDevice {
    // SAFETY: the caller passes NULL or a valid C string for both.
    let (domains, control) = unsafe { (optional_str(domains), optional_str(control)) };
    let result = match (domains, control) {
        (Ok(d), Ok(c)) => {
            let properties = Properties { domains: d.unwrap_or(""), rmids, slots, width, max_rate, trace_capacity };
            new_device(&properties, c.map(Path::new))
        }
        _ => Err("a property is not valid UTF-8".to_string()),
    };
    match result {
        Ok(device) => Box::into_raw(Box::new(device)),
        Err(message) => {
            if !error.is_null() {
                let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
                // SAFETY: error is non-NULL and the caller promised it writable.
                unsafe { *error = message.into_raw() };
            }
            ptr::null_mut()
        }
    }
}

/// # Safety
/// `s` must be NULL or a valid C string.
unsafe fn optional_str<'a>(s: *const c_char) -> Result<Option<&'a str>, std::str::Utf8Error> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller guarantees a valid C string.
    unsafe { CStr::from_ptr(s) }.to_str().map(Some)
}

/// # Safety
/// `dev` must come from `perfbed_device_new` and not be freed.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_size(dev: *const PerfbedDevice) -> u64 {
    // SAFETY: per the contract above.
    unsafe { &*dev }.device.size()
}

/// # Safety
/// `dev` must come from `perfbed_device_new` and not be freed.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_read(dev: *mut PerfbedDevice, vcpu: u32, offset: u64, size: u32) -> u64 {
    // SAFETY: per the contract above; the device is shared behind a lock.
    unsafe { &*dev }.device.mmio_read(vcpu, offset, size)
}

/// # Safety
/// `dev` must come from `perfbed_device_new` and not be freed.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_write(dev: *mut PerfbedDevice, vcpu: u32, offset: u64, size: u32, value: u64) {
    // SAFETY: per the contract above.
    unsafe { &*dev }.device.mmio_write(vcpu, offset, size, value)
}

/// # Safety
/// `dev` must be NULL or come from `perfbed_device_new`, freed only once.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_free(dev: *mut PerfbedDevice) {
    if !dev.is_null() {
        // SAFETY: it came from Box::into_raw in perfbed_device_new.
        drop(unsafe { Box::from_raw(dev) });
    }
}

/// # Safety
/// `s` must be NULL or a string this library returned, freed only once.
#[no_mangle]
pub unsafe extern "C" fn perfbed_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: it came from CString::into_raw.
        drop(unsafe { CString::from_raw(s) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_become_a_config() {
        let props = |domains, rmids, slots, width, max_rate, trace_capacity| Properties {
            domains,
            rmids,
            slots,
            width,
            max_rate,
            trace_capacity,
        };
        let c = config_from_properties(&props("0-1:2-3", 0, 0, 0, 0, TRACE_DEFAULT)).unwrap();
        assert_eq!(c.domains, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(c.rmids, DeviceConfig::default().rmids);
        assert_eq!(c.trace_capacity, perfbed_device::TRACE_CAPACITY);
        let c = config_from_properties(&props("0,2", 16, 2, 32, 1 << 20, 0)).unwrap();
        assert_eq!((c.domains.len(), c.rmids, c.slots, c.counter_width, c.max_rate), (1, 16, 2, 32, 1 << 20));
        assert_eq!(c.trace_capacity, 0);
        assert!(config_from_properties(&props("0-x", 0, 0, 0, 0, TRACE_DEFAULT)).is_err());
    }

    #[test]
    fn the_c_abi_creates_reads_and_refuses_bad_configs() {
        let domains = CString::new("0-1:2-3").unwrap();
        let mut error = ptr::null_mut();
        // SAFETY: valid strings and a valid error pointer.
        let dev = unsafe { perfbed_device_new(domains.as_ptr(), 0, 0, 0, 0, ptr::null(), TRACE_DEFAULT, &mut error) };
        assert!(!dev.is_null() && error.is_null());
        // SAFETY: dev is live until freed below.
        unsafe {
            assert!(perfbed_device_size(dev) >= 4096);
            assert_eq!(perfbed_device_read(dev, 0, perfbed_device::regs::REG_MAGIC, 8), perfbed_device::regs::MAGIC_VALUE);
            perfbed_device_free(dev);
        }
        let bad = CString::new("9-1").unwrap();
        // SAFETY: as above.
        let dev = unsafe { perfbed_device_new(bad.as_ptr(), 0, 0, 0, 0, ptr::null(), 1 << 20, &mut error) };
        assert!(dev.is_null() && !error.is_null());
        // SAFETY: error came from this library.
        let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
        assert!(message.contains("9-1"), "{message}");
        // SAFETY: error came from this library, freed once.
        unsafe { perfbed_string_free(error) };
    }
}
