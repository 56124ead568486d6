//! The disk tier of `LocalStore`: an append-only log of segment files.
//!
//! A segment (`seg-NNNNNNNN.log`) is a sequence of records, each a 9-byte header (the
//! magic `KL3` and the format version, a kind, the body's length) and a body: an
//! object's envelope (key, checksum, payload; see `codec`) or a tombstone (a removed
//! key). Puts append whole batches with vectored writes straight from the caller's
//! pages, so the disk sees one sequential stream, as a plain file would. Nothing is
//! rewritten in place: a removed or evicted object is dropped from the index (a removal
//! also appends a tombstone, so it stays removed across a restart), a segment whose
//! objects are all gone is deleted, and when dead records take more room than live ones
//! the oldest segment's live objects are copied forward and it is deleted.
//!
//! Opening replays every segment in order: objects become live (write-once: a key's
//! first object wins), tombstones remove, a record whose envelope fails its checksum is
//! counted corrupt and skipped, and a torn header ends its segment.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{IoSlice, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::{L3Error, codec};

/// Every record's magic, with the log's format version last (2: CRC32C envelopes). A
/// segment of another format reads as empty and is deleted at open.
const MAGIC: &[u8; 4] = b"KL3\x02";
const HEADER: usize = 9;
const OBJECT: u8 = 1;
const TOMBSTONE: u8 = 2;
/// Payload bytes per write of a large batch: small enough that the checksum thread
/// stays ahead of the kernel, large enough to keep writes few.
const WRITE_CHUNK: usize = 4 << 20;

/// Where an object's envelope lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    pub segment: u32,
    /// Offset of the envelope (after its header).
    pub offset: u64,
    /// Envelope bytes.
    pub size: u32,
}

#[derive(Debug)]
struct Segment {
    path: PathBuf,
    /// Open for reads (positioned, so shared by every read); `None` if it would not open.
    reader: Option<File>,
    /// Bytes in the file.
    file_bytes: u64,
    /// Bytes of live records (headers included).
    live_bytes: u64,
}

/// One record found by [`scan`].
#[derive(Debug)]
pub(crate) enum Record {
    /// A valid object: its key and payload length.
    Object(String, u64, Extent),
    /// An object whose envelope does not verify.
    Corrupt,
    /// A removed key.
    Tombstone(String),
}

/// The segment log.
#[derive(Debug)]
pub(crate) struct Segments {
    dir: PathBuf,
    segments: BTreeMap<u32, Segment>,
    active: u32,
    writer: Option<File>,
    /// A segment is closed once it holds this many bytes.
    segment_bytes: u64,
    /// The batch's record headers and envelope prefixes, kept between appends.
    scratch: Vec<u8>,
}

fn io(path: &Path, source: std::io::Error) -> L3Error {
    L3Error::Io {
        path: path.display().to_string(),
        source,
    }
}

fn segment_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("seg-{n:08}.log"))
}

fn header(kind: u8, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(MAGIC);
    h[4] = kind;
    h[5..].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// The records of one segment file's bytes, in order; a torn header ends the list.
fn parse(segment: u32, bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= bytes.len() {
        let h = &bytes[at..at + HEADER];
        let len = u32::from_le_bytes([h[5], h[6], h[7], h[8]]) as usize;
        let body = at + HEADER;
        if &h[..4] != MAGIC || body + len > bytes.len() {
            break;
        }
        let data = &bytes[body..body + len];
        match h[4] {
            OBJECT => out.push(match codec::verified_key(data) {
                Some((key, payload)) => Record::Object(
                    key,
                    payload,
                    Extent {
                        segment,
                        offset: body as u64,
                        size: len as u32,
                    },
                ),
                None => Record::Corrupt,
            }),
            TOMBSTONE => {
                if let Ok(key) = std::str::from_utf8(data) {
                    out.push(Record::Tombstone(key.to_owned()));
                }
            }
            _ => break,
        }
        at = body + len;
    }
    out
}

/// The segment files of `dir`, by number.
fn segment_files(dir: &Path) -> Result<BTreeMap<u32, PathBuf>, L3Error> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let path = entry.map_err(|e| io(dir, e))?.path();
        let number = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("seg-"))
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(n) = number {
            found.insert(n, path);
        }
    }
    Ok(found)
}

