//! Reading vLLM's `KVEventBatch` (msgpack): `[ts, events, data_parallel_rank]`, each
//! event a map tagged by `type`. Only what a router needs is kept: the block hashes
//! stored or removed and their medium. Fields it does not know are skipped whatever
//! their type, so a newer publisher's extra fields are harmless.

use crate::RouterError;

/// Where a block is cached, as the wire names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Medium {
    /// `GPU`: the device tier.
    Gpu,
    /// `CPU`: host memory.
    Cpu,
    /// `DISK`: the storage tier (kvtier's L3 store).
    Disk,
}

impl Medium {
    fn parse(name: &str) -> Result<Self, RouterError> {
        match name {
            "GPU" => Ok(Medium::Gpu),
            "CPU" => Ok(Medium::Cpu),
            "DISK" => Ok(Medium::Disk),
            other => Err(RouterError::Wire(format!("unknown medium {other:?}"))),
        }
    }
}

/// One event of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Blocks cached on `medium` (vLLM leaves `medium` nil for the device).
    Stored { hashes: Vec<u64>, medium: Medium },
    /// Blocks gone from `medium`.
    Removed { hashes: Vec<u64>, medium: Medium },
    /// Every block of the publisher is gone.
    AllCleared,
}

/// One `KVEventBatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The publisher's timestamp (kvtier's replay: seconds on the virtual clock).
    pub ts: f64,
    pub events: Vec<Event>,
    pub data_parallel_rank: Option<u64>,
}

/// Decodes one batch.
pub fn decode_batch(bytes: &[u8]) -> Result<Batch, RouterError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    if r.array_len()? != 3 {
        return Err(RouterError::Wire("a batch is an array of 3".into()));
    }
    let ts = r.float()?;
    let n = r.array_len()?;
    let mut events = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        if let Some(event) = r.event()? {
            events.push(event);
        }
    }
    let data_parallel_rank = if r.peek()? == 0xc0 {
        r.pos += 1;
        None
    } else {
        Some(r.uint()?)
    };
    if r.pos != bytes.len() {
        return Err(RouterError::Wire("bytes after the batch".into()));
    }
    Ok(Batch {
        ts,
        events,
        data_parallel_rank,
    })
}

