//! The guest's CPU topology against the device's domains: every CPU's L3
//! (`cache/index3/shared_cpu_list`) and die as the rule in
//! `perfbed_device::l3_topology` says the host makes them. With domains
//! that are a power-of-two split, that is "each domain is one L3 and one
//! die"; with others the guest cannot match them (dense APIC IDs) and the
//! check says so, and still judges the guest by the rule.
//!
//! Run on every host: perfbed-vmm lays its CPUID out by the rule, and the
//! QEMU hosts pass `-smp` sockets and cores by it (`host/qemu.rs`): x86's
//! CPUID model makes each socket one L3 and one die, the arm64 `virt`
//! board's device tree each socket one L3 (its cache nodes,
//! `images/qemu/arm64/0002`) and one package (its cpu-map).
//!
//! What the guest shows differs by architecture ([`Arch`]). x86 has a
//! `topology/die_id` and gives every L3 an `id` (from CPUID). arm64 has no
//! die (6.12 defines `topology_die_id` on x86 only, so there is no
//! `die_id` file): the check compares `topology/physical_package_id`, the
//! socket of the device tree's cpu-map, instead. And 6.12 gives a cache
//! described by the device tree no id (`cache_of_set_props()` sets none;
//! the kernel shares DT caches by node, `fw_token`), so on arm64 a missing
//! `index3/id` is no fault; ids that are there are held to the same rule.
//!
//! perfbed.ko makes the same comparison from inside (`guest-driver/topology.rs`):
//! at registration it logs whether each domain's allowed set is one L3 by the
//! kernel's cacheinfo. [`driver_cross_check`] holds its first load's lines to
//! the rule too.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use perfbed_device::cpus::format_cpu_list;
use perfbed_device::l3_topology;

use super::Check;
use crate::build::image::arch::Arch;
use crate::guest::Guest;

/// The guest's sysfs file (under `topology/`) that names a CPU's block of
/// the rule, and what the check calls that block: x86's die, arm64's
/// package (it has no die).
fn block_file(arch: Arch) -> (&'static str, &'static str) {
    match arch {
        Arch::X86_64 => ("die_id", "die"),
        Arch::Arm64 => ("physical_package_id", "package"),
    }
}

/// Reads every CPU's L3 and die and compares them with the rule.
pub fn check(guest: &mut Guest, cpus: u8, domains: &[Vec<u32>]) -> Result<Check> {
    check_named("topology matches the domains", guest, cpus, domains)
}

/// [`check`] again once CPUs have gone offline and come back: the kernel
/// rebuilds a returning CPU's sharing maps then, not from CPUID but by
/// comparing cache leaves (`drivers/base/cacheinfo.c`), and 6.12 without
/// ACPI or device tree took every L2 and L3 for system-wide there
/// (`images/kernel/testbed-patches/0002`). On arm64 it compares the leaves'
/// device-tree nodes.
///
/// Before that it takes the last CPU offline once more and wants it gone
/// from its L3 siblings' maps (the kernel's maps hold online CPUs only; an
/// id that disagreed with the map left it there, `images/kernel/testbed-patches/0003`).
pub fn check_after_hotplug(guest: &mut Guest, cpus: u8, domains: &[Vec<u32>]) -> Result<Check> {
    let mut problems = Vec::new();
    let n = u32::from(cpus);
    let last = n - 1;
    let siblings: Vec<u32> = l3_topology::l3_of(last, n, domains)
        .into_iter()
        .filter(|&c| c != last)
        .collect();
    if !siblings.is_empty() {
        guest.set_online(last, false)?;
        let want = format_cpu_list(&siblings);
        for &cpu in &siblings {
            let path = format!("/sys/devices/system/cpu/cpu{cpu}/cache/index3/shared_cpu_list");
            match guest.read_file(&path) {
                Ok(got) if got == want => {}
                Ok(got) => problems.push(format!(
                    "with CPU {last} offline, CPU {cpu}'s L3 is shared by {got}, expected {want}"
                )),
                Err(e) => problems.push(format!("with CPU {last} offline, CPU {cpu}: {e:#}")),
            }
        }
        guest.set_online(last, true)?;
    }
    let mut check = check_named("topology after CPU hotplug", guest, cpus, domains)?;
    if !problems.is_empty() {
        problems.push(check.detail);
        check.passed = false;
        check.detail = problems.join("; ");
    }
    Ok(check)
}

