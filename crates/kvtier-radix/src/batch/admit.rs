//! Executing an admission program: the sequential admission loop of one step.

use kvtier_types::Tier;

use super::*;
use crate::{Hosted, RadixCore, TablesKey};

impl RadixCore {
    /// Runs an admission program: the sequential admission loop of one step.
    pub(super) fn admit(&mut self, program: AdmitProgram) -> Vec<Outcome> {
        let AdmitProgram {
            mut budget,
            max_rows,
            mut slots,
            mixed,
            decode_tokens: d,
            use_host,
            reuse,
            released,
            intents,
        } = program;
        self.with_family(|family, tree| family.begin_plan(tree, released));
        self.begin_group_budget();
        let ps = self.page_size();
        let mut rows = 0usize;
        let mut prefill_rows = 0usize;
        let mut stopped = false;
        let mut outcomes = Vec::with_capacity(intents.len());
        for intent in intents {
            if !stopped && (budget <= 0 || rows == max_rows) {
                stopped = true;
            }
            let decode_like = matches!(intent, Intent::Decode { .. } | Intent::Recovery { .. });
            if !stopped && decode_like && !mixed && prefill_rows > 0 {
                stopped = true;
            }
            if stopped {
                outcomes.push(intent.unused());
                continue;
            }
            let remaining = budget as u32;
            let outcome = match intent {
                Intent::FirstChunk {
                    tokens,
                    prefill_len,
                    prefetch,
                    denied,
                } => {
                    let prefetched = prefetch.map(|check| self.try_prefetch(&check));
                    let skipped = match prefetched {
                        Some(Err(why)) => Some(why),
                        _ => None,
                    };
                    match prefetched.and_then(Result::ok) {
                        Some(outcome) => outcome,
                        None if slots == 0 => Outcome::waits(),
                        None if denied
                            .as_deref()
                            .is_some_and(|&d| self.still_denied(d, remaining)) =>
                        {
                            Outcome::Denied(*denied.expect("checked"))
                        }
                        None => {
                            let ask = FirstChunkAsk {
                                tokens: &tokens,
                                prefill_len,
                                remaining,
                                d,
                                use_host,
                                reuse,
                            };
                            let mut outcome = match self.hosted() {
                                Hosted::Paged(_) => self.first_chunk_paged(ask),
                                Hosted::Mamba(_) => self.first_chunk_hybrid(ask),
                                Hosted::Dense | Hosted::Registered(_) => self.first_chunk(ask),
                            };
                            if let Outcome::Admitted(a) = &mut outcome {
                                if let Some(lost) = self.lost_hits(&tokens, a.begin_pages) {
                                    (a.capped_pages, a.dropped_pages) = lost;
                                }
                                if let Some(why) = skipped {
                                    self.prefetch_skipped[why as usize] += 1;
                                }
                            }
                            outcome
                        }
                    }
                }
                Intent::NextChunk {
                    remaining: left,
                    tail_free,
                    commit,
                    family,
                } => {
                    let t = remaining.min(left);
                    // The reference makes room for whole fresh pages, ignoring the tail.
                    let room = if self.policy().rooms_whole_pages() {
                        t.div_ceil(ps)
                    } else {
                        grow(tail_free, t, ps).0
                    };
                    self.grow_row(t, tail_free, room, commit, family, t)
                }
                Intent::Decode {
                    reserve,
                    tail_free,
                    commit,
                    family,
                } => {
                    let room = grow(tail_free, reserve, ps).0;
                    self.grow_row(reserve, tail_free, room, commit, family, d)
                }
                Intent::Recovery {
                    tokens,
                    tail_free,
                    mut kept,
                    computed,
                    family,
                } => {
                    let held = std::mem::take(&mut kept.locks);
                    let tail_pages = kept.tail.len() as u32;
                    let outcome = match self.hosted() {
                        _ if slots == 0 => Outcome::Waits { held, commit: None },
                        Hosted::Paged(_) => match family {
                            // The reference resumes it as a decode from its kept tables.
                            FamilyAsk::Groups(key, first) => {
                                let groups = Some((key, first));
                                self.recovery(&tokens, tail_pages, tail_free, held, d, groups)
                            }
                            // Its group tables went at retraction: it computes its
                            // history again from the deepest snapshot.
                            _ => {
                                drop(held);
                                Outcome::Recompute
                            }
                        },
                        Hosted::Mamba(_) => {
                            self.recovery_hybrid(&tokens, tail_pages, tail_free, held, d, computed)
                        }
                        Hosted::Dense | Hosted::Registered(_) => {
                            self.recovery(&tokens, tail_pages, tail_free, held, d, None)
                        }
                    };
                    self.settle_recovery(outcome, kept)
                }
            };
            match &outcome {
                Outcome::Admitted(a) => {
                    rows += 1;
                    slots -= 1;
                    if a.tokens > 0 {
                        prefill_rows += 1;
                        budget -= i64::from(a.tokens);
                    } else {
                        budget -= i64::from(d);
                    }
                }
                Outcome::Grown { tokens, .. } => {
                    rows += 1;
                    if decode_like {
                        // A decode row costs `d` tokens of budget whatever it reserves.
                        budget -= i64::from(d);
                    } else {
                        prefill_rows += 1;
                        budget -= i64::from(*tokens);
                    }
                }
                Outcome::Waits { .. }
                | Outcome::StaysRetracted(_)
                | Outcome::Prefetch(_)
                | Outcome::TooBig
                | Outcome::Recompute
                | Outcome::StateLost
                | Outcome::Denied(_) => {}
            }
            outcomes.push(outcome);
        }
        outcomes
    }

