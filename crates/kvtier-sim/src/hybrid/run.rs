//! The step loop of a hybrid run: its conversations and turns, the abort rule, the engine
//! rules (§2).

use std::collections::{BTreeMap, BTreeSet};

use kvtier::LocalSystem;
use kvtier_types::{
    EngineEvent, ExecutionPlan, RequestId, RequestSpec, RowKind, Token, engine_rule,
};

use super::digests::{canonical, split};
use super::*;
use crate::engine::{measured_advance, measured_next_plan, measured_submit};
use crate::tokens::{gen_tokens, tag};
use crate::workloads::WorkloadError;

/// One conversation of the workload.
#[derive(Debug)]
pub(super) struct Conversation {
    pub(super) history: Vec<Token>,
    pub(super) next_turn: usize,
    pub(super) ready: u64,
    pub(super) live: Option<RequestId>,
}

/// A live turn.
#[derive(Debug)]
pub(super) struct Turn {
    pub(super) conversation: usize,
    pub(super) user: Vec<Token>,
    pub(super) stream: Vec<Token>,
    pub(super) produced: usize,
}

/// The workload state between steps.
#[derive(Debug)]
pub(super) struct Run {
    pub(super) shape: Shape,
    pub(super) system: LocalSystem,
    pub(super) conversations: Vec<Conversation>,
    pub(super) turns: BTreeMap<RequestId, Turn>,
    /// Requests that had a prefill row (their next prefill row is a later chunk).
    pub(super) started: BTreeSet<RequestId>,
    /// Aborts the plan announced, seen by the engine one step later (§1.1).
    pub(super) aborts_seen_next_step: Vec<RequestId>,
    pub(super) counters: HybridCounters,
    pub(super) digests: Digests,
    /// Per paged group, by id.
    pub(super) groups: BTreeMap<String, GroupCounters>,
    pub(super) plans: Option<Vec<String>>,
    pub(super) page_size: u64,
    pub(super) measured_ns: u64,
}

impl Run {
    pub(super) fn submit_ready(&mut self, step: u64) -> Result<(), WorkloadError> {
        let s = self.shape;
        let mut batch = Vec::new();
        for (c, conv) in self.conversations.iter_mut().enumerate() {
            if conv.live.is_some() || conv.next_turn >= s.turns || conv.ready > step {
                continue;
            }
            let t = conv.next_turn;
            let i = (c * s.turns + t) as u64;
            let user = gen_tokens(tag(s.w, 2, i), s.user_len);
            let stream = gen_tokens(tag(s.w, 3, i), s.gen_len);
            let id = RequestId::from(format!("c{c:03}t{}", t + 1));
            let mut prompt = conv.history.clone();
            prompt.extend_from_slice(&user);
            self.counters.prompt_tokens += prompt.len() as u64;
            batch.push(RequestSpec::new(id.clone(), prompt));
            conv.live = Some(id.clone());
            self.turns.insert(
                id,
                Turn {
                    conversation: c,
                    user,
                    stream,
                    produced: 0,
                },
            );
        }
        if !batch.is_empty() {
            let t0 = std::time::Instant::now();
            // The hybrid workloads run without L3: no lookup to settle.
            measured_submit(&mut self.system, batch, false)?;
            self.measured_ns += t0.elapsed().as_nanos() as u64;
        }
        Ok(())
    }

    /// Builds and answers one plan; returns whether it held anything for the engine,
    /// and the requests that finished.
    pub(super) fn plan_and_answer(&mut self) -> Result<(bool, Vec<RequestId>), WorkloadError> {
        let t0 = std::time::Instant::now();
        let plan = measured_next_plan(&mut self.system)?;
        self.measured_ns += t0.elapsed().as_nanos() as u64;
        let line = self.digests.plan(&plan);
        if self.plans.is_some() {
            // Free device pages right after the plan, as the reference reports them.
            let free = self.device_free()?;
            if let Some(plans) = &mut self.plans {
                plans.push(format!("{line}, \"free\": {free}"));
            }
        }
        self.count(&plan);
        self.aborts_seen_next_step
            .extend(plan.aborted.iter().map(|n| n.request_id.clone()));
        let has_work = !plan.forward.rows.is_empty() || !plan.write_backs.is_empty();
        let mut finished = Vec::new();
        if has_work {
            let events = self.answer(&plan, &mut finished)?;
            let t0 = std::time::Instant::now();
            measured_advance(&mut self.system, events)?;
            self.measured_ns += t0.elapsed().as_nanos() as u64;
        }
        Ok((has_work, finished))
    }

