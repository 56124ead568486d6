//! One scheduling step: `next_plan`.
//!
//! Order of work (spec/fsm-scheduler.md §5):
//! 1. issue the write-backs of requests that finished since the last plan;
//! 2. forget finished requests;
//! 3. order candidates by (priority class, request id) and admit them one by one under
//!    the token budget and the batch limit;
//! 4. if nothing could run, retract the longest running request.
//!
//! Admission is transactional: a candidate is first *probed* (read-only) and its page
//! need checked against free plus evictable pages; only then is the match committed,
//! cache evicted and pages allocated. A candidate that cannot run changes nothing.

use std::collections::HashSet;

use kvtier_radix::{Match, NodeLock, Probe};
use kvtier_types::{
    AbortNotice, AbortReason, BackupOp, ExecutionPlan, ForwardRow, LoadBackOp, OpId, PrefetchOp,
    RequestId, RowKind, Tier, Token, TransferPair, WriteBackOp,
};

use crate::Scheduler;
use crate::request::{Draining, LocalKv, Prefetch, Request, Retracted, Running, State, StateKind};
use crate::scheduler::Inflight;

/// Rows and flat buffers of the forward batch under construction.
#[derive(Default)]
struct Rows {
    prefill: Vec<ForwardRow>,
    decode: Vec<ForwardRow>,
    page_table: Vec<u32>,
    input_ids: Vec<Token>,
    shifted_input_ids: Vec<Token>,
}

impl Rows {
    /// Appends a running request's page table (tree prefix, then its own pages); returns
    /// where it starts and its length.
    fn push_page_table(&mut self, run: &Running) -> (u32, u32) {
        let start = self.page_table.len() as u32;
        self.page_table.extend_from_slice(&run.prefix_pages);
        self.page_table.extend_from_slice(run.lka.pages.ids());
        (start, run.occupied_len() as u32)
    }

    /// A decode row of `d` input tokens over the request's whole page table, new from
    /// `begin`. A recovery row (new slot after retraction) also names its input token and
    /// history length, and reports prefill length 0 as the reference does.
    fn push_decode_row(&mut self, r: &Request, run: &Running, kind: RowKind, begin: u32, d: u32) {
        let (pages_start, pages_len) = self.push_page_table(run);
        let recovery = kind == RowKind::Recovery;
        self.decode.push(ForwardRow {
            request_id: r.id.clone(),
            kind,
            slot: run.slot.id(),
            input_length: d,
            prefill_length: if recovery { 0 } else { r.prefill_len },
            pages_start,
            pages_len,
            begin,
            size: pages_len - begin,
            extend_prefix_len: 0,
            input_ids_start: 0,
            decode_input_id: if recovery {
                r.tokens.last().copied().unwrap_or(-1)
            } else {
                -1
            },
            hist_token_len: if recovery {
                r.tokens.len() as i32 - 1
            } else {
                -1
            },
        });
    }
}

/// Transfer pairs already emitted in this plan, per direction (a pair is emitted once).
#[derive(Default)]
struct Seen {
    write_back: HashSet<TransferPair>,
    load_back: HashSet<TransferPair>,
}

fn dedup(seen: &mut HashSet<TransferPair>, pairs: Vec<TransferPair>) -> Vec<TransferPair> {
    pairs.into_iter().filter(|p| seen.insert(*p)).collect()
}

/// Priority class of a state (lower runs first).
fn class(kind: StateKind, mixed: bool) -> Option<u8> {
    Some(match kind {
        StateKind::Decoding | StateKind::PrefillDone => {
            if mixed {
                0
            } else {
                3
            }
        }
        StateKind::Prefilling => 1,
        // A request whose prefetch landed runs like a new one (reference PR #293).
        StateKind::Submitted | StateKind::PrefetchDone => 2,
        StateKind::Retracted => 4,
        StateKind::Aborting => 9,
        StateKind::Draining
        | StateKind::Prefetching
        | StateKind::Retracting
        | StateKind::WritingBack
        | StateKind::Finished => return None,
    })
}