fn check_named(
    name: &'static str,
    guest: &mut Guest,
    cpus: u8,
    domains: &[Vec<u32>],
) -> Result<Check> {
    let arch = guest.vm.arch;
    Ok(judge_topology(
        name,
        arch,
        u32::from(cpus),
        domains,
        |path| guest.read_file(path),
    ))
}

/// [`check_named`]'s verdict on an `arch` guest whose sysfs files `read`
/// gives (an error: no such file).
fn judge_topology(
    name: &'static str,
    arch: Arch,
    cpus: u32,
    domains: &[Vec<u32>],
    mut read: impl FnMut(&str) -> Result<String>,
) -> Check {
    let bits = l3_topology::l3_sharing_bits(cpus, domains);
    let (block_file, block) = block_file(arch);
    let mut problems = Vec::new();
    let mut l3s = Vec::new();
    let mut ids = Vec::new();
    for cpu in 0..cpus {
        let base = format!("/sys/devices/system/cpu/cpu{cpu}");
        let want = format_cpu_list(&l3_topology::l3_of(cpu, cpus, domains));
        match read(&format!("{base}/cache/index3/shared_cpu_list")) {
            Ok(got) if got == want => {}
            Ok(got) => problems.push(format!(
                "CPU {cpu}'s L3 is shared by {got}, expected {want}"
            )),
            Err(e) => problems.push(format!("CPU {cpu} has no L3 in its cacheinfo ({e:#})")),
        }
        match read(&format!("{base}/cache/index3/id")) {
            Ok(id) => ids.push((cpu, id)),
            // 6.12 gives device-tree caches no id (see the module's doc).
            Err(_) if arch == Arch::Arm64 => {}
            Err(e) => problems.push(format!("CPU {cpu} has no L3 id ({e:#})")),
        }
        match read(&format!("{base}/topology/{block_file}")) {
            Ok(got) if got == (cpu >> bits).to_string() => {}
            Ok(got) => problems.push(format!(
                "CPU {cpu} is on {block} {got}, expected {}",
                cpu >> bits
            )),
            Err(e) => problems.push(format!("CPU {cpu} has no {block_file} ({e:#})")),
        }
        if cpu & ((1 << bits) - 1) == 0 {
            l3s.push(want);
        }
    }
    // One L3, one id (what lscpu counts instances by): the same id within
    // an L3 and another in each other L3.
    for &(cpu, ref id) in &ids {
        for &(other, ref other_id) in &ids {
            let same_l3 = cpu >> bits == other >> bits;
            if cpu < other && same_l3 != (id == other_id) {
                problems.push(format!(
                    "CPUs {cpu} and {other} have L3 ids {id} and {other_id}, but {} L3",
                    if same_l3 {
                        "share one"
                    } else {
                        "are on different"
                    }
                ));
            }
        }
    }
    let mismatched = l3_topology::mismatches(cpus, domains);
    let domains_text: Vec<String> = domains.iter().map(|d| format_cpu_list(d)).collect();
    let ids_text = if ids.is_empty() {
        "no L3 ids"
    } else {
        "one id per L3"
    };
    let mut ok = format!(
        "L3s and {block}s {} = the domains {} ({ids_text})",
        l3s.join(" : "),
        domains_text.join(" : ")
    );
    if !mismatched.is_empty() {
        ok = format!(
            "L3s and {block}s {} as the rule lays them out ({ids_text}); the domains {} are not a power-of-two split, so they cannot match",
            l3s.join(" : "),
            domains_text.join(" : ")
        );
    }
    Check::from_problems(name, problems, ok)
}

