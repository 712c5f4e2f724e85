//! Cubins embedded in the ELF files a process has mapped, for a late attach: PC sampling resolves
//! PCs from the cubin of each module, and the modules loaded before the injector was watching are
//! found again in the `.nv_fatbin` sections of the executable and its shared libraries (listed in
//! `/proc/self/maps`). Safe, pure Rust: LZ4 and zstd entries are decoded by `lz4_flex` and `ruzstd`.
//!
//! # Layout (all integers little-endian)
//!
//! A section holds fatbin *blobs* back to back, one per translation unit or device link, each
//! aligned (8 bytes, `__align__(8)` in CUDA's `fatbinary.h`; 16 seen from some linkers) with zero
//! bytes between them. A blob is a 16-byte header then entries:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `0xBA55ED50` |
//! | 4 | 2 | version, 1 |
//! | 6 | 2 | header size (16): entries start here |
//! | 8 | 8 | `fatSize`: bytes of entries after the header |
//!
//! Each entry is a header of at least 64 bytes (PTX entries and sm_100+ cubins have longer ones)
//! followed by its payload, padded to 8 bytes:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | kind: 1 PTX, 2 ELF (cubin), 4 old cubin, 8 NVVM IR; 0x10 and 0x40 seen, unnamed |
//! | 2 | 2 | header version, 0x0101 |
//! | 4 | 4 | header size: the payload starts here |
//! | 8 | 8 | padded payload size: the next entry starts at payload + this |
//! | 16 | 4 | payload size (compressed size when compressed) |
//! | 24 | 4 | PTX/ELF version (minor u16, major u16) |
//! | 28 | 4 | SM number: 90 for sm_90 |
//! | 32 | 8 | object name offset and length (optional) |
//! | 40 | 8 | flags: 0x1 64-bit, 0x2 debug, 0x10 Linux, 0x1000 / 0x2000 LZ4, 0x8000 zstd |
//! | 48 | 8 | zero |
//! | 56 | 8 | uncompressed size (when compressed) |
//!
//! An LZ4 payload is one raw LZ4 *block* (no frame, no size prefix: the output size is the field at
//! 56); a zstd payload is one zstd frame (magic `28 B5 2F FD`).
//!
//! Sources: the blob header, kinds and section names from CUDA's `fatbinary.h` /
//! `fatbinary_section.h` as republished by several projects and clang's CUDA code generation
//! (`.nv_fatbin` for whole-program code, `__nv_relfatbin` for `-rdc` objects); the entry header
//! from ZLUDA (`zluda_dump` and its `dark_api` fatbin reader: field offsets, flags `CompressedLz4`
//! 0x2000 and `CompressedZstd` 0x8000, LZ4 block decoded to the size at 56),
//! n-eiling/cuda-fatbin-decompression and jiegec/fatbinary (the same layout, the LZ4 block decoder
//! with no prefix, flag 0x2000) and GrigoryEvko/nvopen-tools' format notes (padded sizes, longer
//! headers for sm_100+, zstd under flag 0x8000 in CUDA 12.8+/13).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
const BLOB_HEADER: u64 = 16;
const ENTRY_HEADER: u64 = 64;
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
/// Compression flags: 0x1000 (older toolchains) and 0x2000 are LZ4, 0x8000 is zstd.
const FLAG_LZ4: u64 = 0x1000 | 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// Largest entry accepted, compressed or not.
const MAX_ENTRY: u64 = 1 << 30;
/// Largest section [`fatbin_section`] reads into memory.
const MAX_SECTION: u64 = 4 << 30;
/// Largest ELF section table and section name table read.
const MAX_TABLE: u64 = 64 << 20;
/// ELF section type of a section with no bytes in the file.
const SHT_NOBITS: u32 = 8;

/// What a fatbin entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// PTX text (JIT-compiled by the driver).
    Ptx,
    /// An ELF cubin (SASS).
    Cubin,
    /// Any other kind (4 old cubin, 8 NVVM IR, ...).
    Other(u16),
}

/// One fatbin entry, decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    /// SM number (90 for sm_90).
    pub sm: u32,
    /// Whether the payload was compressed (LZ4 or zstd).
    pub compressed: bool,
    /// The decompressed payload; PTX text usually ends with a NUL.
    pub data: Vec<u8>,
}

/// Malformed fatbin contents. Offsets are from the start of the section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatbinError {
    /// Neither zero padding nor a blob magic where a blob should start.
    BadMagic { offset: u64 },
    /// A header or payload runs past its blob or the section.
    Truncated { offset: u64 },
    /// A header field out of range.
    Malformed { offset: u64, what: &'static str },
    /// An entry declares more than 1 GiB.
    TooLarge { offset: u64, size: u64 },
    /// The payload of the entry at `offset` did not decompress.
    Decompress { offset: u64, detail: String },
    /// Reading the file failed.
    Io(io::ErrorKind),
}

