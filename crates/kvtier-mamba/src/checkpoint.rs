//! Where a chunk's checkpoint lands.
//!
//! A forward over the tokens `[begin, begin + size)` writes the request's *working* state
//! after its last token and, where the rule below says so, a copy into its *checkpoint*
//! slot: the state after the last page boundary it crosses. Only that state can enter
//! the tree, at exactly its depth (a slot at depth `d` is the state after `tokens[0, d)`,
//! `d` a multiple of the page size `P`).
//!
//! With `end = begin + size` and `last = floor(end / P) · P` (the last page boundary
//! reached):
//! * `end` on a page boundary: the state after the whole chunk (the *final* state wins);
//! * else `last` inside the chunk, at a multiple of the kernel's chunk length from
//!   `begin` (the scan kernel keeps intermediate states only there): that intermediate
//!   state;
//! * else none.
//!
//! The worker (which copies the state) and the scheduler (which publishes the slot)
//! apply the same rule; [`checkpoint_depth`] is the one both use. Which rows need a
//! fresh checkpoint slot at all is [`CheckpointNeed`]'s to say.

use kvtier_types::Policy;

/// The depth (in tokens) whose state a chunk `[begin, begin + size)` leaves in the
/// checkpoint slot, if any. `page_size` is `P`, `kernel_chunk` the scan kernel's chunk
/// length (64 in the reference; it must equal the Mamba cache chunk size).
pub fn checkpoint_depth(begin: u32, size: u32, page_size: u32, kernel_chunk: u32) -> Option<u32> {
    if size == 0 || page_size == 0 || kernel_chunk == 0 {
        return None;
    }
    let end = begin.checked_add(size)?;
    let last = end / page_size * page_size;
    if last <= begin {
        return None;
    }
    if last == end {
        return Some(end);
    }
    (last - begin).is_multiple_of(kernel_chunk).then_some(last)
}

/// The depth a decode step's state is checkpointed at: the new history length, when it
/// is page-aligned (the worker copies working → checkpoint there).
pub fn decode_checkpoint_depth(new_len: u32, page_size: u32) -> Option<u32> {
    (page_size > 0 && new_len > 0 && new_len.is_multiple_of(page_size)).then_some(new_len)
}

/// `floor(x / chunk) · chunk`: the branching length of a match (§1.4).
pub fn align_down(x: u32, chunk: u32) -> u32 {
    x.checked_div(chunk).map_or(0, |q| q * chunk)
}

/// Whether a hybrid row needs a fresh checkpoint slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointNeed {
    /// No.
    None,
    /// Yes: the row waits until one can be had (the reference's rule for every chunk
    /// and for the first decode).
    Required,
    /// If one can be had (evicting a cached state if it must): the row crosses a page
    /// boundary, and its state there is worth caching.
    Wanted,
}

impl CheckpointNeed {
    /// A prefill chunk's: every chunk may end where a state is worth caching.
    pub fn of_chunk() -> Self {
        CheckpointNeed::Required
    }

    /// A decode row's, for a request whose history grows to `new_len` tokens: kvtier
    /// wants one when the new length ends a page and the request holds none (its state
    /// there is cached with the page); the reference gives the first decode one, which
    /// it never fills.
    pub fn of_decode(
        policy: Policy,
        first: bool,
        new_len: u32,
        page_size: u32,
        holds_checkpoint: bool,
    ) -> Self {
        if policy.checkpoints_the_first_decode() {
            return if first {
                CheckpointNeed::Required
            } else {
                CheckpointNeed::None
            };
        }
        let crossing = decode_checkpoint_depth(new_len, page_size).is_some();
        if crossing && !holds_checkpoint {
            CheckpointNeed::Wanted
        } else {
            CheckpointNeed::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_wants_a_checkpoint_where_it_ends_a_page_and_holds_none() {
        let need =
            |new_len, holds| CheckpointNeed::of_decode(Policy::Default, false, new_len, 16, holds);
        assert_eq!(need(32, false), CheckpointNeed::Wanted);
        assert_eq!(need(32, true), CheckpointNeed::None);
        assert_eq!(need(33, false), CheckpointNeed::None);
    }

    #[test]
    fn the_reference_gives_the_first_decode_one_and_no_other() {
        let need = |first, new_len| {
            CheckpointNeed::of_decode(Policy::Reference, first, new_len, 16, false)
        };
        assert_eq!(need(true, 33), CheckpointNeed::Required);
        assert_eq!(need(false, 32), CheckpointNeed::None);
    }
}
