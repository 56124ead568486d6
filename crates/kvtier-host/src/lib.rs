//! Page pools of kvtier.
//!
//! [`PagePool`] is the allocator behind both the device pool (owned by the radix cache)
//! and the host (L2) pool: page 0 is reserved, allocation is all-or-nothing, and free
//! pages form a LIFO stack so a fresh pool of 10 hands out `[9, 8, 7]` first, as the
//! reference scheduler does.
//!
//! Pages held outside the pool travel as [`OwnedPages`]: move-only, and dropping one
//! sends its ids back to the pool over a channel that the pool drains before it answers
//! its next call. A page is therefore always either free or held by exactly one owner.
//!
//! [`HostArena`] is the memory behind the host page ids, shared by the device actor and
//! the L3 actor under per-page borrows.

mod allocator;
mod arena;
mod error;
mod pool;
pub mod protocol;
mod release;

pub use allocator::{HostCore, HostStats};
pub use arena::{HostArena, PagesRead, PagesWrite};
pub use error::HostError;
pub use pool::{OwnedPages, PagePool, PoolId};
pub use protocol::{HostMsg, HostReply};
pub use release::{Lease, ReleaseQueue, Releaser};
