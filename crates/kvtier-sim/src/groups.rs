//! The oracle engine's paged-cache groups: what a window or compressed-state model
//! keeps beside (or instead of) token-paged KV, and the check that every row reads
//! exactly the group entries its tokens would have produced.
//!
//! * Entry `k` of a group with stride `s` covers tokens `[k·s, (k+1)·s)`; after a row
//!   computed up to position `p` inside it, it holds a pure function of the token prefix
//!   `0..=p` and the group (a compressor state accumulating its tokens). It sits on
//!   absolute page `k / rows`, row `k % rows`; the row's table gives that page as
//!   `pages[page − base]`.
//! * A row computing `[c, e)` checks the entries its first token attends before it
//!   writes (all of `[0, c)` for a full-history group, `[c − W + 1, c)` for a sliding
//!   window `W`, a state group's trailing window included), writes its own, then reads
//!   those its last token attends (`[0, e)`, or `[e − W, e)`) into the next token. An
//!   entry the table does not reach, or one holding another prefix's value, is an
//!   integrity error; what the last token reads depends on the tokens only, so cache on
//!   and off must give the same tokens.

use kvtier_types::{GroupSpec, GroupTable, PageId, RequestId};

use crate::tokens::splitmix64;

/// A row as the group oracle sees it: whose it is and its group tables
/// ([`kvtier_types::ForwardBatch::groups_of`]).
#[derive(Debug, Clone, Copy)]
pub struct RowGroups<'a> {
    /// The request the row computes.
    pub request: &'a RequestId,
    /// Its table of each group, in group-id byte order.
    pub tables: &'a [GroupTable],
}

/// A wrong or missing group entry a row read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongGroupEntry {
    /// The request whose row read it.
    pub request: RequestId,
    /// The group's id.
    pub group: String,
    /// The last token position the entry covers for this read.
    pub position: u32,
    /// The page read; `None` when the row's table does not reach the entry.
    pub page: Option<PageId>,
}

/// The engine's group memory: one word per entry, per group (the oracle of a paged
/// model; [`crate::oracle::OracleEngine::with_groups`]).
#[derive(Debug)]
pub struct GroupMemory {
    groups: Vec<GroupSpec>,
    words: Vec<Vec<u64>>,
}

/// The word of entry-holding state after the prefix whose hash is `h`, in group `g`.
fn entry_word(h: u64, g: usize) -> u64 {
    splitmix64(h ^ 0x4752_4f55_5000_0000 ^ ((g as u64) << 44))
}

impl GroupMemory {
    /// Memory for `groups` (any order; rows list them in id byte order).
    pub fn new(mut groups: Vec<GroupSpec>) -> Self {
        groups.sort_by(|a, b| a.id.cmp(&b.id));
        let words = groups
            .iter()
            .map(|g| vec![0; g.total_pages as usize * g.rows_per_page as usize])
            .collect();
        Self { groups, words }
    }

    /// The word index of entry `k` in group `g` through the row's table.
    fn address(&self, row: RowGroups<'_>, g: usize, k: u32) -> Result<usize, Option<PageId>> {
        let spec = &self.groups[g];
        let table = row.tables.get(g).ok_or(None)?;
        let page = k / spec.rows_per_page;
        let column = page.checked_sub(table.base).ok_or(None)?;
        let id = *table.pages.get(column as usize).ok_or(None)?;
        if id == 0 || id >= spec.total_pages {
            return Err(Some(id));
        }
        Ok((id * spec.rows_per_page + k % spec.rows_per_page) as usize)
    }