/// Where each object's payload lies in the segment files of `dir` (file, byte range),
/// valid or not: for tests and tools that corrupt objects on purpose.
pub fn payload_extents(dir: &Path) -> Result<Vec<(PathBuf, Range<u64>)>, L3Error> {
    let mut out = Vec::new();
    for (n, path) in segment_files(dir)? {
        let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
        for record in parse(n, &bytes) {
            if let Record::Object(_, payload, extent) = record {
                let end = extent.offset + u64::from(extent.size);
                out.push((path.clone(), end - payload..end));
            }
        }
    }
    Ok(out)
}

impl Segments {
    /// Opens the log in `dir`: every record of every segment, in order, for the caller
    /// to replay. Appends go to a fresh segment.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<(Self, Vec<Record>), L3Error> {
        let mut segments = BTreeMap::new();
        let mut records = Vec::new();
        for (n, path) in segment_files(dir)? {
            let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
            records.extend(parse(n, &bytes));
            segments.insert(
                n,
                Segment {
                    reader: File::open(&path).ok(),
                    path,
                    file_bytes: bytes.len() as u64,
                    live_bytes: 0,
                },
            );
        }
        let active = segments.keys().next_back().map_or(1, |n| n + 1);
        let log = Self {
            dir: dir.to_path_buf(),
            segments,
            active,
            writer: None,
            segment_bytes: segment_bytes.max(1),
            scratch: Vec::new(),
        };
        Ok((log, records))
    }

    /// Counts a replayed record as live.
    pub fn mark_live(&mut self, extent: &Extent) {
        if let Some(s) = self.segments.get_mut(&extent.segment) {
            s.live_bytes += HEADER as u64 + u64::from(extent.size);
        }
    }

    /// Uncounts a replayed record removed by a later tombstone (files stay until
    /// [`Self::drop_dead`]).
    pub fn unmark(&mut self, extent: &Extent) {
        if let Some(s) = self.segments.get_mut(&extent.segment) {
            s.live_bytes = s
                .live_bytes
                .saturating_sub(HEADER as u64 + u64::from(extent.size));
        }
    }

    /// Bytes in all segment files.
    pub fn file_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.file_bytes).sum()
    }

    /// Appends objects (key, envelope) in one write; returns their extents. Nothing is
    /// appended on failure.
    pub fn append(&mut self, objects: &[(&str, Vec<u8>)]) -> Result<Vec<Extent>, L3Error> {
        let bodies: Vec<(u8, &[u8])> = objects.iter().map(|(_, e)| (OBJECT, &e[..])).collect();
        self.write(&bodies)
    }

    /// Appends objects (key, payload) with vectored writes: each record's header and
    /// envelope prefix come from a small buffer, its payload straight from the caller (no
    /// copy before the kernel's). A large batch has its checksums computed on a helper
    /// thread while the kernel takes the chunks already summed, so the checksum costs
    /// little beside the write. Returns the extents; on failure the store must take the
    /// whole batch as not stored.
    pub fn append_objects(&mut self, objects: &[(&str, &[u8])]) -> Result<Vec<Extent>, L3Error> {
        let bytes: usize = objects.iter().map(|(_, p)| p.len()).sum();
        if bytes < 2 * WRITE_CHUNK {
            let sums: Vec<u32> = objects.iter().map(|(k, p)| codec::checksum(k, p)).collect();
            return self.append_summed(objects, &sums);
        }
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            scope.spawn(move || {
                for (key, payload) in objects {
                    if tx.send(codec::checksum(key, payload)).is_err() {
                        return;
                    }
                }
            });
            let mut extents = Vec::with_capacity(objects.len());
            let mut rest = objects;
            while !rest.is_empty() {
                let mut n = 0;
                let mut chunk = 0;
                while n < rest.len() && (n == 0 || chunk < WRITE_CHUNK) {
                    chunk += rest[n].1.len();
                    n += 1;
                }
                // In order; should the helper be gone, the sum is computed here.
                let sums: Vec<u32> = rest[..n]
                    .iter()
                    .map(|(k, p)| rx.recv().unwrap_or_else(|_| codec::checksum(k, p)))
                    .collect();
                extents.extend(self.append_summed(&rest[..n], &sums)?);
                rest = &rest[n..];
            }
            Ok(extents)
        })
    }

    /// Appends objects whose checksums are known, in one vectored write.
    fn append_summed(
        &mut self,
        objects: &[(&str, &[u8])],
        sums: &[u32],
    ) -> Result<Vec<Extent>, L3Error> {
        let mut meta = std::mem::take(&mut self.scratch);
        meta.clear();
        // (end of this record's header and prefix in `meta`, envelope length)
        let mut heads = Vec::with_capacity(objects.len());
        for ((key, payload), &sum) in objects.iter().zip(sums) {
            let at = meta.len();
            meta.extend_from_slice(&header(OBJECT, 0));
            let len = codec::encode_prefix(&mut meta, key, sum, payload) + payload.len();
            meta[at + 5..at + HEADER].copy_from_slice(&(len as u32).to_le_bytes());
            heads.push((meta.len(), len));
        }
        let mut parts = Vec::with_capacity(2 * objects.len());
        let mut spans = Vec::with_capacity(objects.len());
        let (mut from, mut offset) = (0, 0);
        for ((_, payload), &(to, len)) in objects.iter().zip(&heads) {
            parts.push(IoSlice::new(&meta[from..to]));
            parts.push(IoSlice::new(payload));
            let record = to - from + payload.len();
            spans.push((offset + record - len, len));
            offset += record;
            from = to;
        }
        let extents = self.write_records(&mut parts, offset, &spans);
        drop(parts);
        self.scratch = meta;
        extents
    }

    /// Appends tombstones for `keys`.
    pub fn tombstones(&mut self, keys: &[&str]) -> Result<(), L3Error> {
        let bodies: Vec<(u8, &[u8])> = keys.iter().map(|k| (TOMBSTONE, k.as_bytes())).collect();
        self.write(&bodies).map(|_| ())
    }

    fn write(&mut self, bodies: &[(u8, &[u8])]) -> Result<Vec<Extent>, L3Error> {
        let total: usize = bodies.iter().map(|(_, b)| HEADER + b.len()).sum();
        let mut buf = Vec::with_capacity(total);
        let mut spans = Vec::new();
        for (kind, body) in bodies {
            buf.extend_from_slice(&header(*kind, body.len()));
            if *kind == OBJECT {
                spans.push((buf.len(), body.len()));
            }
            buf.extend_from_slice(body);
        }
        let total = buf.len();
        self.write_records(&mut [IoSlice::new(&buf)], total, &spans)
    }

    /// Appends `parts` (whole records, `total` bytes) to the active segment in one
    /// vectored write, rolling to a new segment first when it would overflow; `objects`
    /// are the (offset in the batch, length) of its object bodies, whose extents are
    /// returned.
    fn write_records(
        &mut self,
        parts: &mut [IoSlice<'_>],
        total: usize,
        objects: &[(usize, usize)],
    ) -> Result<Vec<Extent>, L3Error> {
        if total == 0 {
            return Ok(Vec::new());
        }
        let full = self
            .segments
            .get(&self.active)
            .is_some_and(|s| s.file_bytes > 0 && s.file_bytes + total as u64 > self.segment_bytes);
        if full {
            self.active += 1;
            self.writer = None;
        }
        let path = segment_path(&self.dir, self.active);
        if self.writer.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| io(&path, e))?;
            self.writer = Some(file);
            self.segments.entry(self.active).or_insert(Segment {
                reader: File::open(&path).ok(),
                path: path.clone(),
                file_bytes: 0,
                live_bytes: 0,
            });
        }
        let start = self.segments.get(&self.active).map_or(0, |s| s.file_bytes);
        let written = self
            .writer
            .as_mut()
            .map_or(Ok(()), |w| write_all_vectored(w, parts));
        if let Err(e) = written {
            // A torn tail ends the segment at the next open; write elsewhere from now.
            self.writer = None;
            self.active += 1;
            return Err(io(&path, e));
        }
        let extents: Vec<Extent> = objects
            .iter()
            .map(|&(at, len)| Extent {
                segment: self.active,
                offset: start + at as u64,
                size: len as u32,
            })
            .collect();
        if let Some(s) = self.segments.get_mut(&self.active) {
            s.file_bytes += total as u64;
            s.live_bytes += objects
                .iter()
                .map(|&(_, len)| (HEADER + len) as u64)
                .sum::<u64>();
        }
        Ok(extents)
    }

    /// Reads an object's envelope.
    pub fn read(&self, extent: &Extent) -> Option<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_into(extent, &mut buf).then_some(buf)
    }

    /// Reads an object's envelope into `buf` (replacing its contents, keeping its
    /// allocation); `false` if it cannot be read whole.
    pub fn read_into(&self, extent: &Extent, buf: &mut Vec<u8>) -> bool {
        let Some(segment) = self.segments.get(&extent.segment) else {
            return false;
        };
        buf.resize(extent.size as usize, 0);
        match &segment.reader {
            Some(file) => file.read_exact_at(buf, extent.offset).is_ok(),
            None => read_at(&segment.path, extent.offset, extent.size)
                .map(|bytes| *buf = bytes)
                .is_some(),
        }
    }

    /// The file and place of an extent, for a reader on another thread.
    pub fn locate(&self, extent: &Extent) -> Option<(PathBuf, u64, u32)> {
        let segment = self.segments.get(&extent.segment)?;
        Some((segment.path.clone(), extent.offset, extent.size))
    }

    /// An object is gone (removed, evicted or corrupt): its bytes are dead, and a
    /// closed segment left with no live bytes is deleted.
    pub fn forget(&mut self, extent: &Extent) {
        let Some(s) = self.segments.get_mut(&extent.segment) else {
            return;
        };
        s.live_bytes = s
            .live_bytes
            .saturating_sub(HEADER as u64 + u64::from(extent.size));
        if s.live_bytes == 0 && extent.segment != self.active {
            let _ = std::fs::remove_file(&s.path);
            self.segments.remove(&extent.segment);
        }
    }

    /// The oldest closed segment, if dead records take more room than `bound` allows.
    pub fn compaction_candidate(&self, bound: u64) -> Option<u32> {
        if self.file_bytes() <= bound.saturating_mul(2).saturating_add(self.segment_bytes) {
            return None;
        }
        self.segments.keys().copied().find(|&n| n != self.active)
    }

    /// Deletes a segment whose live objects the caller has copied forward.
    pub fn drop_segment(&mut self, n: u32) {
        if let Some(s) = self.segments.remove(&n) {
            let _ = std::fs::remove_file(&s.path);
        }
    }

    /// Deletes closed segments left with no live bytes (after a replay).
    pub fn drop_dead(&mut self) {
        let dead: Vec<u32> = self
            .segments
            .iter()
            .filter(|(n, s)| s.live_bytes == 0 && **n != self.active)
            .map(|(n, _)| *n)
            .collect();
        for n in dead {
            self.drop_segment(n);
        }
    }
}

/// Writes every byte of `parts`, in as few `writev` calls as the kernel allows.
fn write_all_vectored(file: &mut File, mut parts: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        match file.write_vectored(parts) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads `size` bytes at `offset` of `path`.
pub(crate) fn read_at(path: &Path, offset: u64, size: u32) -> Option<Vec<u8>> {
    let file = File::open(path).ok()?;
    let mut buf = vec![0u8; size as usize];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(buf)
}
