//! Mooncake request traces (the FAST'25 format; `data/mooncake-traces/README.md`).
//!
//! One JSON object per line, in arrival order: `timestamp` (ms from the trace's start),
//! `input_length` and `output_length` (tokens), and `hash_ids`, one id per 512-token
//! block of the prompt, the last block possibly partial. An id stands for its block
//! *and everything before it*: two prompts whose first `k` ids are equal share their
//! first `k × 512` tokens. No text is published, so a replay makes the tokens: token `j`
//! of a block is a pure function of the block's id and `j`, so equal ids give equal
//! tokens and a partial last block is a prefix of the full one.

use std::collections::HashSet;
use std::ops::Range;
use std::path::Path;

use kvtier_types::Token;
use serde_json::Value;

use crate::tokens::splitmix64;

/// The Mooncake conversation trace (FAST'25, Apache-2.0; data/mooncake-traces/), built
/// into the binaries that name it, so that a bare `kvtier replay` runs anywhere.
pub const CONVERSATION_TRACE: &str =
    include_str!("../../../data/mooncake-traces/conversation_trace.jsonl");

/// Tokens per trace block.
pub const BLOCK_TOKENS: usize = 512;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Its line in the file (1-based), for messages and request ids.
    pub line: usize,
    /// Arrival, ms from the trace's start.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Tokens to generate.
    pub output_length: u32,
    /// One id per 512-token block of the prompt.
    pub hash_ids: Vec<u64>,
}

/// Why a trace could not be read. A bad line names its number and field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be read.
    #[error("reading the trace {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a valid request.
    #[error("trace line {line}: {problem}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// The field at fault, if one is.
        field: Option<&'static str>,
        /// What is wrong.
        problem: String,
    },
    /// A slice selector is unusable.
    #[error("trace slice: {0}")]
    Slice(String),
    /// Nothing is left to replay.
    #[error("the trace slice holds no request")]
    Empty,
}

/// Which part of a trace to replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceSlice {
    /// Requests arriving in this window, ms from the trace's start.
    pub window_ms: Option<Range<u64>>,
    /// At most this many requests (after the window).
    pub limit: Option<usize>,
}

impl TraceSlice {
    /// Parses a window given in seconds, `START..END` (either side may be empty).
    pub fn parse_window(text: &str) -> Result<Range<u64>, TraceError> {
        let bad = || TraceError::Slice(format!("window `{text}` is not START..END in seconds"));
        let (start, end) = text.split_once("..").ok_or_else(bad)?;
        let seconds = |s: &str, default: f64| -> Result<f64, TraceError> {
            if s.trim().is_empty() {
                return Ok(default);
            }
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(bad)
        };
        let (start, end) = (seconds(start, 0.0)?, seconds(end, f64::MAX / 2e3)?);
        if end <= start {
            return Err(bad());
        }
        Ok((start * 1e3) as u64..(end * 1e3).min(u64::MAX as f64) as u64)
    }
}

/// Reads a trace file and selects `slice` of it.
pub fn read_trace(path: &Path, slice: &TraceSlice) -> Result<Vec<TraceRequest>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_trace(&text, slice)
}

/// Parses a trace (JSON Lines) and selects `slice` of it. Blank lines are skipped.
pub fn parse_trace(text: &str, slice: &TraceSlice) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests = Vec::new();
    let mut last_timestamp = 0;
    for (index, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let request = parse_line(index + 1, raw)?;
        if request.timestamp_ms < last_timestamp {
            return Err(TraceError::Line {
                line: request.line,
                field: Some("timestamp"),
                problem: format!(
                    "{} ms comes before the previous line's {last_timestamp} ms",
                    request.timestamp_ms
                ),
            });
        }
        last_timestamp = request.timestamp_ms;
        if slice
            .window_ms
            .as_ref()
            .is_some_and(|w| !w.contains(&request.timestamp_ms))
        {
            continue;
        }
        requests.push(request);
        if slice.limit.is_some_and(|n| requests.len() >= n) {
            break;
        }
    }
    if requests.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(requests)
}