impl fmt::Display for FatbinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FatbinError::BadMagic { offset } => write!(f, "no fatbin magic at {offset:#x}"),
            FatbinError::Truncated { offset } => write!(f, "fatbin truncated at {offset:#x}"),
            FatbinError::Malformed { offset, what } => write!(f, "bad {what} at {offset:#x}"),
            FatbinError::TooLarge { offset, size } => write!(f, "entry at {offset:#x} declares {size} bytes"),
            FatbinError::Decompress { offset, detail } => write!(f, "entry at {offset:#x}: {detail}"),
            FatbinError::Io(kind) => write!(f, "reading the fatbin: {kind}"),
        }
    }
}

impl std::error::Error for FatbinError {}

/// Counts from [`cubins_for_sm_stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Blobs walked.
    pub blobs: usize,
    /// Entries walked, of every kind and SM.
    pub entries: usize,
    /// Cubins of the SM returned.
    pub matched: usize,
    /// Cubins of the SM that failed to read or decompress (skipped).
    pub failed: usize,
    /// The error that ended the walk early, if one did (the entries before it count).
    pub error: Option<FatbinError>,
}

/// Where a fatbin section lies in an ELF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionRange {
    pub offset: u64,
    pub size: u64,
    /// True for `__nv_relfatbin` (found only when there is no `.nv_fatbin`).
    pub relocatable: bool,
}

/// The distinct files mapped in a process, in first-seen order, from the text of
/// `/proc/PID/maps`: no anonymous or pseudo mappings (`[vdso]`, `[heap]`), deleted files, devices
/// or memfds.
pub fn mapped_elf_files(maps: &str) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for line in maps.lines() {
        let Some(path) = maps_path(line) else { continue };
        let skip = !path.starts_with('/')
            || path.ends_with(" (deleted)")
            || path.starts_with("/dev/")
            || path.starts_with("/memfd:");
        if !skip && seen.insert(path) {
            out.push(PathBuf::from(path));
        }
    }
    out
}

/// The path field of a maps line (after address, perms, offset, device and inode), if any.
fn maps_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start_matches(' ');
        rest = &rest[rest.find(' ')?..];
    }
    let path = rest.trim_start_matches(' ');
    (!path.is_empty()).then_some(path)
}

/// The bytes of the fatbin section of the ELF file at `path`: `.nv_fatbin` (the fatbins the CUDA
/// runtime registers: whole-program or device-linked code, what the driver loads), else
/// `__nv_relfatbin` (relocatable `-rdc` code, input to a device link: its cubins are not the ones
/// loaded). Reads the ELF header, section table and names with positioned reads, then only that
/// section. Ok(None) for a file that is not a 64-bit little-endian ELF or has neither section.
pub fn fatbin_section(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let file = File::open(path)?;
    let Some(range) = fatbin_section_range(&file)? else { return Ok(None) };
    if range.size > MAX_SECTION {
        return Err(invalid("fatbin section larger than 4 GiB"));
    }
    let mut data = vec![0; usize::try_from(range.size).map_err(|_| invalid("section size"))?];
    file.read_exact_at(&mut data, range.offset)?;
    Ok(Some(data))
}

/// Where the fatbin section of an ELF file lies (see [`fatbin_section`] for which one).
pub fn fatbin_section_range(file: &File) -> io::Result<Option<SectionRange>> {
    let len = file.metadata()?.len();
    let mut h = [0u8; 64];
    if len < 64 {
        return Ok(None);
    }
    file.read_exact_at(&mut h, 0)?;
    if h[..4] != *b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return Ok(None);
    }
    let (shoff, shentsize) = (u64le(&h, 0x28), u64::from(u16le(&h, 0x3A)));
    let (mut shnum, mut shstrndx) = (u64::from(u16le(&h, 0x3C)), u64::from(u16le(&h, 0x3E)));
    if shoff == 0 || shentsize < 64 || shoff >= len {
        return Ok(None);
    }
    let mut first = [0u8; 64];
    file.read_exact_at(&mut first, shoff)?;
    if shnum == 0 {
        shnum = u64le(&first, 32); // more than 0xff00 sections: the count is section 0's size
    }
    if shstrndx == 0xFFFF {
        shstrndx = u64::from(u32le(&first, 40)); // SHN_XINDEX: the index is section 0's link
    }
    let table = read_range(file, len, shoff, shnum.saturating_mul(shentsize), MAX_TABLE)?;
    let shdr = |i: u64| {
        let at = usize::try_from(i * shentsize).ok()?;
        table.get(at..at.checked_add(64)?)
    };
    let Some(strtab) = shdr(shstrndx) else { return Ok(None) };
    let names = read_range(file, len, u64le(strtab, 24), u64le(strtab, 32), MAX_TABLE)?;
    let mut found = None;
    for sh in (0..shnum).filter_map(shdr) {
        let Some(name) = names.get(u32le(sh, 0) as usize..) else { continue };
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        let relocatable = match name {
            b".nv_fatbin" => false,
            b"__nv_relfatbin" => true,
            _ => continue,
        };
        if u32le(sh, 4) == SHT_NOBITS || found.is_some_and(|f: SectionRange| !f.relocatable) {
            continue;
        }
        let (offset, size) = (u64le(sh, 24), u64le(sh, 32));
        if offset.checked_add(size).is_none_or(|end| end > len) {
            return Err(invalid("fatbin section past the end of the file"));
        }
        found = Some(SectionRange { offset, size, relocatable });
    }
    Ok(found)
}