/// A mask of CPUs 0-63 as the driver prints it (`{:#x}`).
fn mask_of(cpus: &[u32]) -> u64 {
    cpus.iter().filter(|&&c| c < 64).fold(0, |m, &c| m | 1 << c)
}

/// The CPU and L3 mask a "differ" line names:
/// `... differ from the kernel's cacheinfo: CPU <c>'s L3 is shared by <mask>; ...`.
fn named_cpu_and_l3(rest: &str) -> Option<(u32, u64)> {
    let (_, r) = rest.split_once(": CPU ")?;
    let (cpu, r) = r.split_once("'s L3 is shared by ")?;
    let mask = r.split(';').next()?.trim().trim_start_matches("0x");
    Some((
        cpu.parse::<u32>().ok()?,
        u64::from_str_radix(mask, 16).ok()?,
    ))
}

/// perfbed.ko's own comparison of each domain's allowed set with the
/// kernel's cacheinfo, at its first load (all CPUs online): "share one L3"
/// where the rule makes the domain an L3, "differ" where it cannot, with the
/// L3 the driver names being the one the rule gives that CPU.
pub fn driver_cross_check(serial_log: &Path, cpus: u8, domains: &[Vec<u32>]) -> Check {
    let cpus = u32::from(cpus);
    let online: Vec<u32> = (0..cpus).collect();
    let (problems, seen) = judge_logged(serial_log, 0, cpus, domains, &online);
    Check::from_problems(
        "driver's cacheinfo cross-check",
        problems,
        format!("perfbed.ko at load: domain {}", seen.join(", ")),
    )
}