/// A msgpack cursor over one message.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn short(&self) -> RouterError {
        RouterError::Wire(format!("truncated at byte {}", self.pos))
    }

    fn peek(&self) -> Result<u8, RouterError> {
        self.buf.get(self.pos).copied().ok_or_else(|| self.short())
    }

    fn take(&mut self, n: usize) -> Result<&[u8], RouterError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| self.short())?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn be(&mut self, n: usize) -> Result<u64, RouterError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn marker(&mut self) -> Result<u8, RouterError> {
        let m = self.peek()?;
        self.pos += 1;
        Ok(m)
    }

    fn unexpected(&self, m: u8, what: &str) -> RouterError {
        RouterError::Wire(format!(
            "marker {m:#04x} at byte {} where {what} was due",
            self.pos - 1
        ))
    }

    fn array_len(&mut self) -> Result<usize, RouterError> {
        match self.marker()? {
            m @ 0x90..=0x9f => Ok(usize::from(m & 0x0f)),
            0xdc => Ok(self.be(2)? as usize),
            0xdd => Ok(self.be(4)? as usize),
            m => Err(self.unexpected(m, "an array")),
        }
    }

    fn map_len(&mut self) -> Result<usize, RouterError> {
        match self.marker()? {
            m @ 0x80..=0x8f => Ok(usize::from(m & 0x0f)),
            0xde => Ok(self.be(2)? as usize),
            0xdf => Ok(self.be(4)? as usize),
            m => Err(self.unexpected(m, "a map")),
        }
    }

    fn str(&mut self) -> Result<&str, RouterError> {
        let n = match self.marker()? {
            m @ 0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            m => return Err(self.unexpected(m, "a string")),
        };
        std::str::from_utf8(self.take(n)?)
            .map_err(|_| RouterError::Wire("a string not UTF-8".into()))
    }

    fn uint(&mut self) -> Result<u64, RouterError> {
        match self.marker()? {
            m @ 0x00..=0x7f => Ok(u64::from(m)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            // Python's encoders write a non-negative int in a signed form at times.
            0xd0..=0xd3 => {
                let n = [1, 2, 4, 8][usize::from(self.buf[self.pos - 1] - 0xd0)];
                let raw = self.be(n)?;
                let shift = 64 - 8 * n as u32;
                let value = ((raw << shift) as i64) >> shift;
                u64::try_from(value).map_err(|_| RouterError::Wire("a negative block hash".into()))
            }
            m => Err(self.unexpected(m, "an unsigned integer")),
        }
    }

    fn float(&mut self) -> Result<f64, RouterError> {
        match self.marker()? {
            0xcb => Ok(f64::from_bits(self.be(8)?)),
            0xca => Ok(f64::from(f32::from_bits(self.be(4)? as u32))),
            m => Err(self.unexpected(m, "a float")),
        }
    }

    fn hashes(&mut self) -> Result<Vec<u64>, RouterError> {
        let n = self.array_len()?;
        (0..n).map(|_| self.uint()).collect()
    }

    /// Skips one value of any type.
    fn skip(&mut self) -> Result<(), RouterError> {
        let m = self.marker()?;
        let (bytes, items) = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * usize::from(m & 0x0f)),
            0x90..=0x9f => (0, usize::from(m & 0x0f)),
            0xa0..=0xbf => (usize::from(m & 0x1f), 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 | 0xca => (4, 0),
            0xcf | 0xd3 | 0xcb => (8, 0),
            0xc4 | 0xd9 => (self.be(1)? as usize, 0),
            0xc5 | 0xda => (self.be(2)? as usize, 0),
            0xc6 | 0xdb => (self.be(4)? as usize, 0),
            0xdc => (0, self.be(2)? as usize),
            0xdd => (0, self.be(4)? as usize),
            0xde => (0, 2 * self.be(2)? as usize),
            0xdf => (0, 2 * self.be(4)? as usize),
            // fixext and ext: a type byte, then the data.
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xc7 => (1 + self.be(1)? as usize, 0),
            0xc8 => (1 + self.be(2)? as usize, 0),
            0xc9 => (1 + self.be(4)? as usize, 0),
            m => return Err(self.unexpected(m, "a value")),
        };
        self.take(bytes)?;
        for _ in 0..items {
            self.skip()?;
        }
        Ok(())
    }

    /// One event map; `None` for an event type a router has no use for.
    fn event(&mut self) -> Result<Option<Event>, RouterError> {
        let n = self.map_len()?;
        let (mut kind, mut hashes, mut medium) = (None, None, Medium::Gpu);
        for _ in 0..n {
            let key = self.str()?.to_owned();
            match key.as_str() {
                "type" => kind = Some(self.str()?.to_owned()),
                "block_hashes" => hashes = Some(self.hashes()?),
                "medium" if self.peek()? == 0xc0 => self.pos += 1,
                "medium" => medium = Medium::parse(self.str()?)?,
                _ => self.skip()?,
            }
        }
        let kind = kind.ok_or_else(|| RouterError::Wire("an event without a type".into()))?;
        let hashes = || {
            hashes
                .clone()
                .ok_or_else(|| RouterError::Wire(format!("{kind} without block_hashes")))
        };
        Ok(match kind.as_str() {
            "BlockStored" => Some(Event::Stored {
                hashes: hashes()?,
                medium,
            }),
            "BlockRemoved" => Some(Event::Removed {
                hashes: hashes()?,
                medium,
            }),
            "AllBlocksCleared" => Some(Event::AllCleared),
            _ => None,
        })
    }
}
