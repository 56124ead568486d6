//! The admission program of a step: mid-flight publications, the candidates in order,
//! and the outcomes applied to the requests.

use kvtier_radix::{
    AdmitProgram, CacheOp, CheckpointNeed, ChunkCommit, FamilyAsk, FamilyHold, Intent, Outcome,
    PrefetchCheck, RetractedHandles, TokenRef,
};
use kvtier_types::AbortReason;

use super::*;
use crate::SchedulerCore;
use crate::draft::{Entry, PlanInProgress, Resume};
use crate::outbox::Target;
use crate::request::{LocalKv, Prefetch, Republish, Retracted, State};

impl SchedulerCore {
    /// Mid-flight publication: every request still in prefill publishes the full pages of
    /// the chunks it has already computed, before any candidate is probed, so a sibling
    /// with the same prefix admitted in this very plan reuses them.
    pub(super) fn publish_computed_prompts(&mut self) {
        let ps = self.config.page_size;
        let prefilling: Vec<usize> = self
            .requests
            .keys()
            .filter(|&k| {
                matches!(
                    self.requests[k].state,
                    State::Prefilling(_) | State::PrefillDone(_)
                )
            })
            .collect();
        for key in prefilling {
            let mut state = std::mem::replace(&mut self.requests[key].state, State::Finished);
            let Some(run) = state.running_mut() else {
                self.requests[key].state = state;
                continue;
            };
            let computed = run.window_end() / ps;
            let cap = match self.config.paged {
                // Snapshots make a paged model's every prefix safe to reuse.
                Some(_) => None,
                None => self.config.midflight_publish_max_pages,
            };
            let computed = cap.map_or(computed, |cap| computed.min(cap));
            let publication = self.requests[key].publication(run, computed, ps);
            self.requests[key].state = state;
            if let Some((publication, republish)) = publication {
                let id = self.requests[key].id.clone();
                self.outbox.push(
                    CacheOp::Publish(publication),
                    Target::Publish { key, id, republish },
                );
            }
        }
    }

    /// Hybrid models: every request in prefill commits the chunks it has computed —
    /// their pages with its checkpoint, cached where it holds the state at their end —
    /// before any candidate is probed, so a sibling admitted in this plan reuses them.
    pub(super) fn commit_computed_chunks(&mut self) {
        let prefilling = self
            .requests
            .keys_where(|r| matches!(r.state, State::Prefilling(_) | State::PrefillDone(_)));
        for key in prefilling {
            // No new page: the checkpoint holds no state worth caching, and goes.
            let (Some(commit), Some(republish)) = self.chunk_commit(key) else {
                continue;
            };
            let ChunkCommit {
                publication: Some(publication),
                checkpoint,
                ..
            } = *commit
            else {
                continue;
            };
            self.queue_publication(key, (publication, *republish), checkpoint, None, false);
        }
    }

    /// Candidates in scheduling order: priority class, then request id. One buffer
    /// sized once; the stable sort keeps id order within a class and is linear when
    /// one class dominates (a steady decode batch).
    pub(super) fn candidates(&self) -> Vec<(u8, usize)> {
        let mixed = self.config.enable_mixed_prefill_decode;
        let mut ranked = Vec::with_capacity(self.requests.len());
        for key in self.requests.keys() {
            if let Some(c) = class(self.requests[key].state.kind(), mixed) {
                ranked.push((c, key));
            }
        }
        ranked.sort_by_key(|&(c, _)| c);
        ranked
    }