impl Scheduler {
    /// Builds the next execution plan.
    pub fn next_plan(&mut self) -> ExecutionPlan {
        let started = self
            .config
            .slow_step_threshold
            .map(|_| std::time::Instant::now());
        self.stats.plans += 1;
        let mut plan = ExecutionPlan::default();
        let mut seen = Seen::default();
        self.issue_finish_write_backs(&mut plan, &mut seen);
        self.issue_backups(&mut plan);
        self.erase_finished();
        if self.config.publish_prefix_mid_flight {
            self.publish_computed_prompts();
        }
        let candidates = self.candidates();
        let mut rows = Rows {
            page_table: Vec::with_capacity(self.page_table_hint),
            ..Rows::default()
        };
        self.admit(&candidates, &mut rows, &mut plan, &mut seen);
        if rows.prefill.is_empty() && rows.decode.is_empty() && !candidates.is_empty() {
            self.retract_one(&candidates, &mut plan, &mut seen);
        }
        let forward = &mut plan.forward;
        forward.num_prefill_rows = rows.prefill.len();
        forward.rows = rows.prefill;
        forward.rows.append(&mut rows.decode);
        self.page_table_hint = rows.page_table.len();
        forward.page_table = rows.page_table;
        forward.input_ids = rows.input_ids;
        forward.shifted_input_ids = rows.shifted_input_ids;
        if let (Some(started), Some(threshold)) = (started, self.config.slow_step_threshold) {
            let elapsed = started.elapsed();
            if elapsed >= threshold {
                tracing::info!(
                    target: "kvtier::step",
                    plan = self.stats.plans,
                    elapsed_us = elapsed.as_micros() as u64,
                    rows = plan.forward.rows.len(),
                    prefill_rows = plan.forward.num_prefill_rows,
                    write_backs = plan.write_backs.len(),
                    load_backs = plan.load_backs.len(),
                    "slow_step"
                );
            }
        }
        #[cfg(debug_assertions)]
        if std::env::var_os("KVTIER_DEBUG_MEM").is_some() {
            let checked = self.check_invariants();
            debug_assert!(
                checked.is_ok(),
                "after plan {}: {checked:?}",
                self.stats.plans
            );
        }
        plan
    }

    fn issue_finish_write_backs(&mut self, plan: &mut ExecutionPlan, seen: &mut Seen) {
        let draining: Vec<usize> = self
            .index
            .values()
            .copied()
            .filter(|&k| matches!(self.req(k).state, State::Draining(_)))
            .collect();
        for key in draining {
            let State::Draining(d) =
                std::mem::replace(&mut self.req_mut(key).state, State::Finished)
            else {
                continue;
            };
            if d.pairs.is_empty() {
                self.cache.write_back_done(d.ticket, true);
                continue;
            }
            let id = self.req(key).id.clone();
            let op = self.issue_write_back(d, id, false, plan, seen);
            self.req_mut(key).state = State::WritingBack { op };
        }
    }

    /// Emits the L3 backups queued by acknowledged write-backs; each keeps its source
    /// pages pinned until `BackupDone`.
    fn issue_backups(&mut self, plan: &mut ExecutionPlan) {
        for backup in std::mem::take(&mut self.pending_backups) {
            let op_id = self.next_op_id();
            plan.backups.push(BackupOp {
                op_id,
                src_pages: backup.pages,
                page_hashes: backup.hashes,
            });
            self.backups.insert(op_id, backup.pin);
        }
    }

    /// Emits a write-back op for attached copies; the op table keeps its ticket (which
    /// pins the copy) until the engine acknowledges it.
    fn issue_write_back(
        &mut self,
        d: Draining,
        request: RequestId,
        is_retract: bool,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) -> OpId {
        let op_id = self.next_op_id();
        let pairs = dedup(&mut seen.write_back, d.pairs);
        plan.write_backs.push(WriteBackOp {
            op_id,
            pairs,
            is_retract,
        });
        let inflight = Inflight {
            request: Some(request),
            ticket: d.ticket,
            device_node: d.device_node,
            is_retract,
        };
        self.ops.insert(op_id, inflight);
        op_id
    }