/// `size` bytes at `offset`, which must lie in the file and be at most `max`.
fn read_range(file: &File, len: u64, offset: u64, size: u64, max: u64) -> io::Result<Vec<u8>> {
    if size > max || offset.checked_add(size).is_none_or(|end| end > len) {
        return Err(invalid("ELF table out of range"));
    }
    let mut buf = vec![0; size as usize];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Every entry of a fatbin section, decompressed; the first malformed header or payload that does
/// not decompress is an error.
pub fn entries(section: &[u8]) -> Result<Vec<Entry>, FatbinError> {
    Walker::new(section).map(|raw| raw.and_then(|raw| decode(section, &raw))).collect()
}

/// The decompressed cubins for `sm` (exact match of the entry's SM) in a fatbin section, in
/// section order, skipping other kinds and entries that do not decompress.
pub fn cubins_for_sm(section: &[u8], sm: u32) -> Vec<Vec<u8>> {
    cubins_for_sm_stats(section, sm).0
}

/// [`cubins_for_sm`] with counts of what was walked, skipped and why the walk stopped.
pub fn cubins_for_sm_stats(section: &[u8], sm: u32) -> (Vec<Vec<u8>>, ScanStats) {
    scan(section, sm)
}

/// [`cubins_for_sm_stats`] for the fatbin section of the ELF file at `path`, reading only the
/// headers and the payloads of the cubins for `sm` (a library's section can be over a GiB).
pub fn file_cubins_for_sm(path: &Path, sm: u32) -> io::Result<(Vec<Vec<u8>>, ScanStats)> {
    let mut out = Vec::new();
    let stats = visit_file_cubins(path, sm, |c| out.push(c.to_vec()))?;
    Ok((out, stats))
}

/// Calls `f` with each cubin of SM `sm` in the file's fatbin section, one at a time (a
/// library's cubins together can take hundreds of MiB; one at a time, only the largest).
pub fn visit_file_cubins(path: &Path, sm: u32, mut f: impl FnMut(&[u8])) -> io::Result<ScanStats> {
    let file = File::open(path)?;
    let Some(range) = fatbin_section_range(&file)? else { return Ok(ScanStats::default()) };
    let src = FileRange { file: &file, start: range.offset, size: range.size };
    Ok(visit(&src, sm, &mut f))
}

fn scan<S: Source + ?Sized>(src: &S, sm: u32) -> (Vec<Vec<u8>>, ScanStats) {
    let mut out = Vec::new();
    let stats = visit(src, sm, &mut |c: &[u8]| out.push(c.to_vec()));
    (out, stats)
}

fn visit<S: Source + ?Sized>(src: &S, sm: u32, f: &mut dyn FnMut(&[u8])) -> ScanStats {
    let mut walker = Walker::new(src);
    let mut stats = ScanStats::default();
    for raw in walker.by_ref() {
        let raw = match raw {
            Ok(raw) => raw,
            Err(e) => {
                stats.error = Some(e);
                break;
            }
        };
        stats.entries += 1;
        if raw.kind != KIND_ELF || raw.sm != sm {
            continue;
        }
        match decode(src, &raw) {
            Ok(entry) => {
                stats.matched += 1;
                f(&entry.data);
            }
            Err(_) => stats.failed += 1,
        }
    }
    stats.blobs = walker.blobs;
    stats
}

/// Bytes of a section: a slice in memory or a range of a file.
trait Source {
    fn size(&self) -> u64;
    /// `len` bytes at `offset`; the caller has checked the range against [`Source::size`].
    fn bytes(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>, FatbinError>;
}

impl Source for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn bytes(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>, FatbinError> {
        let range = usize::try_from(offset).ok().zip(usize::try_from(len).ok());
        let slice = range.and_then(|(at, n)| self.get(at..at.checked_add(n)?));
        slice.map(Cow::Borrowed).ok_or(FatbinError::Truncated { offset })
    }
}

struct FileRange<'a> {
    file: &'a File,
    start: u64,
    size: u64,
}

impl Source for FileRange<'_> {
    fn size(&self) -> u64 {
        self.size
    }
    fn bytes(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>, FatbinError> {
        let at = self.start.checked_add(offset).ok_or(FatbinError::Truncated { offset })?;
        let mut buf = vec![0; usize::try_from(len).map_err(|_| FatbinError::Truncated { offset })?];
        self.file.read_exact_at(&mut buf, at).map_err(|e| FatbinError::Io(e.kind()))?;
        Ok(Cow::Owned(buf))
    }
}

/// An entry header as walked, before its payload is read.
struct RawEntry {
    offset: u64,
    kind: u16,
    sm: u32,
    flags: u64,
    /// Section offset of the payload and the bytes of it to read.
    payload: u64,
    len: u64,
    /// Whether `len` is the declared payload size (else the padded size: no size was declared).
    exact: bool,
    uncompressed: u64,
}

/// Walks the entry headers of every blob; stops after the first error.
struct Walker<'a, S: Source + ?Sized> {
    src: &'a S,
    pos: u64,
    blob_end: u64,
    blobs: usize,
    done: bool,
}

