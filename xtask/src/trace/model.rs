//! A trace file read back: the header's device shape and one [`Line`] per
//! record, device records and the guest's events alike. The format is the
//! device's (`device/README.md`, "Trace"): `<time_ns> <seq|-> <kind>
//! key=value... flag...`.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use perfbed_device::cpus::parse_cpu_list;
use perfbed_device::TRACE_MAGIC;

/// The device's shape, from the header line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub domains: Vec<Vec<u32>>,
    pub slots: u32,
    pub width: u32,
    pub unit: u64,
    pub dropped: u64,
}

/// One record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub time_ns: u64,
    /// The device's record number; `None` for lines that are not device
    /// records (`dropped`, the guest's events).
    pub seq: Option<u64>,
    pub kind: String,
    pub fields: BTreeMap<String, String>,
    pub flags: Vec<String>,
}

impl Line {
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// A numeric field, decimal or `0x` hex.
    pub fn number(&self, key: &str) -> Option<u64> {
        let v = self.field(key)?;
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    }

    /// The domain the record belongs to, if any.
    pub fn domain(&self) -> Option<usize> {
        self.number("dom").map(|d| d as usize)
    }

    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub fn parse(text: &str) -> Result<Line> {
        let mut words = text.split_whitespace();
        let time_ns = words
            .next()
            .context("an empty line")?
            .parse()
            .with_context(|| format!("no time in {text:?}"))?;
        let seq = match words.next().context("no record number")? {
            "-" => None,
            n => Some(
                n.parse()
                    .with_context(|| format!("bad record number in {text:?}"))?,
            ),
        };
        let kind = words.next().context("no kind")?.to_string();
        let mut fields = BTreeMap::new();
        let mut flags = Vec::new();
        for word in words {
            match word.split_once('=') {
                Some((k, v)) => {
                    fields.insert(k.to_string(), v.to_string());
                }
                None => flags.push(word.to_string()),
            }
        }
        Ok(Line {
            time_ns,
            seq,
            kind,
            fields,
            flags,
        })
    }
}

/// A whole trace file.
#[derive(Debug, Clone)]
pub struct Trace {
    pub shape: Shape,
    pub lines: Vec<Line>,
}

impl Trace {
    pub fn parse(text: &str) -> Result<Trace> {
        let mut rows = text.lines();
        let header = rows.next().unwrap_or_default();
        let Some(rest) = header.strip_prefix(TRACE_MAGIC) else {
            bail!("not a perfbed trace: the first line is not {TRACE_MAGIC:?}");
        };
        let field = |key: &str| -> Result<&str> {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                .with_context(|| format!("the header lacks {key}="))
        };
        let domains = field("domains")?
            .split(':')
            .map(|d| parse_cpu_list(d).map_err(|e| anyhow::anyhow!("header domains: {e}")))
            .collect::<Result<_>>()?;
        let shape = Shape {
            domains,
            slots: field("slots")?.parse()?,
            width: field("width")?.parse()?,
            unit: field("unit")?.parse()?,
            dropped: field("dropped")?.parse()?,
        };
        let lines = rows
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|(n, l)| Line::parse(l).with_context(|| format!("trace line {}", n + 2)))
            .collect::<Result<_>>()?;
        Ok(Trace { shape, lines })
    }
}