    /// Tells the engine the scheduler gave up on a request (already released).
    fn abort_notice(
        &mut self,
        request_id: RequestId,
        reason: AbortReason,
        plan: &mut ExecutionPlan,
    ) {
        self.stats.scheduler_aborts += 1;
        plan.aborted.push(AbortNotice { request_id, reason });
    }

    /// Mid-flight publication: every request still in prefill publishes the full pages of
    /// the chunks it has already computed, before any candidate is probed, so a sibling
    /// with the same prefix admitted in this very plan reuses them.
    fn publish_computed_prompts(&mut self) {
        let ps = self.config.page_size;
        let prefilling: Vec<usize> = self
            .index
            .values()
            .copied()
            .filter(|&k| {
                matches!(
                    self.req(k).state,
                    State::Prefilling(_) | State::PrefillDone(_)
                )
            })
            .collect();
        for key in prefilling {
            let (done, mut run) =
                match std::mem::replace(&mut self.req_mut(key).state, State::Finished) {
                    State::Prefilling(run) => (false, run),
                    State::PrefillDone(run) => (true, run),
                    other => {
                        self.req_mut(key).state = other;
                        continue;
                    }
                };
            let computed = run.window_end() / ps;
            if let Some(i) = self.publish(key, &mut run, computed).first_changed {
                run.table_changed_from = Some(run.table_changed_from.map_or(i, |c| c.min(i)));
            }
            self.req_mut(key).state = if done {
                State::PrefillDone(run)
            } else {
                State::Prefilling(run)
            };
        }
    }

    /// Candidates in scheduling order: priority class, then request id.
    fn candidates(&self) -> Vec<usize> {
        let mixed = self.config.enable_mixed_prefill_decode;
        let mut buckets: [Vec<usize>; 10] = Default::default();
        for &key in self.index.values() {
            if let Some(c) = class(self.req(key).state.kind(), mixed) {
                buckets[c as usize].push(key);
            }
        }
        buckets.concat()
    }

    fn admit(
        &mut self,
        candidates: &[usize],
        rows: &mut Rows,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) {
        let mixed = self.config.enable_mixed_prefill_decode;
        let max_rows = self.config.max_batch_size as usize;
        let mut budget = i64::from(self.config.max_scheduled_tokens);
        for &key in candidates {
            let scheduled = rows.prefill.len() + rows.decode.len();
            if budget <= 0 || scheduled == max_rows {
                break;
            }
            let remaining = budget as u32;
            let used = match self.req(key).state.kind() {
                StateKind::Prefilling => self.schedule_next_chunk(key, remaining, rows),
                StateKind::Submitted if self.try_prefetch(key, plan) => None,
                StateKind::Submitted | StateKind::PrefetchDone => {
                    self.schedule_first_chunk(key, remaining, rows, plan, seen)
                }
                StateKind::PrefillDone | StateKind::Decoding => {
                    if !mixed && !rows.prefill.is_empty() {
                        break;
                    }
                    self.schedule_decode(key, rows)
                }
                StateKind::Retracted => {
                    if !mixed && !rows.prefill.is_empty() {
                        break;
                    }
                    self.schedule_recovery(key, rows, plan, seen)
                }
                _ => None,
            };
            if let Some(tokens) = used {
                budget -= i64::from(tokens);
            }
        }
    }

    // ----- admission helpers -----------------------------------------------------------

    /// Locks the device match, makes `need` pages free, and locks the path the request
    /// will read: with a deeper host match, device pages are attached to the host-only
    /// nodes (the load-back) and both tiers are locked. Returns the device lock, the host
    /// lock and the load-back pairs, or `None` with nothing changed.
    fn pin_prefix(
        &mut self,
        m: Match,
        need: u32,
        use_host: bool,
    ) -> Option<(NodeLock, Option<NodeLock>, Vec<TransferPair>)> {
        let guard = self.cache.lock(m.device, Tier::Device);
        if !self.cache.ensure_free(Tier::Device, need) {
            debug_assert!(false, "admission probe promised {need} pages");
            self.cache.unlock(guard);
            return None;
        }
        let pinned = if use_host && m.host_pages > m.device_pages {
            let href = self.cache.lock(m.host, Tier::Host);
            let nodes = self.cache.nodes_without(Tier::Device, m.host);
            match self.cache.attach_for_load_back(&nodes) {
                Some(pairs) => Some((self.cache.lock(m.host, Tier::Device), Some(href), pairs)),
                None => {
                    self.cache.unlock(href);
                    None
                }
            }
        } else {
            Some((self.cache.lock(m.device, Tier::Device), None, Vec::new()))
        };
        self.cache.unlock(guard);
        pinned
    }

