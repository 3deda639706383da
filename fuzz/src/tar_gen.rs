//! Tar archives built from the fuzzer's bytes, header checksums right, so that what gets
//! exercised is what an unpacker decides (names, links, whiteouts, pax records), not the
//! checksum check. Names and link targets are drawn mostly from a small vocabulary that makes
//! entries collide, nest and point at the canary beside the scratch directory.

use std::path::Path;

use arbitrary::Arbitrary;

#[derive(Arbitrary, Debug)]
pub enum Layer {
    /// Structured entries, written as a tar stream.
    Entries {
        entries: Vec<Entry>,
        gzip: bool,
        end: End,
    },
    /// Bytes as they come: the tar (and gzip) parsers on corrupt input.
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
pub enum End {
    /// Two zero blocks, as tar writes.
    Zeros,
    /// No end-of-archive marker.
    Truncated,
    Garbage(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
pub struct Entry {
    pub name: Name,
    pub kind: Kind,
    pub mode: u16,
    pub uid: u8,
    pub gid: u8,
    pub mtime: u32,
    pub form: NameForm,
    /// `SCHILY.xattr.*` pax records.
    pub xattrs: Vec<(Xattr, Vec<u8>)>,
    /// A pax `size` record that disagrees with the header (the "TARmageddon" desync).
    pub pax_size: Option<u16>,
}

#[derive(Arbitrary, Debug)]
pub enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(Target),
    Hardlink(Target),
    Fifo,
    CharDevice(u8, u8),
    /// Any other type flag, with data.
    Other(u8, Vec<u8>),
}

/// How the name (and link name) is stored.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum NameForm {
    /// In the ustar header (prefix + name; cut when longer).
    Ustar,
    /// In a pax `path` / `linkpath` record.
    Pax,
    /// In a GNU `././@LongLink` entry before the header.
    GnuLong,
}

#[derive(Arbitrary, Debug)]
pub struct Name {
    pub parts: Vec<Part>,
    pub absolute: bool,
    pub trailing_slash: bool,
}

#[derive(Arbitrary, Debug)]
pub enum Part {
    Word(Word),
    Any(String),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Word {
    A,
    B,
    C,
    Dot,
    DotDot,
    Canary,
    Dest,
    WhiteoutA,
    WhiteoutB,
    Opaque,
    WhiteoutEmpty,
    WhiteoutDotDot,
    WhiteoutDot,
    Long,
    NonUtf8Like,
}

impl Word {
    fn text(self) -> &'static str {
        match self {
            Word::A => "a",
            Word::B => "b",
            Word::C => "c",
            Word::Dot => ".",
            Word::DotDot => "..",
            Word::Canary => "canary",
            Word::Dest => "dest",
            Word::WhiteoutA => ".wh.a",
            Word::WhiteoutB => ".wh.b",
            Word::Opaque => ".wh..wh..opq",
            Word::WhiteoutEmpty => ".wh.",
            Word::WhiteoutDotDot => ".wh...",
            Word::WhiteoutDot => ".wh..",
            Word::Long => "long-name-long-name-long-name-long-name-long-name-long-name-long-name-long-name-long-name",
            Word::NonUtf8Like => "\u{fffd}ü",
        }
    }
}

/// Where a link points.
#[derive(Arbitrary, Debug)]
pub enum Target {
    /// A name like an entry's (relative to the link's directory for symlinks, to the archive
    /// root for hard links).
    Name(Name),
    /// The canary directory (or a file in it) by absolute path.
    CanaryAbsolute(bool),
    /// `../canary` (or `../canary/file`), `../../canary`.
    CanaryRelative(u8, bool),
    /// The directory holding the scratch dir and the canary, by absolute path.
    Outside,
    Any(String),
}

/// Paths the archive may aim at: the canary and the directory around it.
pub struct Aim<'a> {
    pub canary: &'a Path,
    pub outside: &'a Path,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Xattr {
    OverlayOpaque,
    OverlayRedirect,
    UserOverlayOpaque,
    SecurityCapability,
    User,
    Any(u8),
}

impl Xattr {
    fn name(self) -> String {
        match self {
            Xattr::OverlayOpaque => "trusted.overlay.opaque".into(),
            Xattr::OverlayRedirect => "trusted.overlay.redirect".into(),
            Xattr::UserOverlayOpaque => "user.overlay.opaque".into(),
            Xattr::SecurityCapability => "security.capability".into(),
            Xattr::User => "user.x".into(),
            Xattr::Any(n) => format!("user.{n}"),
        }
    }
}