    pub(super) fn count(&mut self, plan: &ExecutionPlan) {
        let c = &mut self.counters;
        let has_prefill = plan.forward.num_prefill_rows > 0;
        for op in &plan.write_backs {
            let s = split(&op.pairs);
            c.writeback_ops += 1;
            c.writeback_kv_pages += s[0].len() as u64;
            c.writeback_mamba += s[2].len() as u64;
            if op.is_retract {
                c.retract_writeback_ops += 1;
                c.retract_writeback_kv_pages += s[0].len() as u64;
                c.retract_writeback_mamba += s[2].len() as u64;
            }
        }
        for op in &plan.load_backs {
            let s = split(&op.pairs);
            c.loadback_ops += 1;
            c.loadback_kv_pages += s[0].len() as u64;
            c.loadback_mamba += s[2].len() as u64;
            if has_prefill {
                c.host_hit_tokens += self.page_size * s[0].len() as u64;
            }
        }
        for (index, row) in plan.forward.rows.iter().enumerate() {
            for ((_, g), t) in self.groups.iter_mut().zip(plan.forward.groups_of(index)) {
                let n = t.pages.len() as u64;
                g.row_pages += n;
                g.max_row_pages = g.max_row_pages.max(n);
                g.max_base_offset = g.max_base_offset.max(u64::from(t.base));
            }
            match row.kind {
                RowKind::Prefill => {
                    c.prefill_rows += 1;
                    c.prefill_tokens += u64::from(row.input_length);
                    if self.started.insert(row.request_id.clone()) {
                        c.first_chunks += 1;
                        c.hit_tokens += u64::from(row.extend_prefix_len);
                    } else {
                        c.later_chunks += 1;
                    }
                }
                RowKind::Decode | RowKind::Recovery => {
                    c.decode_rows += 1;
                    c.decode_tokens += u64::from(row.input_length);
                    if row.hist_token_len != -1 {
                        c.retract_recover_rows += 1;
                    }
                }
            }
        }
        c.device_hit_tokens = c.hit_tokens - c.host_hit_tokens.min(c.hit_tokens);
    }

    pub(super) fn answer(
        &mut self,
        plan: &ExecutionPlan,
        finished: &mut Vec<RequestId>,
    ) -> Result<Vec<EngineEvent>, WorkloadError> {
        let mut events: Vec<EngineEvent> = canonical(&plan.write_backs)
            .into_iter()
            .map(|(op, _)| EngineEvent::WriteBackDone {
                op_id: op.op_id,
                success: true,
            })
            .collect();
        for row in &plan.forward.rows {
            if !engine_rule::yields_token(row) {
                continue;
            }
            let Some(turn) = self.turns.get_mut(&row.request_id) else {
                return Err(WorkloadError::UnknownRow(row.request_id.clone()));
            };
            let token = turn.stream[turn.produced];
            turn.produced += 1;
            let (generated, max_new) = (turn.produced, turn.stream.len());
            if engine_rule::push_token(&mut events, &row.request_id, token, generated, max_new) {
                finished.push(row.request_id.clone());
            }
        }
        Ok(events)
    }

    /// A turn ends (finished or dropped): the conversation's next turn is ready at
    /// `ready`.
    pub(super) fn end_turn(&mut self, id: &RequestId, answered: bool, ready: u64) {
        let Some(turn) = self.turns.remove(id) else {
            return;
        };
        self.started.remove(id);
        let conv = &mut self.conversations[turn.conversation];
        if answered {
            conv.history.extend_from_slice(&turn.user);
            conv.history.extend_from_slice(&turn.stream);
            self.counters.finished += 1;
        } else {
            self.counters.aborted += 1;
        }
        conv.live = None;
        conv.next_turn += 1;
        conv.ready = ready;
    }

    pub(super) fn device_free(&mut self) -> Result<u64, WorkloadError> {
        Ok(u64::from(
            self.system.stats()?.scheduler.available_device_pages,
        ))
    }
}