    fn push_load_back(
        &mut self,
        pairs: Vec<TransferPair>,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) {
        if pairs.is_empty() {
            return;
        }
        let op_id = self.next_op_id();
        let pairs = dedup(&mut seen.load_back, pairs);
        plan.load_backs.push(LoadBackOp { op_id, pairs });
    }

    // ----- Submitted → Prefetching ------------------------------------------------------

    /// Starts an L3 prefetch instead of the first chunk when the request's consecutive
    /// L3 hits run more than `prefetch_threshold` pages past what the host already holds.
    /// The host-resident prefix is locked before any host eviction; the op names the
    /// pages by hashes derived from the tokens at the current host boundary, so they
    /// align whatever the engine's own hashes were.
    fn try_prefetch(&mut self, key: usize, plan: &mut ExecutionPlan) -> bool {
        let c = &self.config;
        if !c.enable_l3_storage || c.disable_prefix_cache || !c.l2_enabled() {
            return false;
        }
        let ps = c.page_size;
        let r = self.req(key);
        let hit = r.storage_hit_pages.min(r.full_pages_except_last(ps));
        if hit == 0 {
            return false;
        }
        let tokens = &r.tokens[..(hit * ps) as usize];
        let host = self.cache.probe(tokens).host_pages;
        let n = hit.saturating_sub(host);
        if n <= self.config.prefetch_threshold {
            return false;
        }
        let m = self
            .cache
            .match_prefix(&self.requests[key].tokens[..(hit * ps) as usize]);
        debug_assert_eq!(m.host_pages, host);
        let href = self.cache.lock(m.host, Tier::Host);
        if !self.cache.ensure_free(Tier::Host, n) {
            self.cache.unlock(href);
            return false;
        }
        let Some(pages) = self.cache.allocate(Tier::Host, n as usize) else {
            self.cache.unlock(href);
            return false;
        };
        let end = ((host + n) * ps) as usize;
        let page_hashes = kvtier_types::hash::rolling_page_hashes(
            None,
            &self.req(key).tokens[..end],
            ps as usize,
        )
        .split_off(host as usize);
        let op = self.next_op_id();
        plan.prefetches.push(PrefetchOp {
            op_id: op,
            request_id: self.req(key).id.clone(),
            dst_pages: pages.ids().to_vec(),
            page_hashes,
        });
        tracing::debug!(parent: &self.req(key).span, phase = "prefetching", pages = n);
        self.req_mut(key).state = State::Prefetching(Prefetch {
            op,
            href,
            pages,
            start_page: host,
        });
        true
    }

    // ----- Submitted → first chunk -----------------------------------------------------

