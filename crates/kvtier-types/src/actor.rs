//! What makes a core an actor: a name, a protocol (one message type, one reply type)
//! and a `handle` function. Runtime-free: the `kvtier` crate hosts any [`ActorCore`] in
//! one generic actix shell and one generic destination of its deterministic bus.
//!
//! Each concern crate declares its protocol beside its core (`kvtier_radix::protocol`,
//! `kvtier_host::protocol`, …); `docs/architecture.md` has the recipe for a new actor.

use std::fmt;

/// The name of an actor: the address of its messages and the tag of its replies. Open,
/// so that an embedder's own actors have names too; kvtier's are the associated consts.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ActorName(&'static str);

impl ActorName {
    /// The request FSM (the front of every call).
    pub const SCHEDULER: Self = Self("scheduler");
    /// The radix prefix cache.
    pub const RADIX: Self = Self("radix");
    /// The host (L2) page allocator.
    pub const HOST: Self = Self("host");
    /// The device: arenas, kernel library, model runner.
    pub const DEVICE: Self = Self("device");
    /// The L3 store.
    pub const L3: Self = Self("l3");
    /// The Mamba (recurrent-state) cache family.
    pub const MAMBA: Self = Self("mamba");

    /// A name of the embedder's own (lower case, unique within a system).
    pub const fn new(name: &'static str) -> Self {
        Self(name)
    }

    /// The name as text.
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Debug for ActorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Display for ActorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Where an actor runs under a threaded runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Beside the scheduler, so their messages never hop threads.
    Shared,
    /// On a thread of its own when the system has its own thread (its work is long
    /// enough that the scheduler should not wait behind it), beside the scheduler when
    /// the system runs on the caller's thread.
    OwnThreadWhenThreaded,
    /// Always on a thread of its own: its calls block (network, disk).
    OwnThread,
}

/// A core that runs as an actor: plain synchronous state with one message type and one
/// reply type. The runtime owns the core exclusively and calls `handle` for each
/// message, in delivery order.
pub trait ActorCore: Send + 'static {
    /// Its address.
    const NAME: ActorName;
    /// Where it runs under a threaded runtime.
    const PLACEMENT: Placement = Placement::Shared;
    /// What it is sent.
    type Msg: Send + 'static;
    /// What it answers.
    type Reply: Send + 'static;

    /// Handles one message.
    fn handle(&mut self, msg: Self::Msg) -> Self::Reply;

    /// The message's name, as fault hooks and `docs/messages.md` see it.
    fn message_name(msg: &Self::Msg) -> &'static str;

    /// The reply's name, as fault hooks see it.
    fn reply_name(reply: &Self::Reply) -> &'static str;
}