    /// The step's admission program: one intent per candidate that can run.
    /// `released`: requests finished since the last plan.
    pub(super) fn admit_program(
        &mut self,
        released: bool,
    ) -> (AdmitProgram, Vec<usize>, Vec<Entry>) {
        let c = &self.config;
        let ps = c.page_size;
        let prefetch_on = c.l3_prefetch_enabled();
        let threshold = c.prefetch_threshold;
        let hybrid = c.mamba.is_some();
        let paged = c.paged.is_some();
        let policy = c.policy;
        let ranked = self.candidates();
        let mut intents = Vec::with_capacity(ranked.len());
        let mut candidates = Vec::with_capacity(ranked.len());
        let mut entries = Vec::with_capacity(ranked.len());
        for (_, key) in ranked {
            let r = &self.requests[key];
            let entry = match &r.state {
                State::Prefilling(run) => {
                    let (remaining, tail_free) =
                        (r.prefill_len - run.window_end(), run.local_kv.tail_free);
                    let family = match &run.family {
                        FamilyHold::Tables(t) => FamilyAsk::Groups(t.key(), run.window_end()),
                        FamilyHold::Lease(lease) => FamilyAsk::Lease(lease.request()),
                        _ if hybrid => FamilyAsk::Checkpoint(CheckpointNeed::of_chunk()),
                        _ => FamilyAsk::Dense,
                    };
                    // The reference commits the last chunk when this one is admitted;
                    // kvtier did at the start of the plan.
                    let (commit, republish) =
                        if (hybrid || paged) && policy.commits_chunks_at_the_next_row() {
                            self.chunk_commit(key)
                        } else {
                            (None, None)
                        };
                    intents.push(Intent::NextChunk {
                        remaining,
                        tail_free,
                        commit,
                        family,
                    });
                    Entry::NextChunk(republish)
                }
                State::Submitted | State::PrefetchDone => {
                    let full = r.full_pages_except_last(ps);
                    let hit = r.storage_hit_pages.min(full);
                    let prefetch = (prefetch_on && hit > 0 && matches!(r.state, State::Submitted))
                        .then(|| PrefetchCheck {
                            tokens: TokenRef::new(&r.tokens, (hit * ps) as usize),
                            threshold,
                        });
                    intents.push(Intent::FirstChunk {
                        tokens: TokenRef::new(&r.tokens, (full * ps) as usize),
                        prefill_len: r.prefill_len,
                        prefetch,
                        denied: r.denied.map(Box::new),
                    });
                    Entry::FirstChunk
                }
                State::PrefillDone(run) | State::Decoding(run) => {
                    let (reserve, tail_free) = (run.reserve, run.local_kv.tail_free);
                    // A paged decode row computes the newest token's entries (position
                    // `len - 1`); the reference admits and acquires its groups one
                    // position further on, as if the row computed `len`. Under the
                    // reference's order a first decode also commits its last chunk.
                    let len = r.tokens.len() as u32;
                    let first = matches!(r.state, State::PrefillDone(_));
                    let family = match &run.family {
                        FamilyHold::Dense => FamilyAsk::Dense,
                        FamilyHold::States(states) => {
                            FamilyAsk::Checkpoint(CheckpointNeed::of_decode(
                                policy,
                                first,
                                len,
                                ps,
                                states.checkpoint.is_some(),
                            ))
                        }
                        FamilyHold::Tables(t) => {
                            let at = if policy.admits_decode_groups_a_position_on() {
                                len
                            } else {
                                len - 1
                            };
                            FamilyAsk::Groups(t.key(), at)
                        }
                        FamilyHold::Lease(lease) => FamilyAsk::Lease(lease.request()),
                    };
                    let commits = first
                        && family != FamilyAsk::Dense
                        && policy.commits_chunks_at_the_next_row();
                    let (commit, republish) = if commits {
                        self.chunk_commit(key)
                    } else {
                        (None, None)
                    };
                    intents.push(Intent::Decode {
                        reserve,
                        tail_free,
                        commit,
                        family,
                    });
                    Entry::Decode(republish)
                }
                State::Retracted(_) => {
                    let State::Retracted(held) =
                        std::mem::replace(&mut self.requests[key].state, State::Finished)
                    else {
                        unreachable!("matched above");
                    };
                    let Retracted {
                        prefix_lock,
                        device_lock,
                        local_kv,
                        published_pages,
                        tables,
                    } = held;
                    let r = &self.requests[key];
                    // Every token but the last has been computed.
                    let computed = (r.tokens.len() as u32).saturating_sub(1);
                    let LocalKv { pages, tail_free } = local_kv;
                    intents.push(Intent::Recovery {
                        tokens: TokenRef::new(&r.tokens, (published_pages * ps) as usize),
                        tail_free,
                        kept: Box::new(RetractedHandles {
                            locks: std::iter::once(prefix_lock).chain(device_lock).collect(),
                            tail: pages,
                        }),
                        computed,
                        family: match &tables {
                            Some(tables) => FamilyAsk::Groups(tables.key(), computed),
                            None => FamilyAsk::Dense,
                        },
                    });
                    Entry::Recovery(Box::new(Resume {
                        tail_free,
                        published_pages,
                        tables,
                    }))
                }
                _ => Entry::None,
            };
            candidates.push(key);
            entries.push(entry);
        }
        let program = AdmitProgram {
            budget: i64::from(self.config.max_scheduled_tokens),
            max_rows: self.config.max_batch_size as usize,
            slots: self.slots.available(),
            mixed: self.config.enable_mixed_prefill_decode,
            decode_tokens: self.config.decode_input_tokens,
            use_host: self.config.l2_enabled(),
            reuse: !self.config.disable_prefix_cache,
            released,
            intents,
        };
        (program, candidates, entries)
    }

    /// A hybrid request's last chunk to commit with its next row: its computed full pages
    /// (those of the chunk window, not the generated token's) and its checkpoint.
    fn chunk_commit(&mut self, key: usize) -> (Option<Box<ChunkCommit>>, Option<Box<Republish>>) {
        let ps = self.config.page_size;
        let mut state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        let Some(run) = state.running_mut() else {
            self.requests[key].state = state;
            return (None, None);
        };
        let computed = run.window_end() / ps;
        let publication = self.requests[key].publication(run, computed, ps);
        let checkpoint = run.family.states_mut().and_then(|s| s.take_checkpoint());
        // Nothing new to publish: the tables commit again where the request's published
        // prefix ends (not while a publication is still in flight, which committed them
        // further on).
        let recommit = match (&publication, run.family.tables()) {
            (None, Some(t)) if run.published_ahead == 0 => Some((t.key(), run.device_lock.node())),
            _ => None,
        };
        self.requests[key].state = state;
        let (publication, republish) = match publication {
            Some((p, r)) => (Some(p), Some(Box::new(r))),
            None => (None, None),
        };
        (
            Some(Box::new(ChunkCommit {
                publication,
                checkpoint,
                recommit,
            })),
            republish,
        )
    }