impl<'a, S: Source + ?Sized> Walker<'a, S> {
    fn new(src: &'a S) -> Self {
        Walker { src, pos: 0, blob_end: 0, blobs: 0, done: false }
    }

    fn step(&mut self) -> Result<Option<RawEntry>, FatbinError> {
        while self.pos >= self.blob_end {
            if !self.next_blob()? {
                return Ok(None);
            }
        }
        let at = self.pos;
        if self.blob_end - at < ENTRY_HEADER {
            return Err(FatbinError::Truncated { offset: at });
        }
        let h = self.src.bytes(at, ENTRY_HEADER)?;
        let (header_size, padded, declared) = (u64::from(u32le(&h, 4)), u64le(&h, 8), u64::from(u32le(&h, 16)));
        if header_size < ENTRY_HEADER {
            return Err(FatbinError::Malformed { offset: at, what: "entry header size" });
        }
        if padded > MAX_ENTRY {
            return Err(FatbinError::TooLarge { offset: at, size: padded });
        }
        let payload = at + header_size; // at and header_size are both below 2^33
        let next = payload.checked_add(padded).filter(|&n| n <= self.blob_end);
        self.pos = next.ok_or(FatbinError::Truncated { offset: at })?;
        let exact = declared != 0 && declared <= padded;
        Ok(Some(RawEntry {
            offset: at,
            kind: u16le(&h, 0),
            sm: u32le(&h, 28),
            flags: u64le(&h, 40),
            payload,
            len: if exact { declared } else { padded },
            exact,
            uncompressed: u64le(&h, 56),
        }))
    }

    /// Skips the zero padding before the next blob and enters it; false at the end of the section.
    fn next_blob(&mut self) -> Result<bool, FatbinError> {
        let size = self.src.size();
        loop {
            if self.pos >= size {
                return Ok(false);
            }
            let chunk = self.src.bytes(self.pos, (size - self.pos).min(64))?;
            let zeros = chunk.iter().take_while(|&&b| b == 0).count();
            self.pos += zeros as u64;
            if zeros < chunk.len() {
                break; // a blob's first byte (0x50, of the magic) is never zero
            }
        }
        let at = self.pos;
        if size - at < BLOB_HEADER {
            return Err(FatbinError::Truncated { offset: at });
        }
        let h = self.src.bytes(at, BLOB_HEADER)?;
        if u32le(&h, 0) != FATBIN_MAGIC {
            return Err(FatbinError::BadMagic { offset: at });
        }
        let (header_size, fat_size) = (u64::from(u16le(&h, 6)), u64le(&h, 8));
        if header_size < BLOB_HEADER {
            return Err(FatbinError::Malformed { offset: at, what: "blob header size" });
        }
        let end = (at + header_size).checked_add(fat_size).filter(|&end| end <= size);
        self.blob_end = end.ok_or(FatbinError::Truncated { offset: at })?;
        self.pos = at + header_size;
        self.blobs += 1;
        Ok(true)
    }
}

