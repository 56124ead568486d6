//! The transitions that give a request a row: its next chunk, its first chunk (or an L3
//! prefetch instead), its decode.

use kvtier_radix::Admission;
use kvtier_types::{
    ExecutionPlan, LoadBackOp, PrefetchOp, RowKind, StateObject, TransferKind, TransferPair,
};

use crate::SchedulerCore;
use crate::draft::{PlanInProgress, Rows, Seen};
use crate::request::{LocalKv, Prefetch, Running, State};

impl SchedulerCore {
    // ----- Prefilling → next chunk -----------------------------------------------------

    pub(super) fn next_chunk(
        &mut self,
        key: usize,
        tokens: u32,
        pages: kvtier_host::OwnedPages,
        rows: &mut Rows,
    ) {
        let ps = self.config.page_size;
        let allocated_only = self.config.policy.reports_allocated_pages_only();
        let prefill_len = self.requests[key].prefill_len;
        let State::Prefilling(mut run) =
            std::mem::replace(&mut self.requests[key].state, State::Finished)
        else {
            debug_assert!(false, "next chunk of a request not prefilling");
            return;
        };
        let begin = run.take_row_begin(allocated_only);
        run.local_kv.absorb(pages, tokens, ps);
        run.window_begin = run.window_end();
        run.window_size = tokens;
        run.reserve = self.config.decode_input_tokens;
        self.track_checkpoint(&mut run);
        rows.push_prefill_row(&self.requests[key], &run, begin, None, None);
        let done = run.window_end() == prefill_len;
        self.requests[key].state = if done {
            State::PrefillDone(run)
        } else {
            State::Prefilling(run)
        };
    }

    // ----- Submitted → Prefetching ------------------------------------------------------

    /// An L3 prefetch instead of the first chunk: the op names the pages by hashes
    /// derived from the tokens at the current host boundary, so they align whatever the
    /// engine's own hashes were.
    pub(super) fn start_prefetch(
        &mut self,
        key: usize,
        mut fetch: Prefetch,
        plan: &mut ExecutionPlan,
    ) {
        let ps = self.config.page_size;
        let n = fetch.pages.len() as u32;
        let end = ((fetch.start_page + n) * ps) as usize;
        let page_hashes = kvtier_types::hash::rolling_page_hashes(
            None,
            &self.requests[key].tokens[..end],
            ps as usize,
        )
        .split_off(fetch.start_page as usize);
        fetch.op = self.ops.next_id();
        // A hybrid prefix's state is the one after its last page.
        let state = fetch.state.as_ref().and_then(|slot| {
            Some(StateObject {
                slot: slot.id(),
                page_hash: *page_hashes.last()?,
            })
        });
        plan.prefetches.push(PrefetchOp {
            op_id: fetch.op,
            request_id: self.requests[key].id.clone(),
            dst_pages: fetch.pages.ids().to_vec(),
            page_hashes,
            state,
        });
        self.requests[key].enter_phase("prefetching");
        self.requests[key].state = State::Prefetching(fetch);
    }

    // ----- Submitted → first chunk -----------------------------------------------------

    pub(super) fn first_chunk(
        &mut self,
        key: usize,
        admission: Admission,
        draft: &mut PlanInProgress,
    ) {
        let ps = self.config.page_size;
        let Some(slot) = self.slots.allocate() else {
            debug_assert!(false, "the program counted a free slot");
            return;
        };
        let prefill_len = self.requests[key].prefill_len;
        // A hybrid grant: the request's slots, the cached state its row copies from and
        // where its next checkpoint branches off.
        let (mut cow_src, mut branching) = (None, None);
        let family = admission.family.map_states(|grant| {
            (cow_src, branching) = (grant.cow_src, grant.branching);
            grant.states
        });
        let mut run = Running {
            device_lock: admission.device_lock,
            host_lock: admission.host_lock,
            prefix_pages: admission.prefix_pages,
            local_kv: LocalKv {
                pages: admission.pages,
                tail_free: admission.tail_free,
            },
            slot,
            window_begin: admission.begin_pages * ps,
            window_size: admission.tokens,
            reserve: self.config.decode_input_tokens,
            table_changed_from: None,
            published_ahead: 0,
            family,
            decode_state: None,
        };
        self.track_checkpoint(&mut run);
        if let Some(slot) = cow_src {
            self.ops.record_copy(self.requests[key].id.clone(), slot);
        }
        draft
            .rows
            .push_prefill_row(&self.requests[key], &run, 0, cow_src, branching);
        draft.rows.set_groups(true, admission.groups);
        self.count_hits(
            key,
            run.window_begin,
            &admission.load_back,
            [admission.capped_pages, admission.dropped_pages],
        );
        self.requests[key].enter_phase("prefilling");
        let done = run.window_end() == prefill_len;
        self.requests[key].state = if done {
            State::PrefillDone(run)
        } else {
            State::Prefilling(run)
        };
        self.push_load_back(key, admission.load_back, &mut draft.plan, &mut draft.seen);
    }

    pub(super) fn push_load_back(
        &mut self,
        key: usize,
        pairs: Vec<TransferPair>,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) {
        if pairs.is_empty() {
            return;
        }
        let span = crate::ops::copy_span(&self.requests[key].span, "load_back", pairs.len());
        let pairs = seen.new_load_back_pairs(pairs);
        let dsts = |kind: TransferKind| {
            pairs
                .iter()
                .filter(|pair| pair.kind == kind)
                .map(|pair| pair.dst)
                .collect()
        };
        let op_id =
            self.ops
                .issue_load_back(dsts(TransferKind::Kv), dsts(TransferKind::Mamba), span);
        plan.load_backs.push(LoadBackOp { op_id, pairs });
    }

    // ----- decode ----------------------------------------------------------------------

    #[inline]
    pub(super) fn decode(
        &mut self,
        key: usize,
        reserve: u32,
        pages: kvtier_host::OwnedPages,
        rows: &mut Rows,
    ) {
        let ps = self.config.page_size;
        let allocated_only = self.config.policy.reports_allocated_pages_only();
        let d = self.config.decode_input_tokens;
        // The row's new length: a state there is copied to the checkpoint.
        let new_len = self.requests[key].tokens.len() as u32;
        // In place: a decoding request's state is large and decodes are the hot path.
        let state = &mut self.requests[key].state;
        let from_prefill_done = matches!(state, State::PrefillDone(_));
        let Some(run) = state.running_mut() else {
            debug_assert!(false, "decode of a request not running");
            return;
        };
        let begin = run.take_row_begin(allocated_only);
        run.local_kv.absorb(pages, reserve, ps);
        run.reserve = d;
        if let Some(states) = run.family.states_mut() {
            states.row_ends_at(new_len, ps);
        }
        let r = &self.requests[key];
        if let Some(run) = r.state.running() {
            rows.push_decode_row(r, run, RowKind::Decode, begin, d, None);
        }
        if from_prefill_done {
            self.requests[key].enter_phase("decoding");
            let state = &mut self.requests[key].state;
            if let State::PrefillDone(run) = std::mem::replace(state, State::Finished) {
                *state = State::Decoding(run);
            }
        }
    }
}
