//! Executing one op of a batch.

use kvtier_types::Tier;

use super::*;
use crate::{NodeId, NodeLock, RadixCore};

impl RadixCore {
    /// `handed_over`: locks publications of this batch left for their requests' stop
    /// ops, by ticket.
    pub(super) fn execute_op(
        &mut self,
        op: CacheOp,
        handed_over: &mut Vec<(u64, NodeLock)>,
    ) -> OpResult {
        match op {
            CacheOp::Release(handles) => {
                drop(handles);
                self.drain_releases();
                OpResult::Released
            }
            CacheOp::RewindTables { key, tokens } => {
                self.rewind_tables(key, tokens);
                OpResult::Released
            }
            CacheOp::WriteBackAck {
                ticket,
                success,
                keep_device,
                backup,
                demote,
            } => {
                let kept = keep_device.map(|node| self.lock(node, Tier::Device));
                let written = self.write_back_done(ticket, success);
                let backup = (success && backup)
                    .then(|| self.pin_backup(written))
                    .flatten();
                if let (true, Some(node)) = (success, demote) {
                    self.demote(node);
                }
                self.with_family(|family, tree| family.copies_settled(tree));
                OpResult::Acked { kept, backup }
            }
            CacheOp::Publish(publication) => {
                let (lock, _) = self.publish(publication, None);
                let mut path_pages = Vec::new();
                if let Some(lock) = &lock {
                    self.device_path_pages(lock.node(), &mut path_pages);
                }
                match lock {
                    Some(lock) => OpResult::Published { lock, path_pages },
                    // Nothing new to publish: callers only send non-empty publications.
                    None => OpResult::Published {
                        lock: self.lock(self.root(), Tier::Device),
                        path_pages,
                    },
                }
            }
            CacheOp::Finish {
                publication,
                device_lock,
                host_lock,
                write_back,
                reuse,
                leftover,
                mut family,
            } => {
                let tables = family.take_tables();
                let device_lock = match device_lock {
                    StopLock::Held(lock) => Some(lock),
                    StopLock::HandedOver(ticket) => {
                        let at = handed_over.iter().position(|&(t, _)| t == ticket);
                        debug_assert!(at.is_some(), "no lock handed over under {ticket}");
                        at.map(|i| handed_over.swap_remove(i).1)
                    }
                };
                let tokens = publication.tokens.clone();
                let inserted = !publication.pages.is_empty();
                let (lock, pages) = self.publish(publication, None);
                if !matches!(family, FamilyHold::Dense) {
                    // The reference caches a finishing request's state only when it
                    // published pages at the end. Without new pages the terminal is
                    // where its last publication ended, which may be one of this batch
                    // (a decode's, the same step) its lock does not know yet.
                    // With prefix reuse off, the reference looks the terminal up with a
                    // reuse match, which ends at the root: the state goes there (C.9).
                    let terminal = match &lock {
                        _ if self.policy().finishes_without_reuse_at_the_root() && !reuse => {
                            self.root()
                        }
                        Some(lock) => lock.node(),
                        None => {
                            let ps = self.page_size() as usize;
                            let held = device_lock.as_ref().map_or(self.root(), NodeLock::node);
                            let published = &tokens[..pages as usize * ps];
                            if self.depth_pages(held) == pages {
                                held
                            } else {
                                self.node_ending(published).unwrap_or(held)
                            }
                        }
                    };
                    let publish =
                        inserted || !self.policy().caches_a_finish_state_with_pages_only();
                    self.settle_family(terminal, family, publish);
                }
                // The reference matches the finished prefix (touching it) even when it
                // writes nothing back.
                let matched =
                    write_back || (self.policy().matches_every_finished_prefix() && reuse);
                let write_back = if matched && pages > 0 {
                    let m =
                        self.match_prefix(&tokens[..pages as usize * self.page_size() as usize]);
                    (write_back && m.device_pages > m.host_pages)
                        .then(|| self.attach_write_back(m.device, m.host))
                        .flatten()
                } else {
                    None
                };
                // The request lets go of its prefix only now, after the match above
                // used it, as the reference does (its unlock re-keys the LRU order).
                // The reference never locks the publication's terminal, so releasing
                // that lock moves nothing in the LRU order under its policies.
                if let Some(lock) = lock {
                    self.release_published(lock, self.policy().never_locks_a_publication());
                }
                for lock in device_lock.into_iter().chain(host_lock) {
                    self.unlock(lock);
                }
                let freed = self.free(Tier::Device, leftover);
                debug_assert!(freed.is_ok(), "leftover pages of another pool: {freed:?}");
                // Committed by the publication; the lease goes back now.
                drop(tables);
                self.drain_releases();
                OpResult::Finished { write_back }
            }
            CacheOp::Retract {
                publication,
                device_lock,
                host_lock: old_host_lock,
                mut family,
            } => {
                let tables = family.take_tables();
                let tokens = publication.tokens.clone();
                let held = device_lock.node();
                let (lock, pages) = self.publish(publication, Some(device_lock));
                let device_lock = lock.expect("publish with a lock returns one");
                // The reference locks the published path only to copy it: a retraction
                // with nothing to copy, or no host room, lets go of the lock on it as
                // one the reference never takes (the request's own it does release).
                let transient =
                    self.policy().never_locks_a_publication() && device_lock.node() != held;
                let m = self.match_prefix(&tokens[..pages as usize * self.page_size() as usize]);
                debug_assert_eq!(m.device_pages, pages, "the retracted prefix is locked");
                // kvtier caches the request's state before the write-back, so the copy
                // takes it along; the reference caches it after, and the state has no
                // host copy.
                if !self.policy().caches_a_retracted_state_after_the_copy() {
                    let family = std::mem::replace(&mut family, FamilyHold::Dense);
                    self.settle_family(m.device, family, true);
                }
                let nothing_to_copy = m.device_pages <= m.host_pages;
                let outcome = if !nothing_to_copy {
                    match self.attach_write_back(m.device, m.host) {
                        Some(attached) => {
                            let host_lock = self.lock(m.device, Tier::Host);
                            self.unlock(device_lock);
                            RetractOutcome::Kept {
                                prefix_lock: host_lock,
                                write_back: Some(attached),
                            }
                        }
                        // A paged model keeps its published prefix on device, where its
                        // snapshots make it reusable: the request recomputes from there
                        // (its recovery is a recompute) instead of being given up (the
                        // reference aborts it; DeepSeek-V4 has no host tier at all).
                        None if self.has_snapshots()
                            && !self.policy().aborts_a_retraction_without_host_room() =>
                        {
                            RetractOutcome::Kept {
                                prefix_lock: device_lock,
                                write_back: None,
                            }
                        }
                        None => {
                            self.release_published(device_lock, transient);
                            RetractOutcome::HostExhausted
                        }
                    }
                } else {
                    let host_lock = self.lock(m.device, Tier::Host);
                    self.release_published(device_lock, transient);
                    // The whole prefix is on host already: kvtier frees its device copy
                    // now; the reference leaves it cached, for eviction to take.
                    if !self.policy().completes_an_empty_retraction_at_once() {
                        self.demote(m.device);
                    }
                    RetractOutcome::Kept {
                        prefix_lock: host_lock,
                        write_back: None,
                    }
                };
                // Under the reference policy a retraction that finds no host room aborts
                // the request before anything is cached: both slots are freed (its pages
                // are published all the same).
                let publish = !(self.policy().aborts_a_retraction_without_host_room()
                    && matches!(outcome, RetractOutcome::HostExhausted));
                self.settle_family(m.device, family, publish);
                if nothing_to_copy && self.policy().completes_an_empty_retraction_at_once() {
                    // The reference completes such a retraction as if its copy were
                    // acknowledged at once: device copies of states that have host
                    // copies, and that nothing holds any more, go (its KV stays).
                    self.with_family(|family, tree| family.copies_settled(tree));
                }
                if let Some(lock) = old_host_lock {
                    self.unlock(lock);
                }
                drop(tables);
                self.drain_releases();
                OpResult::Retracted(outcome)
            }
            CacheOp::InsertPrefetched {
                tokens,
                start_page,
                pages,
                host_lock,
                state,
            } => {
                let inserted = self.insert(Tier::Host, &tokens, start_page, pages);
                debug_assert!(inserted.is_ok(), "prefetch insert: {inserted:?}");
                if let (Ok(result), Some(slot)) = (&inserted, state) {
                    let node = result.last_node;
                    self.with_states(|states, tree| states.attach_host(tree, node, slot));
                }
                self.unlock(host_lock);
                OpResult::Inserted
            }
            CacheOp::PublishDecode {
                publication,
                checkpoint,
                renew,
                retire,
                stops,
            } => {
                let (old, ticket) = stops.map_or((None, None), |(old, t)| (Some(old), Some(t)));
                let (mut published, checkpoint) =
                    self.publish_decode(publication, checkpoint, renew, retire, old);
                if let Some(ticket) = ticket
                    && let Some((lock, _)) = published.take()
                {
                    handed_over.push((ticket, lock));
                }
                OpResult::PublishedDecode {
                    published,
                    checkpoint,
                }
            }
            CacheOp::Admit(program) => OpResult::Admitted(self.admit(program)),
            CacheOp::DiscardLoadBack { pages, states } => {
                if !states.is_empty() {
                    self.with_states(|family, tree| family.discard_slots(tree, &states));
                }
                OpResult::Discarded(self.discard_load_back(&pages))
            }
            CacheOp::BackedUp { pin, page_hashes } => {
                self.emit_backed_up(pin.node(), &page_hashes);
                self.unlock(pin);
                OpResult::BackedUp
            }
        }
    }