impl<S: Source + ?Sized> Iterator for Walker<'_, S> {
    type Item = Result<RawEntry, FatbinError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = self.step();
        self.done = !matches!(step, Ok(Some(_)));
        step.transpose()
    }
}

/// Reads and decompresses the payload of an entry.
fn decode<S: Source + ?Sized>(src: &S, raw: &RawEntry) -> Result<Entry, FatbinError> {
    let payload = src.bytes(raw.payload, raw.len)?;
    let zstd_magic = payload.starts_with(&ZSTD_MAGIC);
    let offset = raw.offset;
    let (mut data, compressed) = if raw.flags & FLAG_ZSTD != 0 || zstd_magic {
        (guarded(offset, || zstd(&payload, raw.uncompressed, offset))?, true)
    } else if raw.flags & FLAG_LZ4 != 0 {
        (guarded(offset, || lz4(&payload, raw.uncompressed, offset))?, true)
    } else {
        (payload.into_owned(), false)
    };
    let kind = match raw.kind {
        KIND_PTX => EntryKind::Ptx,
        KIND_ELF => EntryKind::Cubin,
        other => EntryKind::Other(other),
    };
    if kind == EntryKind::Cubin && !raw.exact && !compressed {
        // Only the padded size is known: cut the padding, so the bytes (and CUPTI's CRC of them)
        // are the cubin's own.
        if let Some(end) = elf_extent(&data) {
            data.truncate(end);
        }
    }
    Ok(Entry { kind, sm: raw.sm, compressed, data })
}

/// Runs a decoder, turning a panic in it into an error: this runs inside someone else's process.
fn guarded(offset: u64, f: impl FnOnce() -> Result<Vec<u8>, FatbinError>) -> Result<Vec<u8>, FatbinError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(FatbinError::Decompress { offset, detail: "decoder panicked".into() }))
}

fn lz4(input: &[u8], size: u64, offset: u64) -> Result<Vec<u8>, FatbinError> {
    // An LZ4 block expands at most 255 times: a larger claim is refused before allocating.
    let bound = (input.len() as u64).saturating_mul(255).saturating_add(64);
    if size == 0 || size > MAX_ENTRY || size > bound {
        return Err(FatbinError::Decompress { offset, detail: format!("bad LZ4 output size {size}") });
    }
    let mut out = vec![0; size as usize];
    let n = lz4_flex::block::decompress_into(input, &mut out)
        .map_err(|e| FatbinError::Decompress { offset, detail: format!("LZ4: {e}") })?;
    out.truncate(n);
    Ok(out)
}

fn zstd(input: &[u8], size: u64, offset: u64) -> Result<Vec<u8>, FatbinError> {
    let err = |e: &dyn fmt::Display| FatbinError::Decompress { offset, detail: format!("zstd: {e}") };
    let limit = if size == 0 { MAX_ENTRY } else { size.min(MAX_ENTRY) };
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(input).map_err(|e| err(&e))?;
    let mut out = Vec::with_capacity(limit.min(64 << 20) as usize);
    decoder.by_ref().take(limit + 1).read_to_end(&mut out).map_err(|e| err(&e))?;
    if out.len() as u64 > limit {
        return Err(err(&format!("more than the {limit} bytes declared")));
    }
    Ok(out)
}

/// Bytes an ELF64 little-endian image spans: the end of its furthest header table or section.
fn elf_extent(elf: &[u8]) -> Option<usize> {
    let h = elf.get(..64)?;
    if h[..4] != *b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let phdrs = u64::from(u16le(h, 0x36)) * u64::from(u16le(h, 0x38));
    let (shoff, shentsize, shnum) = (u64le(h, 0x28), u64::from(u16le(h, 0x3A)), u64::from(u16le(h, 0x3C)));
    let mut end = 64u64.max(u64le(h, 0x20).checked_add(phdrs)?).max(shoff.checked_add(shentsize * shnum)?);
    for i in 0..shnum {
        let at = usize::try_from(shoff.checked_add(i * shentsize)?).ok()?;
        let sh = elf.get(at..at.checked_add(64)?)?;
        if u32le(sh, 4) != SHT_NOBITS {
            end = end.max(u64le(sh, 24).checked_add(u64le(sh, 32))?);
        }
    }
    usize::try_from(end).ok().filter(|&end| end <= elf.len())
}

fn u16le(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64le(b: &[u8], at: usize) -> u64 {
    u64::from(u32le(b, at)) | (u64::from(u32le(b, at + 4)) << 32)
}

#[cfg(test)]
#[path = "fatbin_tests.rs"]
pub(crate) mod tests;
