//! Events on the wire: their names in the control protocol and the trace,
//! and which of them the device counts cumulatively.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::regs::Event;

/// The wire name of an event (`"mbm_total_bytes"`, ...).
pub fn event_name(event: Event) -> &'static str {
    match event {
        Event::LlcOccupancy => "llc_occupancy",
        Event::MbmTotalBytes => "mbm_total_bytes",
        Event::MbmLocalBytes => "mbm_local_bytes",
    }
}

/// The event with wire name `name`.
pub fn parse_event(name: &str) -> Option<Event> {
    [
        Event::LlcOccupancy,
        Event::MbmTotalBytes,
        Event::MbmLocalBytes,
    ]
    .into_iter()
    .find(|&e| event_name(e) == name)
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(event_name(*self))
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(event_name(*self))
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Event, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Event;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event name (llc_occupancy, mbm_total_bytes, mbm_local_bytes) or id")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Event, E> {
                parse_event(v).ok_or_else(|| E::custom(format!("unknown event {v:?}")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Event, E> {
                Event::from_u64(v).ok_or_else(|| E::custom(format!("unknown event id {v}")))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Index of a cumulative event in per-RMID arrays.
pub(super) fn cumulative_index(event: Event) -> Option<usize> {
    match event {
        Event::MbmTotalBytes => Some(0),
        Event::MbmLocalBytes => Some(1),
        Event::LlcOccupancy => None,
    }
}

pub(super) const CUMULATIVE: [Event; 2] = [Event::MbmTotalBytes, Event::MbmLocalBytes];
