//! The C ABI behind `images/qemu/perfbed.h`: QEMU's shim creates the device,
//! forwards each MMIO access with the accessing vCPU's index, and frees it.
//!
//! Everything here is a thin, checked conversion between C and
//! [`perfbed_device::SharedDevice`]; the device itself validates every guest
//! access and never panics on one.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::ptr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use perfbed_device::cpus::parse_domain_list;
use perfbed_device::host::{InterruptLines, Ticker};
use perfbed_device::{ControlServer, DeviceConfig, SharedDevice};

/// What QEMU holds: the device, its control socket and, once the lines are
/// wired, the ticker; both live as long as the device does and are stopped
/// first when it is freed (fields drop in order), so that no line news
/// reaches the shim after `perfbed_device_free`.
pub struct PerfbedDevice {
    ticker: OnceLock<Ticker>,
    _control: Option<ControlServer>,
    device: SharedDevice,
}

/// How often the ticker lets time pass while an overflow interrupt is
/// enabled: an overflow is seen within this long of landing.
pub const TICK: Duration = Duration::from_millis(2);

/// The shim's line callback (`perfbed_device_connect_lines`).
type LineCallback = unsafe extern "C" fn(opaque: *mut c_void, domain: u32, level: bool);

/// The shim's callback and its argument, as an [`InterruptLines`].
struct ShimLines {
    changed: LineCallback,
    opaque: *mut c_void,
}

// SAFETY: perfbed.h asks the shim for a callback that may be called from any
// thread (it takes QEMU's global lock or defers to a bottom half), with an
// `opaque` that stays valid until the device is freed.
unsafe impl Send for ShimLines {}
// SAFETY: as for Send: the callback is safe to call concurrently.
unsafe impl Sync for ShimLines {}

impl InterruptLines for ShimLines {
    fn set_level(&self, domain: u32, asserted: bool) {
        // SAFETY: per perfbed.h, `changed` may be called from any thread with
        // `opaque` until the device is freed, and it is freed only after the
        // ticker and the control socket, the threads that call this, stop.
        unsafe { (self.changed)(self.opaque, domain, asserted) }
    }
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
    let Properties {
        domains,
        rmids,
        slots,
        width,
        max_rate,
        trace_capacity,
    } = *p;
    let mut config = DeviceConfig::default();
    if !domains.is_empty() {
        config.domains =
            parse_domain_list(domains).map_err(|e| format!("domains={domains:?}: {e}"))?;
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

fn new_device(
    properties: &Properties<'_>,
    control: Option<&Path>,
) -> Result<PerfbedDevice, String> {
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
    Ok(PerfbedDevice {
        ticker: OnceLock::new(),
        _control: control,
        device,
    })
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
            let properties = Properties {
                domains: d.unwrap_or(""),
                rmids,
                slots,
                width,
                max_rate,
                trace_capacity,
            };
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
pub unsafe extern "C" fn perfbed_device_read(
    dev: *mut PerfbedDevice,
    vcpu: u32,
    offset: u64,
    size: u32,
) -> u64 {
    // SAFETY: per the contract above; the device is shared behind a lock.
    unsafe { &*dev }.device.mmio_read(vcpu, offset, size)
}

/// # Safety
/// `dev` must come from `perfbed_device_new` and not be freed.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_write(
    dev: *mut PerfbedDevice,
    vcpu: u32,
    offset: u64,
    size: u32,
    value: u64,
) {
    // SAFETY: per the contract above.
    unsafe { &*dev }
        .device
        .mmio_write(vcpu, offset, size, value)
}

/// # Safety
/// `dev` must come from `perfbed_device_new` and not be freed.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_domains(dev: *const PerfbedDevice) -> u32 {
    // SAFETY: per the contract above.
    unsafe { &*dev }
        .device
        .with(|d, _| d.config().domains.len() as u32)
}

/// # Safety
/// `dev` must come from `perfbed_device_new` and not be freed; `changed`
/// must be safe to call from any thread with `opaque` until `dev` is freed.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_connect_lines(
    dev: *mut PerfbedDevice,
    changed: LineCallback,
    opaque: *mut c_void,
) -> bool {
    // SAFETY: per the contract above.
    let dev = unsafe { &*dev };
    if dev.ticker.get().is_some() {
        return false;
    }
    let Ok(ticker) = dev.device.start_ticker(TICK) else {
        return false;
    };
    let _ = dev.ticker.set(ticker);
    dev.device
        .connect_lines(Arc::new(ShimLines { changed, opaque }))
}

