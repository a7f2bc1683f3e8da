//! `seeds-from-record LOG DIR`: the `vmm_bus` and `vmm_console` seeds from
//! perfbed-vmm's access record in LOG (see `perfbed_fuzz::recorded`),
//! written as `DIR/<target>/recorded-<n>`.

use std::path::PathBuf;

fn main() -> Result<(), String> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [log, dir] = &args[..] else {
        return Err("usage: seeds-from-record LOG DIR".into());
    };
    let text = std::fs::read_to_string(log).map_err(|e| format!("reading {}: {e}", log.display()))?;
    let accesses = perfbed_fuzz::recorded::parse(&text);
    if accesses.is_empty() {
        return Err(format!("{} has no `perfbed-vmm: access` lines (run with --record-accesses)", log.display()));
    }
    for (target, seeds) in perfbed_fuzz::recorded::seeds(&accesses) {
        let out = dir.join(target);
        std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
        for (n, seed) in seeds.iter().enumerate() {
            let path = out.join(format!("recorded-{n}"));
            std::fs::write(&path, seed).map_err(|e| format!("writing {}: {e}", path.display()))?;
            println!("{} ({} bytes)", path.display(), seed.len());
        }
    }
    Ok(())
}