fn parse_line(line: usize, raw: &str) -> Result<TraceRequest, TraceError> {
    let at = |field: Option<&'static str>, problem: String| TraceError::Line {
        line,
        field,
        problem,
    };
    let value: Value = serde_json::from_str(raw).map_err(|e| at(None, format!("not JSON: {e}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| at(None, "not a JSON object".into()))?;
    let number = |field: &'static str| -> Result<u64, TraceError> {
        let v = object
            .get(field)
            .ok_or_else(|| at(Some(field), format!("`{field}` is missing")))?;
        v.as_u64().ok_or_else(|| {
            at(
                Some(field),
                format!("`{field}` is {v}, not a non-negative integer"),
            )
        })
    };
    let timestamp_ms = number("timestamp")?;
    let input_length = number("input_length")?;
    let output_length = number("output_length")?;
    let small = |field: &'static str, v: u64| {
        u32::try_from(v).map_err(|_| at(Some(field), format!("`{field}` {v} is too large")))
    };
    let input_length = small("input_length", input_length)?;
    let output_length = small("output_length", output_length)?;
    if input_length == 0 {
        return Err(at(
            Some("input_length"),
            "`input_length` is 0: a prompt has tokens".into(),
        ));
    }
    let ids = object
        .get("hash_ids")
        .ok_or_else(|| at(Some("hash_ids"), "`hash_ids` is missing".into()))?
        .as_array()
        .ok_or_else(|| at(Some("hash_ids"), "`hash_ids` is not an array".into()))?;
    let hash_ids = ids
        .iter()
        .map(|v| {
            v.as_u64()
                .ok_or_else(|| at(Some("hash_ids"), format!("`hash_ids` holds {v}, not an id")))
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let blocks = (input_length as usize).div_ceil(BLOCK_TOKENS);
    if hash_ids.len() != blocks {
        return Err(at(
            Some("hash_ids"),
            format!(
                "{} ids for {input_length} tokens: {blocks} blocks of {BLOCK_TOKENS} expected",
                hash_ids.len()
            ),
        ));
    }
    Ok(TraceRequest {
        line,
        timestamp_ms,
        input_length,
        output_length,
        hash_ids,
    })
}

/// Token `j` of the block with id `id`.
fn block_token(id: u64, j: usize) -> Token {
    let h = splitmix64(splitmix64(id ^ 0x6d6f_6f6e_6361_6b65).wrapping_add(j as u64));
    1 + (h % 32_000) as Token
}

impl TraceRequest {
    /// Its prompt: the blocks' tokens, cut at `input_length`.
    pub fn prompt(&self) -> Vec<Token> {
        let n = self.input_length as usize;
        let mut tokens = Vec::with_capacity(n);
        for &id in &self.hash_ids {
            let take = (n - tokens.len()).min(BLOCK_TOKENS);
            tokens.extend((0..take).map(|j| block_token(id, j)));
        }
        tokens
    }

    /// Its submission: the id `t{line:06}` and prompt, with the answer's length.
    pub fn spec(&self) -> (kvtier_types::RequestSpec, usize) {
        let id = kvtier_types::RequestId::from(format!("t{:06}", self.line));
        (
            kvtier_types::RequestSpec::new(id, self.prompt()),
            self.output_length.max(1) as usize,
        )
    }

    /// Its arrival on the virtual clock (µs) with the trace's time divided by `scale`.
    pub fn arrival_us(&self, scale: f64) -> f64 {
        self.timestamp_ms as f64 * 1e3 / scale
    }
}

/// The hit tokens of an unbounded prefix cache over the trace's prompts in arrival
/// order, reusing whole pages of `page_size` of every earlier prompt (never the last
/// token, which is computed to produce the first answer token): the bound no cache
/// capacity can beat, whatever the timing.
pub fn unbounded_hit_tokens(requests: &[TraceRequest], page_size: u32) -> u64 {
    let ps = page_size as usize;
    let mut seen: HashSet<(u64, usize)> = HashSet::new();
    let mut hits = 0u64;
    for r in requests {
        // A page is identified by the id of the block it ends in and its end offset
        // there: ids identify whole prefixes.
        let reusable = (r.input_length as usize - 1) / ps;
        let page_key = |p: usize| {
            let end = (p + 1) * ps;
            (
                r.hash_ids[(end - 1) / BLOCK_TOKENS],
                end - (end - 1) / BLOCK_TOKENS * BLOCK_TOKENS,
            )
        };
        let matched = (0..reusable)
            .take_while(|&p| seen.contains(&page_key(p)))
            .count();
        hits += (matched * ps) as u64;
        for p in 0..(r.input_length as usize / ps) {
            seen.insert(page_key(p));
        }
    }
    hits
}