    fn schedule_first_chunk(
        &mut self,
        key: usize,
        remaining: u32,
        rows: &mut Rows,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) -> Option<u32> {
        if self.slots.available() == 0 {
            return None;
        }
        let ps = self.config.page_size;
        let d = self.config.decode_input_tokens;
        let l2 = self.config.l2_enabled();
        let reuse = !self.config.disable_prefix_cache;
        let (prefill_len, full) = {
            let r = self.req(key);
            (r.prefill_len, r.full_pages_except_last(ps))
        };
        let probe = if reuse {
            self.cache
                .probe(&self.req(key).tokens[..(full * ps) as usize])
        } else {
            Probe::default()
        };
        let dev = probe.device_pages;
        let host = if l2 { probe.host_pages } else { 0 };
        let begin_pages = dev.max(host);
        let load_back = host.saturating_sub(dev);
        let t = remaining.min(prefill_len - begin_pages * ps);
        let need = load_back + (t + d).div_ceil(ps);
        if !self
            .cache
            .can_free(Tier::Device, need, probe.device_unlocked_pages)
        {
            return None;
        }
        let m = if reuse {
            let tokens = &self.requests[key].tokens[..(full * ps) as usize];
            self.cache.match_prefix(tokens)
        } else {
            let root = self.cache.root();
            Match {
                device: root,
                device_pages: 0,
                host: root,
                host_pages: 0,
            }
        };
        debug_assert_eq!(
            (m.device_pages, if l2 { m.host_pages } else { 0 }),
            (dev, host)
        );
        let (dref, href, pairs) = self.pin_prefix(m, need, l2)?;
        let mut lka = LocalKv::default();
        if !(lka.acquire(&mut self.cache, t) && lka.acquire(&mut self.cache, d)) {
            debug_assert!(false, "admission reserved the pages");
            return None;
        }
        let slot = self.slots.allocate()?;
        let mut prefix_pages = Vec::with_capacity((begin_pages + t.div_ceil(ps)) as usize);
        self.cache.device_path_pages(dref.node(), &mut prefix_pages);
        let run = Running {
            dref,
            href,
            prefix_pages,
            lka,
            slot,
            window_begin: begin_pages * ps,
            window_size: t,
            reserve: d,
            table_changed_from: None,
        };
        self.push_prefill_row(key, &run, 0, rows);
        let r = self.req(key);
        r.span.record("cached_tokens", run.window_begin);
        tracing::debug!(parent: &r.span, phase = "prefilling", cached_tokens = run.window_begin);
        let done = run.window_end() == prefill_len;
        self.req_mut(key).state = if done {
            State::PrefillDone(run)
        } else {
            State::Prefilling(run)
        };
        self.push_load_back(pairs, plan, seen);
        Some(t)
    }

    // ----- Prefilling → next chunk -----------------------------------------------------

    fn schedule_next_chunk(&mut self, key: usize, remaining: u32, rows: &mut Rows) -> Option<u32> {
        let ps = self.config.page_size;
        let prefill_len = self.req(key).prefill_len;
        let run = self.req(key).state.running()?;
        let end = run.window_end();
        let t = remaining.min(prefill_len - end);
        // Exact need: free slots left in the tail page count (the reference's
        // `ceil(t / ps)` ignores them and can stall a prompt that fits the pool exactly).
        if !self
            .cache
            .ensure_free(Tier::Device, run.lka.pages_for(t, ps))
        {
            return None;
        }
        let State::Prefilling(mut run) =
            std::mem::replace(&mut self.req_mut(key).state, State::Finished)
        else {
            return None;
        };
        // Entries swapped for the tree's copies since the last row count as new.
        let begin = run
            .table_changed_from
            .take()
            .map_or(run.occupied_len() as u32, |i| {
                i.min(run.occupied_len() as u32)
            });
        if !run.lka.acquire(&mut self.cache, t) {
            debug_assert!(false, "pages were made free");
            self.req_mut(key).state = State::Prefilling(run);
            return None;
        }
        run.window_begin = end;
        run.window_size = t;
        run.reserve = self.config.decode_input_tokens;
        self.push_prefill_row(key, &run, begin, rows);
        let done = run.window_end() == prefill_len;
        self.req_mut(key).state = if done {
            State::PrefillDone(run)
        } else {
            State::Prefilling(run)
        };
        Some(t)
    }

    fn push_prefill_row(&self, key: usize, run: &Running, begin: u32, rows: &mut Rows) {
        let r = self.req(key);
        let (wb, ws) = (run.window_begin as usize, run.window_size as usize);
        let (pages_start, pages_len) = rows.push_page_table(run);
        let input_ids_start = rows.input_ids.len() as u32;
        rows.input_ids.extend_from_slice(&r.tokens[wb..wb + ws]);
        let shifted_end = (wb + 1 + ws).min(r.prefill_len as usize);
        let shifted = &r.tokens[(wb + 1).min(shifted_end)..shifted_end];
        rows.shifted_input_ids.extend_from_slice(shifted);
        rows.shifted_input_ids
            .extend(std::iter::repeat_n(-1, ws - shifted.len()));
        rows.prefill.push(ForwardRow {
            request_id: r.id.clone(),
            kind: RowKind::Prefill,
            slot: run.slot.id(),
            input_length: run.window_size,
            prefill_length: r.prefill_len,
            pages_start,
            pages_len,
            begin,
            size: pages_len - begin,
            extend_prefix_len: run.window_begin,
            input_ids_start,
            decode_input_id: -1,
            hist_token_len: -1,
        });
    }