    /// Writes the entries of the positions `compute` covers — from a group's
    /// `fill_from` when the row computes the window before it again; `prefix[p]` is the
    /// prefix hash through position `p`. A table that misses an entry is reported.
    pub fn write(
        &mut self,
        row: RowGroups<'_>,
        prefix: &[u64],
        compute: std::ops::Range<u32>,
    ) -> Option<WrongGroupEntry> {
        if compute.is_empty() {
            return None;
        }
        for g in 0..self.groups.len() {
            let s = self.groups[g].entry_stride_tokens;
            let start = row
                .tables
                .get(g)
                .and_then(|t| t.fill_from)
                .map_or(compute.start, |f| f.min(compute.start));
            for k in start / s..=(compute.end - 1) / s {
                // The entry holds the state through the last position computed in it.
                let last = ((k + 1) * s).min(compute.end) - 1;
                match self.address(row, g, k) {
                    Ok(at) => self.words[g][at] = entry_word(prefix[last as usize], g),
                    Err(page) => return Some(self.wrong(row, g, last, page)),
                }
            }
        }
        None
    }

    /// Checks the entries the row's first token at `first` attends, before the row
    /// writes any (what the rows before it left there, its own hit's pages included).
    pub fn check_before(
        &self,
        row: RowGroups<'_>,
        prefix: &[u64],
        first: u32,
        check: impl Fn(u32) -> bool,
    ) -> Option<WrongGroupEntry> {
        self.scan(
            row,
            prefix,
            |w| (first + 1).saturating_sub(w),
            first,
            None,
            check,
            true,
        )
    }

    /// Reads the entries the row's last token (at `end - 1`) attends, after the row
    /// wrote its own, into `digest`, checking them too. What it reads depends on the
    /// tokens only, never on how the prompt was chunked or what the cache held.
    pub fn read_after(
        &self,
        row: RowGroups<'_>,
        prefix: &[u64],
        end: u32,
        digest: &mut u64,
        check: impl Fn(u32) -> bool,
    ) -> Option<WrongGroupEntry> {
        self.scan(
            row,
            prefix,
            |w| end.saturating_sub(w),
            end,
            Some(digest),
            check,
            false,
        )
    }

    /// Visits the entries of positions `[lo(W), end)` of every group (`lo` of a
    /// sliding group's window; 0 for full history) as a reader at `end` sees them;
    /// `before_fill`: skip the groups the row fills again (nothing is there yet).
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &self,
        row: RowGroups<'_>,
        prefix: &[u64],
        lo: impl Fn(u32) -> u32,
        end: u32,
        mut digest: Option<&mut u64>,
        check: impl Fn(u32) -> bool,
        before_fill: bool,
    ) -> Option<WrongGroupEntry> {
        let mut wrong = None;
        for (g, spec) in self.groups.iter().enumerate() {
            if before_fill && row.tables.get(g).is_some_and(|t| t.fill_from.is_some()) {
                continue;
            }
            let lo = spec.window().map_or(0, &lo);
            if lo >= end {
                continue;
            }
            let s = spec.entry_stride_tokens;
            for k in lo / s..=(end - 1) / s {
                // The entry holds the state through its last position before `end`.
                let last = ((k + 1) * s).min(end) - 1;
                let (word, page) = match self.address(row, g, k) {
                    Ok(at) => (Some(self.words[g][at]), at_page(spec, at)),
                    Err(page) => (None, page),
                };
                if let Some(d) = digest.as_deref_mut() {
                    let w = word.unwrap_or(0xdead);
                    *d = (*d ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
                }
                let expected = entry_word(prefix[last as usize], g);
                let good = word.is_some_and(|w| !check(last) || w == expected);
                if !good && wrong.is_none() {
                    wrong = Some(self.wrong(row, g, last, page));
                }
            }
        }
        wrong
    }

    fn wrong(
        &self,
        row: RowGroups<'_>,
        g: usize,
        position: u32,
        page: Option<PageId>,
    ) -> WrongGroupEntry {
        WrongGroupEntry {
            request: row.request.clone(),
            group: self.groups[g].id.clone(),
            position,
            page,
        }
    }
}

/// The page a word index sits on.
fn at_page(spec: &GroupSpec, at: usize) -> Option<PageId> {
    Some((at / spec.rows_per_page as usize) as PageId)
}