    /// Publishes a request's pages; `old` is the request's previous device lock,
    /// released once the new one is taken (so the path is never unpinned). Returns the
    /// lock on the published path (`old` itself when nothing new was published) and its
    /// depth in pages.
    pub(crate) fn publish(
        &mut self,
        p: Publication,
        old: Option<NodeLock>,
    ) -> (Option<NodeLock>, u32) {
        let ps = self.page_size() as usize;
        let total = (p.tokens.len() / ps) as u32;
        if p.pages.is_empty() {
            return (old, p.prefix.min(total));
        }
        let Ok(result) = self.insert_at(
            Tier::Device,
            &p.tokens[..total as usize * ps],
            p.prefix,
            p.pages,
            p.at,
        ) else {
            debug_assert!(false, "publish contract violated");
            return (old, p.prefix);
        };
        let lock = self.lock(result.last_node, Tier::Device);
        // A caller that passed its previous lock gives it up here; otherwise the
        // request still holds it on `at` until the reply is in.
        let still_held = if old.is_some() { None } else { p.at };
        if let Some(old) = old {
            self.unlock(old);
        }
        if let Some(key) = p.tables {
            self.commit_tables(key, result.last_node, still_held);
        }
        (Some(lock), total)
    }

    /// A stopping request's part of its family, its prefix published up to `terminal`
    /// (`publish` false: the policy keeps nothing of it). Group tables are not settled
    /// here: the publication committed them, and their lease goes with the op.
    pub(crate) fn settle_family(&mut self, terminal: NodeId, family: FamilyRelease, publish: bool) {
        match family {
            FamilyHold::States(states) => self.settle_states(terminal, states, publish),
            FamilyHold::Lease(lease) => {
                let request = lease.settle();
                self.with_family(|family, tree| family.settle(tree, request, terminal, publish));
            }
            FamilyHold::Dense | FamilyHold::Tables(_) => {}
        }
    }