    // ----- decode ----------------------------------------------------------------------

    fn schedule_decode(&mut self, key: usize, rows: &mut Rows) -> Option<u32> {
        let ps = self.config.page_size;
        let d = self.config.decode_input_tokens;
        let run = self.req(key).state.running()?;
        let extra = run.lka.pages_for(run.reserve, ps);
        if extra > 0 && !self.cache.ensure_free(Tier::Device, extra) {
            return None;
        }
        let (from_prefill_done, mut run) =
            match std::mem::replace(&mut self.req_mut(key).state, State::Finished) {
                State::PrefillDone(run) => (true, run),
                State::Decoding(run) => (false, run),
                _ => return None,
            };
        let begin = run
            .table_changed_from
            .take()
            .map_or(run.occupied_len() as u32, |i| {
                i.min(run.occupied_len() as u32)
            });
        if !run.lka.acquire(&mut self.cache, run.reserve) {
            debug_assert!(false, "pages were made free");
            self.req_mut(key).state = if from_prefill_done {
                State::PrefillDone(run)
            } else {
                State::Decoding(run)
            };
            return None;
        }
        run.reserve = d;
        rows.push_decode_row(self.req(key), &run, RowKind::Decode, begin, d);
        if from_prefill_done {
            tracing::debug!(parent: &self.req(key).span, phase = "decoding");
        }
        self.req_mut(key).state = State::Decoding(run);
        Some(d)
    }

    // ----- retraction and recovery -----------------------------------------------------

    /// Preempts the running request with the most tokens (ties: scheduling order).
    fn retract_one(&mut self, candidates: &[usize], plan: &mut ExecutionPlan, seen: &mut Seen) {
        let mut victim: Option<(usize, usize)> = None;
        for &key in candidates {
            let r = self.req(key);
            if matches!(r.state.kind(), StateKind::Decoding | StateKind::PrefillDone)
                && victim.is_none_or(|(_, len)| r.tokens.len() > len)
            {
                victim = Some((key, r.tokens.len()));
            }
        }
        let Some((key, _)) = victim else {
            self.requeue_for_recompute(candidates);
            return;
        };
        let ps = self.config.page_size;
        let run = match std::mem::replace(&mut self.req_mut(key).state, State::Finished) {
            State::PrefillDone(run) | State::Decoding(run) => run,
            other => {
                self.req_mut(key).state = other;
                return;
            }
        };
        self.stats.retractions += 1;
        tracing::debug!(parent: &self.req(key).span, phase = "retracted");
        let (pages, dref, lka) = self.settle(key, run);
        let tokens = &self.requests[key].tokens[..(pages * ps) as usize];
        let m = self.cache.match_prefix(tokens);
        debug_assert_eq!(
            m.device_pages, pages,
            "the retracted prefix is locked on device"
        );
        let id = self.req(key).id.clone();
        if m.device_pages > m.host_pages {
            let Some(draining) = self.attach_write_back(m.device, m.host) else {
                // The host pool cannot take the prefix: give up on the request, and say so.
                drop((dref, lka));
                self.abort_notice(id, AbortReason::HostPoolExhausted, plan);
                return;
            };
            let own_href = self.cache.lock(m.device, Tier::Host);
            self.cache.unlock(dref);
            let op = self.issue_write_back(draining, id, true, plan, seen);
            self.req_mut(key).state = State::Retracting {
                op,
                href: own_href,
                lka,
                pages,
            };
        } else {
            let own_href = self.cache.lock(m.device, Tier::Host);
            self.cache.unlock(dref);
            self.cache.demote(m.device);
            self.req_mut(key).state = State::Retracted(Retracted {
                href: own_href,
                dref: None,
                lka,
                pages,
            });
        }
    }

