//! A request's own state slots.

use crate::Slot;

/// A request's *working* slot (its live state) and *checkpoint* slot (where a forward
/// may snapshot a state for the cache), with the depth each holds a state for. Owned by
/// the request's state in the scheduler: every exit — finish, abort, retraction —
/// returns both slots by dropping the pair.
#[derive(Debug)]
pub struct RequestStates {
    /// The live state.
    pub working: Slot,
    /// The snapshot destination, if the request has one now.
    pub checkpoint: Option<Slot>,
    /// The depth (tokens) whose state the checkpoint holds once the rows emitted so far
    /// have run; `None` while it holds nothing usable.
    pub checkpoint_at: Option<u32>,
}

impl RequestStates {
    /// A fresh pair: nothing computed yet.
    pub fn new(working: Slot, checkpoint: Slot) -> Self {
        Self {
            working,
            checkpoint: Some(checkpoint),
            checkpoint_at: None,
        }
    }

    /// A row that ends the history at `len` tokens (a decode or a recovery row) was
    /// emitted: its checkpoint, if it has one, gets the state there where that ends a
    /// page ([`crate::decode_checkpoint_depth`]).
    #[inline]
    pub fn row_ends_at(&mut self, len: u32, page_size: u32) {
        if self.checkpoint.is_some()
            && let Some(at) = crate::decode_checkpoint_depth(len, page_size)
        {
            self.checkpoint_at = Some(at);
        }
    }

    /// Takes the checkpoint slot out with the depth it holds a state for.
    pub fn take_checkpoint(&mut self) -> Option<(Slot, Option<u32>)> {
        let slot = self.checkpoint.take()?;
        Some((slot, self.checkpoint_at.take()))
    }
}