    /// A running request's row: `n` more KV slots after making `room` pages free, and
    /// what it asks of the family (`input`: the row's own input tokens, which the
    /// reference's group tables alone cover, #583). Inlined: every decode row comes
    /// here.
    #[inline(always)]
    fn grow_row(
        &mut self,
        n: u32,
        tail_free: u32,
        room: u32,
        commit: Option<Box<ChunkCommit>>,
        family: FamilyAsk,
        input: u32,
    ) -> Outcome {
        match family {
            FamilyAsk::Groups(key, first) => {
                let span = if self.policy().groups_span_the_input_only() {
                    input
                } else {
                    n
                };
                self.grow_with_groups(n, tail_free, room, commit, (key, first, span))
            }
            FamilyAsk::Lease(request) if !self.family_grows(request, n) => Outcome::Waits {
                held: Vec::new(),
                commit,
            },
            ask => self.grow_running(n, tail_free, room, commit, ask.checkpoint()),
        }
    }

    /// Whether a registered family's part of a running request takes `tokens` more.
    #[inline(never)]
    fn family_grows(&mut self, request: u32, tokens: u32) -> bool {
        self.with_family(|family, tree| family.grow(tree, request, tokens))
    }

    /// Slots for `n` more tokens of a running request after making `room` pages free,
    /// or `Waits`. A hybrid intent's last chunk is committed first, and the request gets
    /// the checkpoint slot it asks for. Inlined: it runs for every decode row, and most
    /// take the fast path.
    #[inline(always)]
    fn grow_running(
        &mut self,
        n: u32,
        tail_free: u32,
        room: u32,
        commit: Option<Box<ChunkCommit>>,
        checkpoint: CheckpointNeed,
    ) -> Outcome {
        if n <= tail_free && room == 0 && commit.is_none() && checkpoint == CheckpointNeed::None {
            // The common decode step: its tokens fit the pages it holds.
            return Outcome::Grown {
                tokens: n,
                pages: None,
                committed: None,
                groups: None,
            };
        }
        self.grow_into_new_pages(n, tail_free, room, commit, checkpoint)
    }

    /// [`Self::grow_running`] past its fast path.
    fn grow_into_new_pages(
        &mut self,
        n: u32,
        tail_free: u32,
        room: u32,
        commit: Option<Box<ChunkCommit>>,
        checkpoint: CheckpointNeed,
    ) -> Outcome {
        let (need, _) = grow(tail_free, n, self.page_size());
        if room > 0 && !self.ensure_free(Tier::Device, room) {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let room_for_checkpoint = match checkpoint {
            CheckpointNeed::None => true,
            need => {
                let made = self.with_states(|states, tree| states.ensure_device(tree, 1, None));
                made == Some(true) || need == CheckpointNeed::Wanted
            }
        };
        if !room_for_checkpoint {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let asked = commit.is_some() || checkpoint != CheckpointNeed::None;
        let published = commit.and_then(|c| self.commit_chunk(*c, None));
        let Some(pages) = self.allocate(Tier::Device, need as usize) else {
            debug_assert!(false, "pages were made free");
            return Outcome::waits();
        };
        let checkpoint = match checkpoint {
            CheckpointNeed::None => None,
            _ => self.with_states(|states, _| states.allocate()).flatten(),
        };
        Outcome::Grown {
            tokens: n,
            pages: Some(Box::new(pages)),
            committed: asked.then(|| {
                Box::new(Committed {
                    published,
                    checkpoint,
                })
            }),
            groups: None,
        }
    }

    /// [`Self::grow_running`] for a request with group tables: `n` KV slots, and its
    /// tables grown by `span` positions from `first` (their key and the op's first
    /// position). The groups are admitted first, and the grown row carries their view.
    /// Kept out of line: the dense decode loop never calls it.
    #[inline(never)]
    fn grow_with_groups(
        &mut self,
        n: u32,
        tail_free: u32,
        room: u32,
        commit: Option<Box<ChunkCommit>>,
        (key, first, span): (TablesKey, u32, u32),
    ) -> Outcome {
        // The reference's order: room for the KV (its eviction stays even when the
        // groups then refuse), the groups' admission, then the op's commit (the
        // request's last chunk, under `Policy::Reference`), then the release and the
        // acquisition.
        if self.policy().admits_groups_after_the_room()
            && room > 0
            && !self.ensure_free(Tier::Device, room)
        {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let publication = commit.as_deref().and_then(|c| c.publication.as_ref());
        if !self.admit_groups(key, first, first + span, publication) {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let mut grown = self.grow_running(n, tail_free, room, commit, CheckpointNeed::None);
        if let Outcome::Grown { groups, .. } = &mut grown {
            self.acquire_groups(key, first, first + span);
            *groups = Some(Box::new(self.group_view(key)));
        }
        grown
    }
}