impl Name {
    pub fn render(&self) -> String {
        let mut s = String::new();
        if self.absolute {
            s.push('/');
        }
        let parts: Vec<&str> = self
            .parts
            .iter()
            .take(12)
            .map(|p| match p {
                Part::Word(w) => w.text(),
                Part::Any(a) => a.as_str(),
            })
            .collect();
        s.push_str(&parts.join("/"));
        if self.trailing_slash {
            s.push('/');
        }
        s
    }
}

impl Target {
    fn render(&self, aim: &Aim) -> String {
        match self {
            Target::Name(n) => n.render(),
            Target::CanaryAbsolute(file) => {
                let mut s = aim.canary.display().to_string();
                if *file {
                    s.push_str("/file");
                }
                s
            }
            Target::CanaryRelative(up, file) => {
                let mut s = "../".repeat(1 + (*up as usize % 3));
                s.push_str("canary");
                if *file {
                    s.push_str("/file");
                }
                s
            }
            Target::Outside => aim.outside.display().to_string(),
            Target::Any(a) => a.clone(),
        }
    }
}

const BLOCK: usize = 512;

impl Layer {
    /// The layer's bytes as a registry would serve them.
    pub fn bytes(&self, aim: &Aim) -> Vec<u8> {
        match self {
            Layer::Raw(b) => b.clone(),
            Layer::Entries { entries, gzip, end } => {
                let mut out = Vec::new();
                for e in entries.iter().take(64) {
                    e.write(&mut out, aim);
                }
                match end {
                    End::Zeros => out.extend_from_slice(&[0; 2 * BLOCK]),
                    End::Truncated => {}
                    End::Garbage(g) => out.extend_from_slice(g),
                }
                if *gzip {
                    use std::io::Write;
                    let mut z =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    z.write_all(&out).expect("writing to a Vec");
                    z.finish().expect("writing to a Vec")
                } else {
                    out
                }
            }
        }
    }
}

impl Entry {
    fn write(&self, out: &mut Vec<u8>, aim: &Aim) {
        let name = self.name.render();
        let (flag, data, link): (u8, &[u8], Option<String>) = match &self.kind {
            Kind::File(d) => (b'0', d, None),
            Kind::Dir => (b'5', &[], None),
            Kind::Symlink(t) => (b'2', &[], Some(t.render(aim))),
            Kind::Hardlink(t) => (b'1', &[], Some(t.render(aim))),
            Kind::Fifo => (b'6', &[], None),
            Kind::CharDevice(..) => (b'3', &[], None),
            Kind::Other(f, d) => (*f, d, None),
        };
        let mut pax = Vec::new();
        match self.form {
            NameForm::Pax => {
                pax_record(&mut pax, "path", name.as_bytes());
                if let Some(l) = &link {
                    pax_record(&mut pax, "linkpath", l.as_bytes());
                }
            }
            NameForm::GnuLong => {
                let mut n = name.as_bytes().to_vec();
                n.push(0);
                write_entry(out, &Header::meta(b'L', n.len()), &n);
                if let Some(l) = &link {
                    let mut l = l.as_bytes().to_vec();
                    l.push(0);
                    write_entry(out, &Header::meta(b'K', l.len()), &l);
                }
            }
            NameForm::Ustar => {}
        }
        for (x, v) in self.xattrs.iter().take(4) {
            pax_record(&mut pax, &format!("SCHILY.xattr.{}", x.name()), v);
        }
        if let Some(s) = self.pax_size {
            pax_record(&mut pax, "size", s.to_string().as_bytes());
        }
        if !pax.is_empty() {
            write_entry(out, &Header::meta(b'x', pax.len()), &pax);
        }
        let (devmajor, devminor) = match self.kind {
            Kind::CharDevice(a, b) => (a as u64, b as u64),
            _ => (0, 0),
        };
        let h = Header {
            name: name.into_bytes(),
            link: link.map(String::into_bytes).unwrap_or_default(),
            mode: (self.mode & 0o7777) as u64,
            uid: self.uid as u64,
            gid: self.gid as u64,
            size: data.len() as u64,
            mtime: self.mtime as u64,
            flag,
            devmajor,
            devminor,
        };
        write_entry(out, &h, data);
    }
}

