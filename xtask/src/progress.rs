//! What a long step shows while it runs. On a terminal: a live spinner per
//! running step (several at once when QEMU builds beside the kernel) with
//! the time so far and the time the same step took last time on this
//! machine. Elsewhere (CI, a pipe): plain lines, as before.

use std::collections::BTreeMap;
use std::fs;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::build::cache;

/// The spinners, drawn together; `None` when stderr is not a terminal.
static BARS: LazyLock<Option<MultiProgress>> =
    LazyLock::new(|| std::io::stderr().is_terminal().then(MultiProgress::new));

/// Serialises this process's updates of the timings file.
static TIMINGS_LOCK: Mutex<()> = Mutex::new(());

/// Prints a line on stderr without tearing the spinners.
pub fn say(line: &str) {
    match BARS.as_ref() {
        Some(bars) if bars.println(line).is_ok() => {}
        _ => eprintln!("{line}"),
    }
}

/// A running step's spinner.
pub struct Spinner(ProgressBar);

impl Spinner {
    /// A spinner for step `name`, or `None` when stderr is not a terminal.
    pub fn start(name: &str) -> Option<Spinner> {
        let bars = BARS.as_ref()?;
        let bar = bars.add(ProgressBar::new_spinner());
        let style = ProgressStyle::with_template("    {spinner} {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.set_message(match expected(name) {
            Some(took) => format!("{name} (last time {})", human(took)),
            None => name.to_string(),
        });
        bar.enable_steady_tick(Duration::from_millis(120));
        Some(Spinner(bar))
    }

    pub fn finish(self) {
        self.0.finish_and_clear();
        if let Some(bars) = BARS.as_ref() {
            bars.remove(&self.0);
        }
    }
}

/// Where each step's last duration is kept: per machine, beside the cache.
fn timings_file() -> Option<PathBuf> {
    cache::root()
        .ok()
        .map(|root| root.join("logs/timings.json"))
}

fn load() -> BTreeMap<String, f64> {
    timings_file()
        .and_then(|path| fs::read_to_string(path).ok())
        .and_then(|text| serde_json::from_str::<BTreeMap<String, f64>>(&text).ok())
        .unwrap_or_default()
}

/// How long step `name` took last time, if it ever ran here.
pub fn expected(name: &str) -> Option<Duration> {
    load()
        .get(name)
        .copied()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Remembers how long step `name` took. Best effort: progress display must
/// never fail a build.
pub fn record(name: &str, took: Duration) {
    let _guard = TIMINGS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(path) = timings_file() else { return };
    let mut timings = load();
    timings.insert(name.to_string(), took.as_secs_f64());
    let Ok(text) = serde_json::to_string_pretty(&timings) else {
        return;
    };
    // Written aside and renamed: another perfbed process may read it meanwhile.
    let aside = path.with_extension(format!("json.{}", std::process::id()));
    if path
        .parent()
        .is_some_and(|dir| fs::create_dir_all(dir).is_ok())
        && fs::write(&aside, text).is_ok()
    {
        let _ = fs::rename(&aside, &path);
    }
}

/// A duration as a person reads it: `4.2 s`, `3m07s`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
    }
}