/// Judges perfbed.ko's first cross-check lines in the serial log from byte
/// `from` on with [`judge_lines`], waiting up to two seconds for them (the
/// console is copied to the log by another thread).
fn judge_logged(
    serial_log: &Path,
    from: usize,
    cpus: u32,
    domains: &[Vec<u32>],
    online: &[u32],
) -> (Vec<String>, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let log = std::fs::read(serial_log).unwrap_or_default();
        let log = String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned();
        let judged = judge_lines(&log, cpus, domains, online);
        if judged.0.is_empty() || Instant::now() >= deadline {
            return judged;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// What perfbed.ko's comparison (`guest-driver/topology.rs`) says of a
/// domain when only `online` CPUs are online: it compares the online
/// allowed CPUs with the kernel's L3 maps, which hold online CPUs only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every online allowed CPU's L3 is shared by exactly the online allowed CPUs.
    Shares,
    /// Some online allowed CPU's L3 (its online part) is another set.
    Differs,
    NoneOnline,
}

/// The rule's L3 of `cpu`, as the kernel's map holds it with `online` CPUs.
fn online_l3_of(cpu: u32, cpus: u32, domains: &[Vec<u32>], online: &[u32]) -> Vec<u32> {
    l3_topology::l3_of(cpu, cpus, domains)
        .into_iter()
        .filter(|c| online.contains(c))
        .collect()
}

/// [`Verdict`] for `domain` by the rule. Note that it depends on which CPUs
/// are online: a domain that cannot be an L3 (`0-2` of `0-2:3-5`) "shares
/// one L3" while the CPUs that break it (3) are offline.
pub fn expected_verdict(
    cpus: u32,
    domains: &[Vec<u32>],
    domain: &[u32],
    online: &[u32],
) -> Verdict {
    let mut allowed: Vec<u32> = domain
        .iter()
        .copied()
        .filter(|c| online.contains(c))
        .collect();
    allowed.sort_unstable();
    if allowed.is_empty() {
        return Verdict::NoneOnline;
    }
    if allowed
        .iter()
        .all(|&c| online_l3_of(c, cpus, domains, online) == allowed)
    {
        Verdict::Shares
    } else {
        Verdict::Differs
    }
}

/// The CPUs [`driver_cross_check_offline`] takes offline: every CPU of the
/// last domain of two or more CPUs without CPU 0 (the run insists on one),
/// so that it is "none online" and, where the split is not aligned, its
/// neighbours' L3 maps shrink.
fn offline_for_reload(domains: &[Vec<u32>]) -> Vec<u32> {
    domains
        .iter()
        .rev()
        .find(|d| d.len() >= 2 && !d.contains(&0))
        .cloned()
        .unwrap_or_default()
}

/// Judges the first cross-check line perfbed.ko logged for each domain in
/// `log` (the serial log from a load on) against [`expected_verdict`] with
/// `online` CPUs online; a "differ" must name an online CPU and the online
/// CPUs of the L3 the rule gives it.
fn judge_lines(
    log: &str,
    cpus: u32,
    domains: &[Vec<u32>],
    online: &[u32],
) -> (Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for (d, domain) in domains.iter().enumerate() {
        let prefix = format!("perfbed_l3_{d}: allowed CPUs {:#x}", mask_of(domain));
        let Some(rest) = log
            .lines()
            .filter_map(|l| l.split_once(&prefix).map(|(_, r)| r.to_string()))
            .find(|r| r.contains("cacheinfo"))
        else {
            problems.push(format!("perfbed_l3_{d} logged no cacheinfo cross-check"));
            continue;
        };
        let want = expected_verdict(cpus, domains, domain, online);
        let got = if rest.starts_with(" share one L3") {
            Verdict::Shares
        } else if rest.starts_with(": none online") {
            Verdict::NoneOnline
        } else {
            Verdict::Differs
        };
        if got != want {
            problems.push(format!(
                "with CPUs {} online, perfbed_l3_{d} should say {want:?}:{rest}",
                format_cpu_list(online)
            ));
            continue;
        }
        if got == Verdict::Differs {
            match named_cpu_and_l3(&rest) {
                Some((cpu, l3)) if l3 == mask_of(&online_l3_of(cpu, cpus, domains, online)) => {}
                _ => {
                    problems.push(format!(
                        "perfbed_l3_{d} should name an online CPU and its L3's online CPUs:{rest}"
                    ));
                    continue;
                }
            }
        }
        seen.push(format!("{d} {want:?}"));
    }
    (problems, seen)
}

/// perfbed.ko reloaded with a whole domain offline ([`offline_for_reload`]):
/// its per-domain lines follow [`expected_verdict`], "none online" for that
/// domain. Expects the module loaded and every CPU online; leaves both so.
pub fn driver_cross_check_offline(
    guest: &mut Guest,
    cpus: u8,
    domains: &[Vec<u32>],
) -> Result<Check> {
    use crate::guest::MODULE;
    use perfbed_agent::HostRequest;
    let cpus = u32::from(cpus);
    let offline = offline_for_reload(domains);
    let online: Vec<u32> = (0..cpus).filter(|c| !offline.contains(c)).collect();
    // Loaded after the PMU checks; an earlier failure may have left it out.
    let _ = guest.ask(HostRequest::UnloadModule {
        name: MODULE.into(),
    })?;
    for &cpu in offline.iter().rev() {
        guest.set_online(cpu, false)?;
    }
    let serial_log = guest.vm.serial_log.clone();
    let from = std::fs::metadata(&serial_log).map(|m| m.len()).unwrap_or(0) as usize;
    guest.expect_done(HostRequest::LoadModule {
        name: MODULE.into(),
    })?;
    let (problems, seen) = judge_logged(&serial_log, from, cpus, domains, &online);
    for &cpu in &offline {
        guest.set_online(cpu, true)?;
    }
    Ok(Check::from_problems(
        "driver's cross-check with a domain offline",
        problems,
        format!(
            "perfbed.ko reloaded with CPUs {} offline: domain {}",
            format_cpu_list(&offline),
            seen.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with(lines: &[&str]) -> tempfile_log::Log {
        tempfile_log::Log::new(lines)
    }

    /// A serial log in a file of its own, removed when dropped.
    mod tempfile_log {
        use std::path::PathBuf;

        pub struct Log(pub PathBuf);

        impl Log {
            pub fn new(lines: &[&str]) -> Log {
                let path = std::env::temp_dir().join(format!(
                    "perfbed-topology-test-{}-{:?}.log",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::write(&path, lines.join("\n")).unwrap();
                Log(path)
            }
        }

        impl Drop for Log {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    /// The sysfs of a guest with `files` (path below
    /// `/sys/devices/system/cpu/` to contents) and nothing else.
    fn sysfs(files: &[(String, String)]) -> impl FnMut(&str) -> Result<String> + '_ {
        |path| {
            let rel = path.trim_start_matches("/sys/devices/system/cpu/");
            files
                .iter()
                .find(|(p, _)| p == rel)
                .map(|(_, text)| text.clone())
                .ok_or_else(|| anyhow::anyhow!("reading {path}: no such file"))
        }
    }

    /// What 6.12 shows on 4 CPUs whose L3s are `0-1` and `2-3`: the L3's
    /// CPUs, its id where `ids`, and the block in `block_file`.
    fn two_l3s(ids: bool, block_file: &str) -> Vec<(String, String)> {
        let mut files = Vec::new();
        for cpu in 0..4u32 {
            let l3 = if cpu < 2 { "0-1" } else { "2-3" };
            files.push((format!("cpu{cpu}/cache/index3/shared_cpu_list"), l3.into()));
            if ids {
                files.push((format!("cpu{cpu}/cache/index3/id"), (cpu / 2).to_string()));
            }
            files.push((
                format!("cpu{cpu}/topology/{block_file}"),
                (cpu / 2).to_string(),
            ));
        }
        files
    }

    #[test]
    fn arm64_is_judged_by_its_packages_and_needs_no_l3_ids() {
        let halves = vec![vec![0, 1], vec![2, 3]];
        // arm64 on the virt board: device-tree caches (no id), packages, no die.
        let arm64 = two_l3s(false, "physical_package_id");
        let check = judge_topology("t", Arch::Arm64, 4, &halves, sysfs(&arm64));
        assert!(check.passed, "{}", check.detail);
        assert!(
            check.detail.contains("L3s and packages 0-1 : 2-3"),
            "{}",
            check.detail
        );
        // x86 wants a die_id and an L3 id: the same files fail there.
        let check = judge_topology("t", Arch::X86_64, 4, &halves, sysfs(&arm64));
        let missing = ["CPU 0 has no die_id", "CPU 0 has no L3 id"];
        assert!(!check.passed, "{}", check.detail);
        for what in missing {
            assert!(check.detail.contains(what), "{what}: {}", check.detail);
        }
        let x86 = two_l3s(true, "die_id");
        let check = judge_topology("t", Arch::X86_64, 4, &halves, sysfs(&x86));
        assert!(check.passed, "{}", check.detail);
        // An arm64 CPU in the wrong package fails, and so do ids it has
        // that do not follow the L3s.
        let mut wrong = arm64.clone();
        wrong[5].1 = "0".into();
        assert_eq!(wrong[5].0, "cpu2/topology/physical_package_id");
        let check = judge_topology("t", Arch::Arm64, 4, &halves, sysfs(&wrong));
        assert!(
            check.detail.contains("CPU 2 is on package 0, expected 1"),
            "{}",
            check.detail
        );
        let mut one_id = two_l3s(true, "physical_package_id");
        for (path, text) in &mut one_id {
            if path.ends_with("/id") {
                *text = "0".into();
            }
        }
        assert!(!judge_topology("t", Arch::Arm64, 4, &halves, sysfs(&one_id)).passed);
    }

    #[test]
    fn one_l3_for_every_cpu_fails_on_arm64() {
        // The board's L3s not by the domains (a plain `-smp 4`: one socket).
        let mut files = Vec::new();
        for cpu in 0..4 {
            files.push((
                format!("cpu{cpu}/cache/index3/shared_cpu_list"),
                "0-3".into(),
            ));
            files.push((format!("cpu{cpu}/topology/physical_package_id"), "0".into()));
        }
        let halves = vec![vec![0, 1], vec![2, 3]];
        let check = judge_topology("t", Arch::Arm64, 4, &halves, sysfs(&files));
        assert!(!check.passed);
        assert!(
            check
                .detail
                .contains("CPU 0's L3 is shared by 0-3, expected 0-1"),
            "{}",
            check.detail
        );
    }

    const AGREE_0: &str =
        "[    0.69] perfbed: perfbed_l3_0: allowed CPUs 0x3 share one L3 by the kernel's cacheinfo";
    const AGREE_1: &str =
        "[    0.69] perfbed: perfbed_l3_1: allowed CPUs 0xc share one L3 by the kernel's cacheinfo";

    #[test]
    fn aligned_domains_must_agree() {
        let domains = vec![vec![0, 1], vec![2, 3]];
        let log = log_with(&[AGREE_0, AGREE_1]);
        let check = driver_cross_check(&log.0, 4, &domains);
        assert!(check.passed, "{}", check.detail);
        // A driver that says "differ" for a domain the rule makes an L3 fails.
        let log = log_with(&[
            AGREE_0,
            "perfbed: perfbed_l3_1: allowed CPUs 0xc differ from the kernel's cacheinfo: CPU 2's L3 is shared by 0xf; placing by the device",
        ]);
        let check = driver_cross_check(&log.0, 4, &domains);
        assert!(!check.passed, "{}", check.detail);
    }

    #[test]
    fn only_the_first_load_counts() {
        let domains = vec![vec![0, 1], vec![2, 3]];
        let log = log_with(&[
            AGREE_0,
            "perfbed: perfbed_l3_1: allowed CPUs 0xc differ from the kernel's cacheinfo: CPU 2's L3 is shared by 0xf; placing by the device",
            AGREE_1,
        ]);
        assert!(!driver_cross_check(&log.0, 4, &domains).passed);
    }

    #[test]
    fn unaligned_domains_must_differ_with_the_rules_l3() {
        // 0-2 : 3-5 on 6 CPUs: the L3s are 0-3 and 4-5.
        let domains = vec![vec![0, 1, 2], vec![3, 4, 5]];
        let right = log_with(&[
            "perfbed: perfbed_l3_0: allowed CPUs 0x7 differ from the kernel's cacheinfo: CPU 0's L3 is shared by 0xf; placing by the device",
            "perfbed: perfbed_l3_1: allowed CPUs 0x38 differ from the kernel's cacheinfo: CPU 3's L3 is shared by 0xf; placing by the device",
        ]);
        let check = driver_cross_check(&right.0, 6, &domains);
        assert!(check.passed, "{}", check.detail);
        let wrong_l3 = log_with(&[
            "perfbed: perfbed_l3_0: allowed CPUs 0x7 differ from the kernel's cacheinfo: CPU 0's L3 is shared by 0x7; placing by the device",
            "perfbed: perfbed_l3_1: allowed CPUs 0x38 differ from the kernel's cacheinfo: CPU 3's L3 is shared by 0xf; placing by the device",
        ]);
        assert!(!driver_cross_check(&wrong_l3.0, 6, &domains).passed);
        let agreeing = log_with(&[
            "perfbed: perfbed_l3_0: allowed CPUs 0x7 share one L3 by the kernel's cacheinfo",
            "perfbed: perfbed_l3_1: allowed CPUs 0x38 differ from the kernel's cacheinfo: CPU 3's L3 is shared by 0xf; placing by the device",
        ]);
        assert!(!driver_cross_check(&agreeing.0, 6, &domains).passed);
    }

    #[test]
    fn a_missing_line_or_another_set_fails() {
        let domains = vec![vec![0, 1], vec![2, 3]];
        let missing = log_with(&[AGREE_0]);
        let check = driver_cross_check(&missing.0, 4, &domains);
        assert!(!check.passed);
        assert!(
            check.detail.contains("perfbed_l3_1 logged no"),
            "{}",
            check.detail
        );
        let other_set = log_with(&[
            AGREE_0,
            "perfbed: perfbed_l3_1: allowed CPUs 0x8 share one L3 by the kernel's cacheinfo",
        ]);
        assert!(!driver_cross_check(&other_set.0, 4, &domains).passed);
    }

    #[test]
    fn verdicts_follow_the_online_cpus() {
        let halves = vec![vec![0, 1], vec![2, 3]];
        assert_eq!(offline_for_reload(&halves), vec![2, 3]);
        assert_eq!(
            expected_verdict(4, &halves, &halves[0], &[0, 1]),
            Verdict::Shares
        );
        assert_eq!(
            expected_verdict(4, &halves, &halves[1], &[0, 1]),
            Verdict::NoneOnline
        );
        // One CPU of a domain back: its L3 is itself.
        assert_eq!(
            expected_verdict(4, &halves, &halves[1], &[0, 1, 3]),
            Verdict::Shares
        );
        let interleaved = vec![vec![0, 2], vec![1, 3]];
        assert_eq!(
            expected_verdict(4, &interleaved, &interleaved[0], &[0, 1, 2, 3]),
            Verdict::Differs
        );
        // The ambiguity of "comparing only online allowed CPUs": 0-2 of
        // 0-2:3-5 cannot be an L3 (the L3 is 0-3), yet with 3-5 offline the
        // kernel's maps agree with it and the driver says it shares one L3.
        let thirds = vec![vec![0, 1, 2], vec![3, 4, 5]];
        assert!(!l3_topology::mismatches(6, &thirds).is_empty());
        assert_eq!(offline_for_reload(&thirds), vec![3, 4, 5]);
        assert_eq!(
            expected_verdict(6, &thirds, &thirds[0], &[0, 1, 2]),
            Verdict::Shares
        );
        assert_eq!(
            expected_verdict(6, &thirds, &thirds[0], &[0, 1, 2, 4, 5]),
            Verdict::Shares
        );
        assert_eq!(
            expected_verdict(6, &thirds, &thirds[1], &[0, 1, 2, 4, 5]),
            Verdict::Shares
        );
        assert_eq!(
            expected_verdict(6, &thirds, &thirds[0], &[0, 1, 2, 3, 4, 5]),
            Verdict::Differs
        );
    }

    #[test]
    fn a_reload_is_judged_by_the_online_cpus() {
        let thirds = vec![vec![0, 1, 2], vec![3, 4, 5]];
        // Seen on QEMU (TCG), 6 CPUs, 0-2:3-5, CPU 3 offline.
        let log = "[ 2.1] perfbed: perfbed_l3_0: allowed CPUs 0x7 share one L3 by the kernel's cacheinfo\n\
                   [ 2.1] perfbed: perfbed_l3_1: allowed CPUs 0x38 share one L3 by the kernel's cacheinfo";
        let (problems, _) = judge_lines(log, 6, &thirds, &[0, 1, 2, 4, 5]);
        assert!(problems.is_empty(), "{problems:?}");
        let log = "perfbed: perfbed_l3_0: allowed CPUs 0x7 share one L3 by the kernel's cacheinfo\n\
                   perfbed: perfbed_l3_1: allowed CPUs 0x38: none online, not compared with the kernel's cacheinfo";
        let (problems, seen) = judge_lines(log, 6, &thirds, &[0, 1, 2]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(seen, ["0 Shares", "1 NoneOnline"]);
        // Saying "differ" with the whole L3's mask (offline CPUs in it) fails.
        let log = "perfbed: perfbed_l3_0: allowed CPUs 0x5 differ from the kernel's cacheinfo: CPU 2's L3 is shared by 0xc; placing by the device\n\
                   perfbed: perfbed_l3_1: allowed CPUs 0xa differ from the kernel's cacheinfo: CPU 1's L3 is shared by 0x3; placing by the device";
        let interleaved = vec![vec![0, 2], vec![1, 3]];
        let (problems, _) = judge_lines(log, 4, &interleaved, &[0, 1, 2]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let (problems, _) = judge_lines(log, 4, &interleaved, &[0, 1, 2, 3]);
        assert!(problems.is_empty(), "{problems:?}");
        // A missing line fails.
        let (problems, _) = judge_lines("", 4, &interleaved, &[0, 1, 2, 3]);
        assert_eq!(problems.len(), 2);
    }
}
