//! Reading newline-terminated request lines with a bounded buffer: a client
//! that sends an endless line costs the server at most `max` bytes of
//! memory, and the line is skipped, not cut into pieces that could each be
//! taken for a request.

use std::io::{self, BufRead};

/// What [`read_line`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// A line (without its newline) is in the buffer.
    Text,
    /// A line of only whitespace.
    Blank,
    /// A line longer than the limit; it was read up to its newline and
    /// dropped.
    TooLong,
    /// The stream ended inside a line (the client went away mid-request).
    Unterminated,
    /// The stream ended between lines.
    End,
}

/// Reads the next line of `reader` into `line` (cleared first, newline not
/// included), holding at most `max` bytes of it. A longer line is read up
/// to its newline and reported as [`Line::TooLong`] then.
pub fn read_line<R: BufRead>(reader: &mut R, line: &mut Vec<u8>, max: usize) -> io::Result<Line> {
    read_line_with(reader, line, max, false)
}

/// [`read_line`], but a line is reported [`Line::TooLong`] as soon as it
/// passes `max` bytes, without reading on to its newline (which may never
/// come): for a peer that is not trusted to stop.
pub fn read_line_or_stop<R: BufRead>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<Line> {
    read_line_with(reader, line, max, true)
}

fn read_line_with<R: BufRead>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
    stop: bool,
) -> io::Result<Line> {
    line.clear();
    let mut too_long = false;
    let mut started = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            line.clear();
            return Ok(if started {
                Line::Unterminated
            } else {
                Line::End
            });
        }
        started = true;
        let newline = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..newline.unwrap_or(buf.len())];
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line.clear();
                if stop {
                    return Ok(Line::TooLong);
                }
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(buf.len(), |i| i + 1);
        reader.consume(used);
        if newline.is_some() {
            return Ok(if too_long {
                Line::TooLong
            } else if line.iter().all(u8::is_ascii_whitespace) {
                Line::Blank
            } else {
                Line::Text
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufReader, Cursor, Read};

    fn lines(input: &[u8], max: usize, capacity: usize) -> Vec<(Line, Vec<u8>)> {
        let mut reader = BufReader::with_capacity(capacity, Cursor::new(input.to_vec()));
        let mut line = Vec::new();
        let mut out = Vec::new();
        loop {
            let kind = read_line(&mut reader, &mut line, max).unwrap();
            assert!(line.len() <= max, "held {} bytes, limit {max}", line.len());
            out.push((kind, line.clone()));
            if matches!(kind, Line::End | Line::Unterminated) {
                return out;
            }
        }
    }

    #[test]
    fn splits_lines_and_skips_long_ones_whole() {
        for capacity in [1, 3, 8, 1024] {
            let got = lines(b"ab\n \t\n0123456789\nxy\nz", 4, capacity);
            let want: Vec<(Line, Vec<u8>)> = vec![
                (Line::Text, b"ab".to_vec()),
                (Line::Blank, b" \t".to_vec()),
                (Line::TooLong, vec![]),
                (Line::Text, b"xy".to_vec()),
                (Line::Unterminated, vec![]),
            ];
            assert_eq!(got, want, "buffer capacity {capacity}");
        }
        assert_eq!(lines(b"", 4, 8), vec![(Line::End, vec![])]);
        assert_eq!(
            lines(b"abcd\n", 4, 2),
            vec![(Line::Text, b"abcd".to_vec()), (Line::End, vec![])]
        );
        assert_eq!(lines(b"abcde\n", 4, 2)[0].0, Line::TooLong);
    }

    #[test]
    fn stops_at_the_limit_when_asked() {
        // An endless line: stop as soon as it passes the limit.
        let mut endless = std::io::repeat(0).take(1 << 30);
        let mut reader = BufReader::with_capacity(64, &mut endless);
        let mut line = Vec::new();
        assert_eq!(
            read_line_or_stop(&mut reader, &mut line, 1000).unwrap(),
            Line::TooLong
        );
        assert!(line.is_empty());
        let mut reader = BufReader::new(Cursor::new(b"ok\n".to_vec()));
        assert_eq!(
            read_line_or_stop(&mut reader, &mut line, 1000).unwrap(),
            Line::Text
        );
        assert_eq!(line, b"ok");
    }
}