    /// Breaks a deadlock the reference scheduler can reach: nothing ran, nothing is
    /// running to retract, and retracted requests hold tail pages that the others need.
    /// The retracted request holding the most tail pages (ties: scheduling order) gives
    /// them back and is requeued to recompute: its whole history becomes its prompt, its
    /// cached prefix is reused, and the last prefill chunk yields its next token.
    fn requeue_for_recompute(&mut self, candidates: &[usize]) {
        let mut victim: Option<(usize, usize)> = None;
        for &key in candidates {
            if let State::Retracted(held) = &self.req(key).state {
                let tail = held.lka.pages.len();
                if tail > 0 && victim.is_none_or(|(_, most)| tail > most) {
                    victim = Some((key, tail));
                }
            }
        }
        let Some((key, _)) = victim else { return };
        let state = std::mem::replace(&mut self.req_mut(key).state, State::Submitted);
        drop(state);
        let r = self.req_mut(key);
        r.prefill_len = r.tokens.len() as u32;
        self.stats.recomputes += 1;
        tracing::debug!(parent: &self.req(key).span, phase = "recomputing");
    }

    /// Resumes a retracted request: reload its prefix onto device, new slot, one decode
    /// row covering its whole page table.
    fn schedule_recovery(
        &mut self,
        key: usize,
        rows: &mut Rows,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) -> Option<u32> {
        if self.slots.available() == 0 {
            return None;
        }
        let ps = self.config.page_size;
        let d = self.config.decode_input_tokens;
        let State::Retracted(held) = &self.req(key).state else {
            return None;
        };
        // Match exactly the published prefix: the retained tail pages continue from it.
        let pages = held.pages;
        let probe = self
            .cache
            .probe(&self.req(key).tokens[..(pages * ps) as usize]);
        let load_back = probe.host_pages.saturating_sub(probe.device_pages);
        // Exact need: the kept tail page may still have room for the reserved slots (the
        // reference's estimate ignores it and can leave a request that fits stuck).
        let need = load_back + held.lka.pages_for(d, ps);
        let tail = held.lka.pages.len() as u32;
        // Its whole footprint: the published prefix (on device already or loaded back),
        // the kept tail pages and the new ones.
        let footprint = probe.device_pages.max(probe.host_pages) + tail + held.lka.pages_for(d, ps);
        if footprint > self.cache.usable(Tier::Device) {
            // Even an empty device pool could not hold it again: give up, and say so.
            let state = std::mem::replace(&mut self.req_mut(key).state, State::Finished);
            drop(state);
            let id = self.req(key).id.clone();
            self.abort_notice(id, AbortReason::ExceedsDevicePool, plan);
            return None;
        }
        if !self
            .cache
            .can_free(Tier::Device, need, probe.device_unlocked_pages)
        {
            return None;
        }
        let m = self
            .cache
            .match_prefix(&self.requests[key].tokens[..(pages * ps) as usize]);
        let (dref, href, pairs) = self.pin_prefix(m, need, true)?;
        let State::Retracted(held) =
            std::mem::replace(&mut self.req_mut(key).state, State::Finished)
        else {
            return None;
        };
        let Retracted {
            href: old_href,
            dref: old_dref,
            mut lka,
            ..
        } = held;
        drop((old_href, old_dref));
        if !lka.acquire(&mut self.cache, d) {
            debug_assert!(false, "pages were made free");
            return None;
        }
        let slot = self.slots.allocate()?;
        let mut prefix_pages = Vec::new();
        self.cache.device_path_pages(dref.node(), &mut prefix_pages);
        let r = self.req(key);
        let run = Running {
            dref,
            href,
            prefix_pages,
            lka,
            slot,
            window_begin: r.prefill_len,
            window_size: 0,
            reserve: d,
            table_changed_from: None,
        };
        rows.push_decode_row(r, &run, RowKind::Recovery, 0, d);
        self.req_mut(key).state = State::Decoding(run);
        self.push_load_back(pairs, plan, seen);
        Some(d)
    }
}