    /// Locks freshly written host pages for their L3 backup.
    fn pin_backup(&mut self, written: crate::WrittenBack) -> Option<BackupSource> {
        let node = written.deepest?;
        if written.host_pages.is_empty() {
            return None;
        }
        if written.page_hashes.len() != written.host_pages.len() {
            debug_assert!(false, "written-back nodes without page hashes");
            return None;
        }
        Some(BackupSource {
            pin: self.lock(node, Tier::Host),
            pages: written.host_pages,
            hashes: written.page_hashes,
            states: written.states,
        })
    }

    /// Attaches host pages to the nodes on `device`'s path that lack a readable host
    /// copy, evicting host cache if needed, and pins the path on both tiers; a hybrid
    /// model's device states on them are copied too. `None` (nothing changed) when the
    /// host pool cannot make room.
    fn attach_write_back(&mut self, device: NodeId, host: NodeId) -> Option<Attached> {
        let nodes = self.nodes_without(Tier::Host, device);
        let need = self.pages_needed(Tier::Host, &nodes);
        let guard = self.lock(host, Tier::Host);
        let attached = if self.ensure_free(Tier::Host, need) {
            self.attach_for_write_back(&nodes)
        } else {
            None
        };
        self.unlock(guard);
        let (ticket, mut pairs) = attached?;
        pairs.extend(self.attach_family_write_back(ticket, &nodes));
        Some(Attached {
            ticket,
            pairs,
            device_node: device,
        })
    }
}
