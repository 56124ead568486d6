//! The windowed match cap (spec §2.5): how deep a token-matched prefix is reusable given
//! the snapshots along it, and which group pages a request starting there borrows.
//!
//! The cap runs once per tier over that tier's snapshots, from the deepest
//! *token-matched* node (never from where a device match stopped: that lost every
//! host-only hit, the reviewer's bug of reference 003, #620).

use kvtier_types::PageId;

use crate::{Adjunct, Snapshot};

/// The pages a hit lends one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupHit {
    /// The group's index in the adjunct.
    pub group: usize,
    /// Snapshot page ids, in logical order from `base`.
    pub ids: Vec<PageId>,
    /// The logical page of `ids[0]`.
    pub base: u32,
}

/// A capped prefix hit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PagedHit {
    /// Reusable tokens (0: no hit).
    pub prefix_len: u32,
    /// How many snapshots of the chain the hit uses (its node is `chain[snapshots − 1]`).
    pub snapshots: usize,
    /// Whether the hit continues from a terminal snapshot's continuation state.
    pub terminal: bool,
    /// Tokens of the unbroken history chain (at least `prefix_len`).
    pub history_tokens: u32,
    /// Per group with pages to lend, in group order.
    pub groups: Vec<GroupHit>,
}

/// Caps a match: `chain` holds the snapshots on the token-matched path, root to leaf
/// (one per snapshot node, each at its node's depth). Returns the deepest reusable
/// prefix with its pages:
///
/// 1. the *history chain*: snapshots at `A, 2A, …` complete for the required history
///    groups, up to the first gap (none: no hit);
/// 2. a *terminal hit*: the chain's last snapshot is complete for every state group,
///    and each state group's window `[max(0, d − W) / tpp, d / tpp)` is assembled
///    without a gap from the segments along the chain;
/// 3. otherwise, a state group that is not required (continuation-only) means no hit;
/// 4. otherwise the deepest chain snapshot `e` whose last `k = ceil(W_max / A)`
///    snapshots are all complete for the required state groups (without required
///    state groups, the deepest): history pages along the chain up to `e`, state
///    pages the whole segments of those `k` snapshots.
pub fn cap_match(adjunct: &Adjunct, chain: &[&Snapshot]) -> PagedHit {
    let a = adjunct.alignment();
    let history_len = chain
        .iter()
        .enumerate()
        .take_while(|(i, s)| s.prefix_len == (*i as u32 + 1) * a && adjunct.completeness(s).history)
        .count();
    if history_len == 0 {
        return PagedHit::default();
    }
    let history = &chain[..history_len];
    let history_tokens = history_len as u32 * a;
    if adjunct.completeness(history[history_len - 1]).continuation
        && let Some(hit) = terminal_hit(adjunct, history)
    {
        return hit;
    }
    if adjunct.continuation_only().next().is_some() {
        return PagedHit::default();
    }
    let usable = if adjunct.has_required_state() {
        let k = adjunct.max_required_window().div_ceil(a).max(1) as usize;
        (1..=history_len).rev().find(|&e| {
            history[e.saturating_sub(k)..e]
                .iter()
                .all(|s| adjunct.completeness(s).state)
        })
    } else {
        Some(history_len)
    };
    let Some(e) = usable else {
        return PagedHit::default();
    };
    let chain = &history[..e];
    let k = adjunct.max_required_window().div_ceil(a).max(1) as usize;
    let mut groups: Vec<GroupHit> = adjunct
        .required_history()
        .map(|g| history_pages(adjunct, g, chain))
        .collect();
    for g in adjunct.required_state() {
        groups.push(history_pages(adjunct, g, &chain[e.saturating_sub(k)..]));
    }
    groups.sort_by_key(|h| h.group);
    PagedHit {
        prefix_len: e as u32 * a,
        snapshots: e,
        terminal: false,
        history_tokens,
        groups,
    }
}

fn terminal_hit(adjunct: &Adjunct, history: &[&Snapshot]) -> Option<PagedHit> {
    let depth = history.last()?.prefix_len;
    let mut groups: Vec<GroupHit> = adjunct
        .required_history()
        .map(|g| history_pages(adjunct, g, history))
        .collect();
    for &g in adjunct.continuation() {
        groups.push(window_pages(adjunct, g, history, depth)?);
    }
    groups.sort_by_key(|h| h.group);
    Some(PagedHit {
        prefix_len: depth,
        snapshots: history.len(),
        terminal: true,
        history_tokens: depth,
        groups,
    })
}

/// A group's segments concatenated along `chain`; the base is the first segment's for
/// a sliding group, 0 for a full-history one.
fn history_pages(adjunct: &Adjunct, group: usize, chain: &[&Snapshot]) -> GroupHit {
    let sliding = adjunct.groups()[group].is_sliding();
    let mut hit = GroupHit {
        group,
        ids: Vec::new(),
        base: 0,
    };
    let mut first = true;
    for seg in chain.iter().filter_map(|s| s.segments[group].as_ref()) {
        if first && sliding {
            hit.base = seg.base;
        }
        first = false;
        hit.ids.extend_from_slice(&seg.pages);
    }
    hit
}

/// A state group's window at `depth`: logical pages `[max(0, depth − W) / tpp,
/// depth / tpp)`, assembled in chain order from the segments that overlap it, with no
/// gap; `None` when it cannot be.
fn window_pages(
    adjunct: &Adjunct,
    group: usize,
    chain: &[&Snapshot],
    depth: u32,
) -> Option<GroupHit> {
    let spec = &adjunct.groups()[group];
    let tpp = spec.tokens_per_page();
    let window = spec.window()?;
    if depth == 0 || !depth.is_multiple_of(tpp) || !window.is_multiple_of(tpp) {
        return None;
    }
    let (lo, hi) = (depth.saturating_sub(window) / tpp, depth / tpp);
    let mut ids = Vec::with_capacity((hi - lo) as usize);
    let mut next = lo;
    for seg in chain.iter().filter_map(|s| s.segments[group].as_ref()) {
        if seg.pages.is_empty() || seg.end() <= lo {
            continue;
        }
        if seg.base >= hi {
            break;
        }
        if seg.base.max(lo) > next {
            return None;
        }
        let from = seg.base.max(next);
        let to = seg.end().min(hi);
        if from < to {
            ids.extend_from_slice(&seg.pages[(from - seg.base) as usize..(to - seg.base) as usize]);
            next = to;
        }
    }
    (next == hi && !ids.is_empty()).then_some(GroupHit {
        group,
        ids,
        base: lo,
    })
}
