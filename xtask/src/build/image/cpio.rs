//! A minimal writer of the kernel's initramfs format: an uncompressed "newc"
//! cpio archive (Documentation/driver-api/early-userspace/buffer-format.rst).
//!
//! Written here rather than by `cpio(1)` so that the archive is a pure
//! function of its contents (no host mtimes, inode numbers or owners), which
//! makes it a stable cache key input and lets us add device nodes as non-root.
//! Left uncompressed: under TCG the kernel unpacks it faster than it inflates.

const MAGIC: &str = "070701";

pub struct Archive {
    bytes: Vec<u8>,
    next_ino: u32,
}

pub enum Kind<'a> {
    Dir,
    File { data: &'a [u8], executable: bool },
    CharDevice { major: u32, minor: u32 },
}

impl Archive {
    pub fn new() -> Archive {
        Archive {
            bytes: Vec::new(),
            next_ino: 1,
        }
    }

    /// Adds `path` (relative, no leading `/`). Parents must come first.
    pub fn add(&mut self, path: &str, kind: Kind) {
        let (mode, data, rdev): (u32, &[u8], (u32, u32)) = match kind {
            Kind::Dir => (0o040755, &[], (0, 0)),
            Kind::File { data, executable } => {
                (if executable { 0o100755 } else { 0o100644 }, data, (0, 0))
            }
            Kind::CharDevice { major, minor } => (0o020600, &[], (major, minor)),
        };
        let ino = self.next_ino;
        self.next_ino += 1;
        let nlink = if mode & 0o040000 != 0 { 2 } else { 1 };
        self.header(path, ino, mode, nlink, data.len() as u32, rdev);
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    /// Closes the archive with the `TRAILER!!!` entry.
    pub fn finish(mut self) -> Vec<u8> {
        self.header("TRAILER!!!", 0, 0, 1, 0, (0, 0));
        self.bytes
    }

    fn header(&mut self, name: &str, ino: u32, mode: u32, nlink: u32, size: u32, rdev: (u32, u32)) {
        let namesize = name.len() as u32 + 1;
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
        let fields = [
            ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.bytes.extend_from_slice(MAGIC.as_bytes());
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry read back: name, mode, rdev (major, minor), data.
    type Entry = (String, u32, (u32, u32), Vec<u8>);

    /// Reads back the entries, checking the framing.
    fn parse(bytes: &[u8]) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut at = 0;
        let field = |at: usize, i: usize| {
            let s = std::str::from_utf8(&bytes[at + 6 + 8 * i..at + 14 + 8 * i]).unwrap();
            u32::from_str_radix(s, 16).unwrap()
        };
        loop {
            assert_eq!(&bytes[at..at + 6], MAGIC.as_bytes());
            assert_eq!(at % 4, 0);
            let (mode, size, namesize) =
                (field(at, 1), field(at, 6) as usize, field(at, 11) as usize);
            let rdev = (field(at, 9), field(at, 10));
            let name_at = at + 110;
            let name = std::str::from_utf8(&bytes[name_at..name_at + namesize - 1])
                .unwrap()
                .to_string();
            assert_eq!(bytes[name_at + namesize - 1], 0);
            let data_at = (name_at + namesize + 3) & !3;
            let data = bytes[data_at..data_at + size].to_vec();
            at = (data_at + size + 3) & !3;
            if name == "TRAILER!!!" {
                assert_eq!(at, bytes.len());
                return out;
            }
            out.push((name, mode, rdev, data));
        }
    }

    #[test]
    fn entries_read_back_with_their_kinds_and_data() {
        let mut a = Archive::new();
        a.add("dev", Kind::Dir);
        a.add("dev/console", Kind::CharDevice { major: 5, minor: 1 });
        a.add(
            "init",
            Kind::File {
                data: b"12345",
                executable: true,
            },
        );
        a.add(
            "etc-x",
            Kind::File {
                data: b"",
                executable: false,
            },
        );
        let entries = parse(&a.finish());
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].0, "dev");
        assert_eq!(entries[0].1, 0o040755);
        assert_eq!(entries[1].2, (5, 1));
        assert_eq!(entries[1].1 & 0o170000, 0o020000);
        assert_eq!(
            (entries[2].0.as_str(), entries[2].1, entries[2].3.as_slice()),
            ("init", 0o100755, &b"12345"[..])
        );
        assert_eq!(entries[3].3, b"");
    }

    #[test]
    fn same_contents_give_the_same_bytes() {
        let build = || {
            let mut a = Archive::new();
            a.add(
                "init",
                Kind::File {
                    data: b"x",
                    executable: true,
                },
            );
            a.finish()
        };
        assert_eq!(build(), build());
    }
}