/// # Safety
/// `dev` must come from `perfbed_device_new` and not be freed.
#[no_mangle]
pub unsafe extern "C" fn perfbed_device_line_level(dev: *mut PerfbedDevice, domain: u32) -> bool {
    // SAFETY: per the contract above.
    unsafe { &*dev }.device.line_level(domain)
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
        assert_eq!(
            (
                c.domains.len(),
                c.rmids,
                c.slots,
                c.counter_width,
                c.max_rate
            ),
            (1, 16, 2, 32, 1 << 20)
        );
        assert_eq!(c.trace_capacity, 0);
        assert!(config_from_properties(&props("0-x", 0, 0, 0, 0, TRACE_DEFAULT)).is_err());
    }

    #[test]
    fn the_c_abi_creates_reads_and_refuses_bad_configs() {
        let domains = CString::new("0-1:2-3").unwrap();
        let mut error = ptr::null_mut();
        // SAFETY: valid strings and a valid error pointer.
        let dev = unsafe {
            perfbed_device_new(
                domains.as_ptr(),
                0,
                0,
                0,
                0,
                ptr::null(),
                TRACE_DEFAULT,
                &mut error,
            )
        };
        assert!(!dev.is_null() && error.is_null());
        // SAFETY: dev is live until freed below.
        unsafe {
            assert!(perfbed_device_size(dev) >= 4096);
            assert_eq!(
                perfbed_device_read(dev, 0, perfbed_device::regs::REG_MAGIC, 8),
                perfbed_device::regs::MAGIC_VALUE
            );
            perfbed_device_free(dev);
        }
        let bad = CString::new("9-1").unwrap();
        // SAFETY: as above.
        let dev = unsafe {
            perfbed_device_new(bad.as_ptr(), 0, 0, 0, 0, ptr::null(), 1 << 20, &mut error)
        };
        assert!(dev.is_null() && !error.is_null());
        // SAFETY: error came from this library.
        let message = unsafe { CStr::from_ptr(error) }
            .to_string_lossy()
            .into_owned();
        assert!(message.contains("9-1"), "{message}");
        // SAFETY: error came from this library, freed once.
        unsafe { perfbed_string_free(error) };
    }

    /// What the shim's callback saw: (domain, level) pairs.
    static SEEN: std::sync::Mutex<Vec<(u32, bool)>> = std::sync::Mutex::new(Vec::new());

    unsafe extern "C" fn record(_opaque: *mut c_void, domain: u32, level: bool) {
        SEEN.lock().unwrap().push((domain, level));
    }

    #[test]
    fn the_c_abi_wires_the_lines() {
        use perfbed_device::regs;
        let domains = CString::new("0-1:2-3").unwrap();
        // SAFETY: valid strings, no error pointer wanted.
        let dev = unsafe {
            perfbed_device_new(
                domains.as_ptr(),
                0,
                0,
                0,
                0,
                ptr::null(),
                TRACE_DEFAULT,
                ptr::null_mut(),
            )
        };
        assert!(!dev.is_null());
        // SAFETY: dev is live until freed below; `record` may run anywhere.
        unsafe {
            assert_eq!(perfbed_device_domains(dev), 2);
            assert!(perfbed_device_connect_lines(dev, record, ptr::null_mut()));
            assert!(
                !perfbed_device_connect_lines(dev, record, ptr::null_mut()),
                "wired twice"
            );
            assert!(!perfbed_device_line_level(dev, 1));
            perfbed_device_write(
                dev,
                0,
                regs::domain_reg(1, regs::DOM_IRQ_CTL),
                8,
                regs::IRQ_CTL_CONFIG,
            );
            (*dev)
                .device
                .with(|d, now| d.set_allowed(now, 1, &[3]))
                .unwrap();
            assert!(perfbed_device_line_level(dev, 1));
            assert_eq!(
                perfbed_device_read(dev, 3, regs::domain_reg(1, regs::DOM_CONFIG_STATUS), 8),
                1
            );
            assert!(!perfbed_device_line_level(dev, 1));
            perfbed_device_free(dev);
        }
        assert_eq!(
            *SEEN.lock().unwrap(),
            vec![(0, false), (1, false), (1, true), (1, false)]
        );
    }
}
