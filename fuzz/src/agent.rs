//! The agent channel's messages as the host parses them (and the host's
//! requests as the agent parses them), from raw lines.
//!
//! Checked: parsing never panics, and whatever parses re-encodes to one
//! line that parses to the same value.

use std::io::{BufReader, Cursor};

use perfbed_agent::{parse_agent_message, AgentMessage, HostRequest};
use perfbed_device::line::{read_line, Line};
use serde::{de::DeserializeOwned, Serialize};

/// The line limit here: small, so that inputs of a few KiB reach it.
const MAX: usize = 1024;

pub fn run(bytes: &[u8]) {
    let mut reader = BufReader::new(Cursor::new(bytes));
    let mut line = Vec::new();
    loop {
        match read_line(&mut reader, &mut line, MAX).expect("reading memory cannot fail") {
            Line::End | Line::Unterminated => return,
            Line::Blank | Line::TooLong => continue,
            Line::Text => {}
        }
        if let Ok(message) = parse_agent_message(&line) {
            round_trip::<AgentMessage>(&message);
        }
        if let Ok(request) = serde_json::from_slice::<HostRequest>(&line) {
            round_trip::<HostRequest>(&request);
        }
    }
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) {
    let text = serde_json::to_string(value).expect("encodes");
    assert!(!text.contains('\n'), "one line: {text}");
    let back: T = serde_json::from_str(&text).expect("decodes");
    assert_eq!(&back, value, "{text}");
}