    /// Applies the admission outcomes in candidate order.
    pub(super) fn apply_admissions(&mut self, draft: &mut PlanInProgress, outcomes: Vec<Outcome>) {
        let mut outcomes = outcomes.into_iter();
        let candidates = std::mem::take(&mut draft.candidates);
        let entries = std::mem::take(&mut draft.entries);
        for (&key, entry) in candidates.iter().zip(entries) {
            if matches!(entry, Entry::None) {
                continue;
            }
            let outcome = outcomes.next().expect("one outcome per intent");
            match (entry, outcome) {
                // Decode apart from the next chunk: it is the hot arm (merged, W2 cost
                // 1.3 % more per step).
                (
                    Entry::Decode(republish),
                    Outcome::Grown {
                        tokens,
                        pages,
                        committed,
                        groups,
                    },
                ) => {
                    if let Some(committed) = committed {
                        self.apply_commit(key, *committed, republish);
                    }
                    let pages = pages.map_or_else(kvtier_host::OwnedPages::empty, |p| *p);
                    self.decode(key, tokens, pages, &mut draft.rows);
                    if let Some(groups) = groups {
                        draft.rows.set_groups(false, *groups);
                    }
                }
                (
                    Entry::NextChunk(republish),
                    Outcome::Grown {
                        tokens,
                        pages,
                        committed,
                        groups,
                    },
                ) => {
                    if let Some(committed) = committed {
                        self.apply_commit(key, *committed, republish);
                    }
                    let pages = pages.map_or_else(kvtier_host::OwnedPages::empty, |p| *p);
                    self.next_chunk(key, tokens, pages, &mut draft.rows);
                    if let Some(groups) = groups {
                        draft.rows.set_groups(true, *groups);
                    }
                }
                (
                    Entry::NextChunk(_) | Entry::Decode(_),
                    Outcome::Waits {
                        commit: Some(commit),
                        ..
                    },
                ) => self.restore_commit(key, *commit),
                (Entry::FirstChunk, Outcome::Prefetch(start)) => {
                    let kvtier_radix::PrefetchStart {
                        host_lock,
                        pages,
                        start_page,
                        state,
                    } = *start;
                    let fetch = Prefetch {
                        op: 0,
                        host_lock,
                        pages,
                        start_page,
                        state,
                    };
                    self.start_prefetch(key, fetch, &mut draft.plan);
                }
                (Entry::FirstChunk, Outcome::Denied(denial)) => {
                    self.requests[key].denied = Some(denial);
                }
                (Entry::FirstChunk, Outcome::Admitted(admission)) => {
                    self.first_chunk(key, *admission, draft);
                }
                (Entry::Recovery(resume), Outcome::Admitted(admission)) => {
                    self.recovery(key, *resume, *admission, draft);
                }
                (Entry::Recovery(resume), Outcome::StaysRetracted(kept)) => {
                    let Resume {
                        tail_free,
                        published_pages,
                        tables,
                    } = *resume;
                    let RetractedHandles { locks, tail } = *kept;
                    let local_kv = LocalKv {
                        pages: tail,
                        tail_free,
                    };
                    let mut held = locks.into_iter();
                    if let Some(prefix_lock) = held.next() {
                        self.requests[key].state = State::Retracted(Retracted {
                            prefix_lock,
                            device_lock: held.next(),
                            local_kv,
                            published_pages,
                            tables,
                        });
                    } else {
                        debug_assert!(false, "a recovery's locks did not come back");
                    }
                }
                (Entry::Recovery(resume), Outcome::TooBig) => {
                    // Even an empty device pool could not hold it again: give up, and say so.
                    drop(resume);
                    let id = self.requests[key].id.clone();
                    self.abort_notice(id, AbortReason::ExceedsDevicePool, &mut draft.plan);
                }
                (Entry::Recovery(resume), Outcome::Recompute) => {
                    // Its state cannot be restored exactly: compute its history again from
                    // the deepest cached state.
                    drop(resume);
                    self.requeue(key, &mut draft.plan);
                }
                (Entry::Recovery(resume), Outcome::StateLost) => {
                    drop(resume);
                    let id = self.requests[key].id.clone();
                    self.abort_notice(id, AbortReason::StateLost, &mut draft.plan);
                }
                (_, Outcome::Waits { .. }) => {}
                (entry, outcome) => {
                    debug_assert!(false, "outcome {outcome:?} for {entry:?}");
                }
            }
        }
        draft.candidates = candidates;
    }
}
