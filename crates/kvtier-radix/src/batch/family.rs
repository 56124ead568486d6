//! A request's part of its model's one cache family, wherever it meets the cache: held
//! while it runs, granted at admission, given back when it stops.

use crate::{FamilyLease, GroupTables};

/// What a request holds of its model's cache family, or carries of it to or from the
/// cache. A model has one family, so a request has one of these. `S` is the Mamba
/// family's part at that point: its slots while it runs (`RequestStates`), the grant at
/// admission ([`FamilyGrant`]), the slots with their depth when it stops
/// ([`FamilyRelease`]).
#[derive(Debug)]
pub enum FamilyHold<S> {
    /// Full attention (or a recovery that resumes from the tables it kept): nothing
    /// beyond its KV pages.
    Dense,
    /// Hybrid models: its state slots.
    States(S),
    /// Paged models: its group tables (returned to the cache when dropped).
    Tables(GroupTables),
    /// A registered family: its part (returned to the family when dropped).
    Lease(FamilyLease),
}

/// What an admitted request is granted of its model's cache family.
pub type FamilyGrant = FamilyHold<Box<crate::StateGrant>>;

/// What a stopping (finishing or retracted) request gives back of its model's cache
/// family: a hybrid model's slots, one of which holding the state at the published
/// depth is cached there, or a paged model's tables, released once the publication
/// committed them.
pub type FamilyRelease = FamilyHold<crate::FinalStates>;

impl<S> FamilyHold<S> {
    pub fn states(&self) -> Option<&S> {
        match self {
            FamilyHold::States(states) => Some(states),
            _ => None,
        }
    }

    pub fn states_mut(&mut self) -> Option<&mut S> {
        match self {
            FamilyHold::States(states) => Some(states),
            _ => None,
        }
    }

    pub fn tables(&self) -> Option<&GroupTables> {
        match self {
            FamilyHold::Tables(tables) => Some(tables),
            _ => None,
        }
    }

    /// Takes the group tables out (a request that keeps them), leaving nothing.
    pub fn take_tables(&mut self) -> Option<GroupTables> {
        if !matches!(self, FamilyHold::Tables(_)) {
            return None;
        }
        match std::mem::replace(self, FamilyHold::Dense) {
            FamilyHold::Tables(tables) => Some(tables),
            _ => None,
        }
    }

    /// The same hold with its Mamba part turned into `f`'s.
    pub fn map_states<T>(self, f: impl FnOnce(S) -> T) -> FamilyHold<T> {
        match self {
            FamilyHold::Dense => FamilyHold::Dense,
            FamilyHold::States(states) => FamilyHold::States(f(states)),
            FamilyHold::Tables(tables) => FamilyHold::Tables(tables),
            FamilyHold::Lease(lease) => FamilyHold::Lease(lease),
        }
    }
}