/// `LEN key=value\n`, LEN counting itself.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

struct Header {
    name: Vec<u8>,
    link: Vec<u8>,
    mode: u64,
    uid: u64,
    gid: u64,
    size: u64,
    mtime: u64,
    flag: u8,
    devmajor: u64,
    devminor: u64,
}

impl Header {
    fn meta(flag: u8, size: usize) -> Header {
        Header {
            name: b"././@LongLink".to_vec(),
            link: Vec::new(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: size as u64,
            mtime: 0,
            flag,
            devmajor: 0,
            devminor: 0,
        }
    }

    fn block(&self) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        // ustar splits a long name at a `/` into prefix (155) and name (100); what does not
        // fit is cut, which is an input of its own.
        let (prefix, name) = split_ustar(&self.name);
        put(&mut b[0..100], name);
        octal(&mut b[100..108], self.mode);
        octal(&mut b[108..116], self.uid);
        octal(&mut b[116..124], self.gid);
        octal(&mut b[124..136], self.size);
        octal(&mut b[136..148], self.mtime);
        b[156] = self.flag;
        put(&mut b[157..257], &self.link);
        b[257..263].copy_from_slice(b"ustar\0");
        b[263..265].copy_from_slice(b"00");
        put(&mut b[265..297], b"root");
        put(&mut b[297..329], b"root");
        octal(&mut b[329..337], self.devmajor);
        octal(&mut b[337..345], self.devminor);
        put(&mut b[345..500], prefix);
        b[148..156].copy_from_slice(b"        ");
        let sum: u64 = b.iter().map(|&x| x as u64).sum();
        let text = format!("{sum:06o}\0 ");
        b[148..156].copy_from_slice(&text.as_bytes()[..8]);
        b
    }
}

fn split_ustar(name: &[u8]) -> (&[u8], &[u8]) {
    if name.len() <= 100 {
        return (&[], name);
    }
    for (i, &c) in name.iter().enumerate() {
        if c == b'/' && i <= 155 && name.len() - i - 1 <= 100 && i > 0 {
            return (&name[..i], &name[i + 1..]);
        }
    }
    (&[], name)
}

fn put(field: &mut [u8], value: &[u8]) {
    let n = value.len().min(field.len());
    field[..n].copy_from_slice(&value[..n]);
}

fn octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    let text = format!("{value:0width$o}");
    let text = &text.as_bytes()[text.len().saturating_sub(width)..];
    field[..width].copy_from_slice(text);
    field[width] = 0;
}

fn write_entry(out: &mut Vec<u8>, h: &Header, data: &[u8]) {
    out.extend_from_slice(&h.block());
    out.extend_from_slice(data);
    let pad = (BLOCK - data.len() % BLOCK) % BLOCK;
    out.extend(std::iter::repeat(0).take(pad));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tar crate reads back what this writes: names in each form, links, pax xattrs.
    #[test]
    fn tar_reads_it_back() {
        let long = "d/".repeat(80) + "f";
        let entry = |name: &str, kind, form| Entry {
            name: Name {
                parts: vec![Part::Any(name.into())],
                absolute: false,
                trailing_slash: false,
            },
            kind,
            mode: 0o640,
            uid: 1,
            gid: 2,
            mtime: 1000,
            form,
            xattrs: vec![(Xattr::User, b"v".to_vec())],
            pax_size: None,
        };
        let layer = Layer::Entries {
            entries: vec![
                entry("f", Kind::File(b"hello".to_vec()), NameForm::Ustar),
                entry(&long, Kind::File(b"x".to_vec()), NameForm::Pax),
                entry(&long, Kind::Dir, NameForm::GnuLong),
                entry(
                    "l",
                    Kind::Symlink(Target::CanaryRelative(0, true)),
                    NameForm::Ustar,
                ),
            ],
            gzip: true,
            end: End::Zeros,
        };
        let aim = Aim {
            canary: Path::new("/c"),
            outside: Path::new("/o"),
        };
        let bytes = layer.bytes(&aim);
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        let got: Vec<(String, Option<String>, u64)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.link_name().unwrap().map(|l| l.display().to_string()),
                    e.header().size().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("f".into(), None, 5),
                (long.clone(), None, 1),
                (long.clone(), None, 0),
                ("l".into(), Some("../canary/file".into()), 0),
            ]
        );
    }
}
