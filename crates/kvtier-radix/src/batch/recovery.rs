//! A retracted request's recovery.

use kvtier_types::{Tier, Token};

use super::*;
use crate::{NodeLock, RadixCore, TablesKey};

impl RadixCore {
    /// A recovery's handles after its outcome: back with a request that stays
    /// retracted; its kept pages ahead of the admitted row's fresh ones; freed at once
    /// where the request is given up or recomputed, as the reference frees a request it
    /// gives up before it tries the next candidate.
    pub(super) fn settle_recovery(
        &mut self,
        outcome: Outcome,
        mut kept: Box<RetractedHandles>,
    ) -> Outcome {
        match outcome {
            Outcome::Waits { held, commit } => {
                debug_assert!(commit.is_none(), "a recovery commits no chunk");
                kept.locks = held;
                Outcome::StaysRetracted(kept)
            }
            Outcome::Admitted(mut admission) => {
                let mut fresh = std::mem::replace(&mut admission.pages, kept.tail);
                let appended = admission.pages.append(&mut fresh);
                debug_assert!(appended.is_ok(), "kept pages of another pool");
                Outcome::Admitted(admission)
            }
            given_up => {
                drop(kept);
                given_up
            }
        }
    }

    /// Resumes a retracted request: its prefix locked (loaded back from host where the
    /// device lost it) and the pages for its decode input. `groups`: a paged request's
    /// kept tables and its row's first position, admitted after the KV room is made and
    /// acquired with the row.
    pub(super) fn recovery(
        &mut self,
        tokens: &[Token],
        tail_pages: u32,
        tail_free: u32,
        held: Vec<NodeLock>,
        d: u32,
        groups: Option<(TablesKey, u32)>,
    ) -> Outcome {
        let (reserve_pages, new_tail_free) = grow(tail_free, d, self.page_size());
        let policy = self.policy();
        // Cheap first: when even the new pages cannot be freed, no probe can change the
        // answer (a load-back only adds to the need), so the history is not walked. A
        // history too big for the device is then found once there is room to try. (The
        // reference evicts before it knows: it has no such shortcut.)
        if !policy.commits_before_it_fits()
            && reserve_pages > 0
            && !self.can_free(Tier::Device, reserve_pages, 0)
        {
            return Outcome::Waits { held, commit: None };
        }
        // Its prefix lock ends where its published tokens do: the path is read from the
        // nodes, not matched token by token (a history of 12,000 tokens, every step).
        let locked = held
            .first()
            .map(NodeLock::node)
            .filter(|&node| self.ends_at(node, tokens));
        let probe = match locked {
            Some(node) => self.probe_path(node),
            None => self.probe(tokens),
        };
        debug_assert_eq!(probe, self.probe(tokens), "the locked path is the tokens'");
        let load_back = probe.host_pages.saturating_sub(probe.device_pages);
        // Exact need: the kept tail page may still have room for the reserved slots.
        let need = load_back + reserve_pages;
        // Its whole footprint: the published prefix, the kept tail pages and the new ones.
        let footprint = probe.device_pages.max(probe.host_pages) + tail_pages + reserve_pages;
        if footprint > self.usable(Tier::Device) {
            drop(held);
            return Outcome::TooBig;
        }
        // The reference makes room for whole fresh pages of the load-back and the decode
        // reserve, ignoring the tail page's room, and evicts even when that cannot
        // suffice (its eviction is not transactional); the pages taken are the same.
        let room = if policy.rooms_whole_pages() {
            load_back + d.div_ceil(self.page_size())
        } else {
            need
        };
        if !policy.commits_before_it_fits()
            && !self.can_free(Tier::Device, need, probe.device_unlocked_pages)
        {
            return Outcome::Waits { held, commit: None };
        }
        let m = match locked {
            Some(node) => self.match_path(node),
            None => self.match_prefix(tokens),
        };
        // A registered family resumes the history only where it can resume all of it.
        if self.has_registered() && self.with_family(|family, tree| family.cap_match(tree, m)) != m
        {
            drop(held);
            return Outcome::Recompute;
        }
        // The reference's order: room for the KV (its eviction stays even when the
        // groups then refuse), the groups' admission, then the load-back.
        let Some(guard) = self.make_room(m.device, room) else {
            return Outcome::Waits { held, commit: None };
        };
        // The group row spans the decode input from its first position.
        if let Some((key, first)) = groups
            && !self.admit_groups(key, first, first + d, None)
        {
            self.unlock(guard);
            return Outcome::Waits { held, commit: None };
        }
        if !self.reserve_family(&m) {
            self.unlock(guard);
            return Outcome::Waits { held, commit: None };
        }
        let Some(pinned) = self.pin_path(m, guard, true) else {
            return Outcome::Waits { held, commit: None };
        };
        for lock in held {
            self.unlock(lock);
        }
        let begin_pages = m.device_pages.max(m.host_pages);
        let shape = ChunkShape::recovery(begin_pages, reserve_pages, new_tail_free);
        let family = self.grant_family();
        let mut outcome = self.admitted(pinned, &shape, family);
        if let (Some((key, first)), Outcome::Admitted(admission)) = (groups, &mut outcome) {
            self.acquire_groups(key, first, first + d);
            admission.groups = self.group_view(key);
        }
        outcome
    }
}
