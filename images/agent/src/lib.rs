//! The agent channel's wire protocol: one JSON object per line over the guest's
//! virtio console (`/dev/hvc0`), host requests in, agent messages out.
//!
//! This is the one definition both sides use: the agent (this crate's binary)
//! and xtask, which drives the guest.
//!
//! The exchange always starts with the agent: once the guest is up it sends
//! [`AgentMessage::Hello`]; after that it answers each [`HostRequest`] with
//! exactly one [`AgentMessage`], in order.

use serde::{Deserialize, Serialize};

/// Where the agent talks to the host.
pub const CHANNEL_DEVICE: &str = "/dev/hvc0";

/// Kernel command-line prefix for the agent's own settings (the kernel passes
/// dotted parameters to no one, but keeps them in `/proc/cmdline`).
pub const CMDLINE_PREFIX: &str = "perfbed_agent.";

/// Guest-side facts gathered before the agent is ready for requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// `uname -r` of the guest kernel.
    pub kernel_release: String,
    /// `/sys/devices/system/cpu/online`, as the kernel prints it.
    pub cpus_online: String,
    /// `/sys/devices/system/cpu/possible`.
    pub cpus_possible: String,
    /// Guest uptime when the agent became ready, in milliseconds.
    pub uptime_ms: u64,
    /// Every module the agent tried to load, in load order.
    pub modules: Vec<ModuleLoad>,
}

/// The outcome of loading one module from the initramfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleLoad {
    pub name: String,
    /// Parameters passed to the module (taken from the kernel command line).
    pub params: String,
    /// `None` when the module loaded; otherwise the reason it did not.
    pub error: Option<String>,
}

/// One offline-all-then-online-all round of CPU hotplug.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotplugRound {
    pub round: u32,
    /// Time to take every CPU but 0 offline, in microseconds.
    pub offline_us: u64,
    /// Time to bring them back, in microseconds.
    pub online_us: u64,
    /// Every mismatch between the expected and the reported online mask,
    /// and every sysfs write that failed. Empty when the round passed.
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum HostRequest {
    /// Take every CPU but 0 offline and back online, `rounds` times, checking
    /// `/sys/devices/system/cpu/online` after each CPU.
    Hotplug { rounds: u32 },
    /// Sync and power the guest off. The agent answers before it does.
    PowerOff,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum AgentMessage {
    Hello(Hello),
    Hotplug { rounds: Vec<HotplugRound> },
    PoweringOff,
    /// A request the agent could not parse or carry out.
    Error { error: String },
}

/// Parses a CPU list as the kernel prints it in sysfs (`0-2,5`).
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, String> {
    let text = text.trim();
    let mut cpus = Vec::new();
    if text.is_empty() {
        return Ok(cpus);
    }
    for part in text.split(',') {
        let bad = || format!("bad CPU list {text:?}: {part:?}");
        match part.split_once('-') {
            Some((first, last)) => {
                let first: u32 = first.parse().map_err(|_| bad())?;
                let last: u32 = last.parse().map_err(|_| bad())?;
                if last < first {
                    return Err(bad());
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(cpus)
}

/// Formats CPUs as the kernel does (`0-2,5`); the input must be sorted.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip() {
        for text in ["", "0", "0-3", "0,2-3", "1,3,5-7"] {
            let cpus = parse_cpu_list(text).unwrap();
            assert_eq!(format_cpu_list(&cpus), text);
        }
        assert_eq!(parse_cpu_list("0-2,5\n").unwrap(), vec![0, 1, 2, 5]);
    }

    #[test]
    fn bad_cpu_lists_are_refused() {
        for text in ["x", "3-1", "0-", "1,,2", "-1"] {
            assert!(parse_cpu_list(text).is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn requests_and_messages_are_one_line_of_json() {
        let req = HostRequest::Hotplug { rounds: 3 };
        let line = serde_json::to_string(&req).unwrap();
        assert_eq!(line, r#"{"request":"hotplug","rounds":3}"#);
        assert_eq!(serde_json::from_str::<HostRequest>(&line).unwrap(), req);
        let msg = AgentMessage::Error { error: "no\nnewline".into() };
        let line = serde_json::to_string(&msg).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<AgentMessage>(&line).unwrap(), msg);
    }
}
