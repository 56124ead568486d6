//! Property tests of the scheduler core: random submit / plan / advance / abort
//! sequences over small pools (so pressure, eviction, write-back, load-back and
//! retraction all happen), checking after every operation:
//!
//! * `check_invariants()` — exact page conservation on both tiers (every usable page is
//!   free, in one tree node, or held by one request), tree structure, lock counts, LRU;
//! * the plan is well formed (batch and token limits, prefill-first rounds, one row per
//!   request, slots, page tables equal to the request's occupied pages and large enough,
//!   prompt chunks contiguous and carrying the right input ids, op ids fresh, transfer
//!   pages in range);
//! * the scheduler agrees with a model of the engine (every request the engine still
//!   waits for is known and in a live state; token counts match what was delivered);
//! * a refused event changes nothing observable;
//! * at the end, after driving the system to quiescence, every page is free or cached,
//!   and `clear_cache()` frees them all (no leaked page, lock or in-flight op).
//!
//! The simulated engine answers each plan like `kvtier-sim`'s: a last prefill chunk and
//! every decode or recovery row get one generated token, then `Finish` once the
//! request's random output length is reached. It may also defer a plan's answer to the
//! next step (overlap scheduling), acknowledge write-backs late or as failed, and send
//! `UpdateReserve`.

use std::collections::{BTreeMap, BTreeSet};

use kvtier_fsm::{BatchError, SchedError, Scheduler, SchedulerStats, StateKind};
use kvtier_types::{
    EngineEvent, ExecutionPlan, GroupRole, GroupSpec, MambaSettings, OpId, PageId, PagedSettings,
    RequestId, RequestSpec, RowKind, SchedulerConfig, Tier, Token,
};
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};

// ----- generated inputs ------------------------------------------------------------------

/// One request to submit.
#[derive(Debug, Clone)]
struct ReqGen {
    /// Which shared base prefix (of 3) the prompt starts with.
    base: usize,
    /// How many tokens of that base it takes.
    prefix: usize,
    /// Tokens after the base prefix.
    suffix: Vec<Token>,
    /// Generated tokens before the engine sends `Finish` (at least 1).
    max_new: u32,
    /// Reuse the id of a request the scheduler still knows (must be refused).
    duplicate: bool,
}

/// How the engine answers one plan.
#[derive(Debug, Clone)]
struct StepGen {
    /// Bit `i % 16` set: acknowledge the `i`-th pending write-back now.
    ack_mask: u16,
    /// Bit `i % 16` set: that acknowledgement reports failure.
    fail_mask: u16,
    /// Hold this plan's forward answer until after the next plan (overlap scheduling).
    defer: bool,
    /// Acknowledgements before the forward results (else after).
    acks_first: bool,
    /// `UpdateReserve` sent after each decode row's result.
    reserve: Option<u32>,
    /// Generated token seed.
    token: Token,
}

/// A deliberately refused event.
#[derive(Debug, Clone, Copy)]
enum Invalid {
    /// An event the target request's current state must refuse.
    ForState(usize, u8),
    /// An event for an id that was never submitted.
    UnknownId(u8),
    /// A write-back acknowledgement for an op id never issued.
    UnknownOp(u32),
    /// A result carrying a negative token.
    NegativeToken(usize),
}

#[derive(Debug, Clone)]
enum Op {
    Submit(Vec<ReqGen>),
    Step(StepGen),
    /// Abort the `n`-th id ever submitted (modulo), whatever its state or existence.
    Abort(usize),
    /// `UpdateReserve` for the `n`-th id ever submitted (modulo).
    UpdateReserve(usize, u32),
    Invalid(Invalid),
}

#[derive(Debug, Clone)]
struct Case {
    config: SchedulerConfig,
    bases: [Vec<Token>; 3],
    ops: Vec<Op>,
}

fn config_strategy() -> impl Strategy<Value = SchedulerConfig> {
    let pools = (
        prop::sample::select(vec![1u32, 2, 4]),
        8u32..48,
        // Host pool: none (L2 off), or a pool with L2 off (retraction only), or L2 on.
        prop_oneof![
            2 => Just((0u32, true)),
            1 => (8u32..64).prop_map(|h| (h, true)),
            4 => (8u32..64).prop_map(|h| (h, false)),
        ],
    );
    let policy = (
        1u32..=6,
        4u32..=64,
        0u32..=2,
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
    );
    // A hybrid model in one case of four, a paged model in one of four: few state
    // slots or group pages (pressure on the family as on the pools), host copies when the
    // host tier is on, chunks of 1 to 4 pages.
    let family = prop_oneof![
        2 => Just(Family::Dense),
        1 => (2u32..12, 0u32..8, 1u32..=4).prop_map(|h| Family::Mamba(h.0, h.1, h.2)),
        1 => (
            0u32..=2,
            prop::option::of((any::<bool>(), 1u32..=3, any::<bool>())),
            6u32..40,
        )
            .prop_map(|(h, s, pages)| Family::Paged(h, s, pages)),
    ];
    (pools, policy, family).prop_map(
        |(
            (page_size, device_pages, (host_pages, disable_l2_cache)),
            (max_batch_size, max_scheduled_tokens, decode_input_tokens, mixed, publish, no_prefix),
            family,
        )| {
            let hybrid = match family {
                Family::Mamba(device, host, chunk) => Some((device, host, chunk)),
                _ => None,
            };
            let l2 = host_pages > 0 && !disable_l2_cache;
            SchedulerConfig {
                page_size,
                device_pages,
                host_pages,
                max_scheduled_tokens,
                max_batch_size,
                decode_input_tokens,
                disable_l2_cache,
                enable_mixed_prefill_decode: mixed,
                publish_prefix_mid_flight: publish,
                disable_prefix_cache: no_prefix,
                mamba: hybrid.map(|(device_slots, host_slots, chunk_pages)| MambaSettings {
                    device_slots,
                    host_slots: if l2 { host_slots } else { 0 },
                    chunk: chunk_pages * page_size,
                }),
                paged: match family {
                    Family::Paged(history, state, pages) => {
                        Some(paged_settings(page_size, history, state, pages))
                    }
                    _ => None,
                },
                ..SchedulerConfig::default()
            }
        },
    )
}

/// The model family of a generated config.
#[derive(Debug, Clone, Copy)]
enum Family {
    Dense,
    /// Device state slots, host state slots, checkpoint chunk in pages.
    Mamba(u32, u32, u32),
    /// History pages of 1 or 2 KV pages (0: a sliding history group of 3 pages'
    /// window); a sliding state group (of 1 token or a KV
    /// page a page, a window of 1 to 3 of its pages, required or transport-only); pool
    /// pages of each group.
    Paged(u32, Option<(bool, u32, bool)>, u32),
}

/// Paged groups whose alignment is a multiple of the page size: a required
/// full-history group of `history` KV pages a group page, and maybe a sliding state
/// group.
fn paged_settings(
    page_size: u32,
    history: u32,
    state: Option<(bool, u32, bool)>,
    pages: u32,
) -> PagedSettings {
    // History 0: a window model, whose history group slides (its prefixes come back
    // from host with their windows computed again).
    let h = match history {
        0 => GroupSpec::sliding("h", page_size, 1, pages, 3 * page_size, GroupRole::History),
        n => GroupSpec::full_history("h", n * page_size, 1, pages),
    };
    let mut groups = vec![h];
    let mut required = vec!["h".to_owned()];
    if let Some((token_rows, windows, req)) = state {
        let rows = if token_rows { 1 } else { page_size };
        groups.push(GroupSpec::sliding(
            "s",
            rows,
            1,
            pages * 2,
            rows * windows,
            GroupRole::State,
        ));
        if req {
            required.push("s".into());
        }
    }
    PagedSettings { groups, required }
}

fn req_strategy() -> impl Strategy<Value = ReqGen> {
    (
        0usize..3,
        0usize..=16,
        prop::collection::vec(0i32..4, 0..6),
        1u32..6,
        prop::bool::weighted(0.05),
    )
        .prop_map(|(base, prefix, suffix, max_new, duplicate)| ReqGen {
            base,
            prefix,
            suffix,
            max_new,
            duplicate,
        })
}

fn step_strategy() -> impl Strategy<Value = StepGen> {
    (
        prop_oneof![3 => Just(u16::MAX), 1 => any::<u16>()],
        prop_oneof![5 => Just(0u16), 1 => any::<u16>()],
        prop::bool::weighted(0.25),
        any::<bool>(),
        prop_oneof![4 => Just(None), 1 => (0u32..3).prop_map(Some)],
        0i32..4,
    )
        .prop_map(
            |(ack_mask, fail_mask, defer, acks_first, reserve, token)| StepGen {
                ack_mask,
                fail_mask,
                defer,
                acks_first,
                reserve,
                token,
            },
        )
}

fn invalid_strategy() -> impl Strategy<Value = Invalid> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, k)| Invalid::ForState(i, k)),
        1 => any::<u8>().prop_map(Invalid::UnknownId),
        1 => prop_oneof![Just(0u32), Just(u32::MAX), (1u32 << 20)..u32::MAX].prop_map(Invalid::UnknownOp),
        1 => any::<usize>().prop_map(Invalid::NegativeToken),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec(req_strategy(), 1..4).prop_map(Op::Submit),
        8 => step_strategy().prop_map(Op::Step),
        1 => any::<usize>().prop_map(Op::Abort),
        1 => (any::<usize>(), 0u32..3).prop_map(|(i, n)| Op::UpdateReserve(i, n)),
        1 => invalid_strategy().prop_map(Op::Invalid),
    ]
}

fn case_strategy(max_ops: usize) -> impl Strategy<Value = Case> {
    (
        config_strategy(),
        [
            prop::collection::vec(0i32..4, 4..16),
            prop::collection::vec(0i32..4, 4..16),
            prop::collection::vec(0i32..4, 4..16),
        ],
        prop::collection::vec(op_strategy(), 1..max_ops),
    )
        .prop_map(|(config, bases, ops)| Case { config, bases, ops })
}

/// Whether a transfer pair from `from` to the other tier names real pages (page 0 is
/// the pools' dummy) or, for a state pair, real state slots (state pools have none).
fn in_range(cfg: &SchedulerConfig, p: &kvtier_types::TransferPair, from: Tier) -> bool {
    let (device, host, first) = match p.kind {
        kvtier_types::TransferKind::Kv => (cfg.device_pages, cfg.host_pages, 1),
        kvtier_types::TransferKind::Mamba => {
            let m = cfg.mamba.unwrap_or_default();
            (m.device_slots, m.host_slots, 0)
        }
    };
    let (src_end, dst_end) = match from {
        Tier::Device => (device, host),
        Tier::Host => (host, device),
    };
    (first..src_end).contains(&p.src) && (first..dst_end).contains(&p.dst)
}

// ----- the harness: scheduler + engine model ---------------------------------------------

/// What the engine knows of a request it still waits for.
#[derive(Debug)]
struct Live {
    prompt: Vec<Token>,
    max_new: u32,
    /// Tokens generated by the engine (sent or deferred).
    produced: u32,
    /// Tokens whose `ExtendResult` reached the scheduler.
    delivered: usize,
    /// Their values, in order (a recompute makes them part of the prompt).
    delivered_tokens: Vec<Token>,
    /// End of the last scheduled prompt chunk (`None` before the first chunk).
    prefill_end: Option<u32>,
    /// Decode and recovery rows seen.
    decode_rows: u32,
    /// `Finish` generated (sent or deferred): no more answers for this request.
    finishing: bool,
    /// No reserve below `decode_input_tokens` was ever sent for it, so its page table
    /// must cover every decode step.
    reserve_intact: bool,
}

struct Harness {
    s: Scheduler,
    cfg: SchedulerConfig,
    live: BTreeMap<RequestId, Live>,
    /// Every id ever submitted successfully, in order (targets of random aborts).
    ever: Vec<RequestId>,
    next_id: u32,
    /// Write-back ops issued and not yet acknowledged.
    pending: Vec<OpId>,
    /// Highest op id seen in any plan (op ids must be fresh).
    max_op: OpId,
    /// Forward answer of the previous plan, held back (overlap scheduling).
    deferred: Vec<EngineEvent>,
    /// Plans built.
    plans: u32,
    /// Print every plan and event batch (set `KVTIER_PROPTEST_TRACE=1` to debug a
    /// regression case).
    trace: bool,
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

impl Harness {
    fn new(cfg: SchedulerConfig) -> Result<Self, TestCaseError> {
        let s = Scheduler::new(cfg.clone()).map_err(|e| fail(format!("config refused: {e}")))?;
        Ok(Self {
            s,
            cfg,
            live: BTreeMap::new(),
            ever: Vec::new(),
            next_id: 0,
            pending: Vec::new(),
            max_op: 0,
            deferred: Vec::new(),
            plans: 0,
            trace: std::env::var_os("KVTIER_PROPTEST_TRACE").is_some(),
        })
    }

    fn ps(&self) -> u32 {
        self.cfg.page_size
    }

    // ----- checks run after every operation -----

    fn check(&mut self, after: &str) -> Result<(), TestCaseError> {
        if let Err(e) = self.s.check_invariants() {
            return Err(fail(format!("check_invariants after {after}: {e}")));
        }
        for (id, l) in &self.live {
            let state = self.s.request_state(id);
            // A request the engine still waits for must not have vanished or finished
            // behind its back (the scheduler announces its own aborts in the plan).
            let ok = if l.finishing {
                state.is_some()
            } else {
                matches!(
                    state,
                    Some(
                        StateKind::Submitted
                            | StateKind::Prefilling
                            | StateKind::PrefillDone
                            | StateKind::Decoding
                            | StateKind::Retracting
                            | StateKind::Retracted
                    )
                )
            };
            prop_assert!(ok, "after {after}: live request {id} is in state {state:?}");
            let tokens = self.s.request_tokens(id);
            prop_assert_eq!(
                tokens,
                Some(l.prompt.len() + l.delivered),
                "after {}: token count of {}",
                after,
                id
            );
        }
        let stats = self.s.stats();
        let usable = [self.cfg.usable_device_pages(), self.cfg.usable_host_pages()];
        prop_assert!(
            u64::from(stats.available_device_pages) + stats.cached_device_pages
                <= u64::from(usable[0])
                && u64::from(stats.available_host_pages) + stats.cached_host_pages
                    <= u64::from(usable[1]),
            "after {}: more pages than the pools hold: {:?}",
            after,
            stats
        );
        Ok(())
    }

    // ----- submit -----

    fn prompt(bases: &[Vec<Token>; 3], g: &ReqGen) -> Vec<Token> {
        let base = &bases[g.base];
        let mut p: Vec<Token> = base[..g.prefix.min(base.len())].to_vec();
        p.extend_from_slice(&g.suffix);
        p
    }

    fn submit(&mut self, bases: &[Vec<Token>; 3], gens: &[ReqGen]) -> Result<(), TestCaseError> {
        let known = self.s.request_ids();
        let ps = u64::from(self.ps());
        let usable = u64::from(self.cfg.usable_device_pages());
        let d = u64::from(self.cfg.decode_input_tokens);
        let mut specs = Vec::new();
        let mut expect_refused = BTreeMap::new();
        let mut accepted = Vec::new();
        for (i, g) in gens.iter().enumerate() {
            let prompt = Self::prompt(bases, g);
            let (id, dup) = match (g.duplicate, known.get(i % known.len().max(1))) {
                (true, Some(existing)) => (existing.clone(), true),
                _ => {
                    self.next_id += 1;
                    (RequestId::new(format!("r{}", self.next_id)), false)
                }
            };
            let expected = if dup {
                Some("DuplicateRequest")
            } else if prompt.is_empty() {
                Some("EmptyPrompt")
            } else if (prompt.len() as u64 + d).div_ceil(ps) > usable {
                Some("PromptTooLong")
            } else if self.cfg.paged.as_ref().is_some_and(|p| {
                let tokens = prompt.len() as u32 + d as u32;
                p.short_group(tokens, self.cfg.max_scheduled_tokens)
                    .is_some()
            }) {
                Some("PromptTooLongForGroup")
            } else {
                None
            };
            match expected {
                Some(kind) => {
                    expect_refused.insert(i, kind);
                }
                None => accepted.push((id.clone(), prompt.clone(), g.max_new)),
            }
            specs.push(RequestSpec::new(id, prompt));
        }
        let refused: BTreeMap<usize, SchedError> = match self.s.submit(specs) {
            Ok(()) => BTreeMap::new(),
            Err(BatchError { rejected }) => {
                rejected.into_iter().map(|r| (r.index, r.error)).collect()
            }
        };
        prop_assert_eq!(
            refused.keys().collect::<Vec<_>>(),
            expect_refused.keys().collect::<Vec<_>>(),
            "refused submissions: {:?}",
            refused
        );
        for (i, err) in &refused {
            let kind = expect_refused[i];
            let ok = matches!(
                (kind, err),
                ("DuplicateRequest", SchedError::DuplicateRequest(_))
                    | ("EmptyPrompt", SchedError::EmptyPrompt(_))
                    | ("PromptTooLong", SchedError::PromptTooLong { .. })
                    | (
                        "PromptTooLongForGroup",
                        SchedError::PromptTooLongForGroup { .. }
                    )
            );
            prop_assert!(ok, "submission {i}: expected {kind}, got {err:?}");
        }
        for (id, prompt, max_new) in accepted {
            self.ever.push(id.clone());
            self.live.insert(
                id,
                Live {
                    prompt,
                    max_new,
                    produced: 0,
                    delivered: 0,
                    delivered_tokens: Vec::new(),
                    prefill_end: None,
                    decode_rows: 0,
                    finishing: false,
                    reserve_intact: true,
                },
            );
        }
        Ok(())
    }

    // ----- plan checks -----

    fn check_plan(&mut self, plan: &ExecutionPlan) -> Result<(), TestCaseError> {
        let cfg = self.cfg.clone();
        let ps = cfg.page_size;
        let d = cfg.decode_input_tokens;
        let fwd = &plan.forward;
        let rows = &fwd.rows;
        prop_assert!(
            rows.len() <= cfg.max_batch_size as usize,
            "{} rows > max_batch_size",
            rows.len()
        );
        let n_prefill = rows.iter().filter(|r| r.kind == RowKind::Prefill).count();
        prop_assert_eq!(fwd.num_prefill_rows, n_prefill, "num_prefill_rows");
        prop_assert!(
            rows[..n_prefill].iter().all(|r| r.kind == RowKind::Prefill),
            "prefill rows not first"
        );
        if !cfg.enable_mixed_prefill_decode {
            prop_assert!(
                n_prefill == 0 || n_prefill == rows.len(),
                "prefill-first policy: a round mixes prefill and decode rows"
            );
        }
        // A hybrid model's rows each own a working slot (and a checkpoint slot) no other
        // row names; a full-attention model's rows carry no state.
        let mut own_slots = BTreeSet::new();
        for r in rows {
            if cfg.mamba.is_none() {
                prop_assert!(r.mamba.is_empty(), "state slots on a dense row: {:?}", r);
                continue;
            }
            let working = r.mamba.working;
            prop_assert!(
                working.is_some(),
                "a hybrid row without a working slot: {:?}",
                r
            );
            for slot in [working, r.mamba.checkpoint_dst].into_iter().flatten() {
                prop_assert!(own_slots.insert(slot), "state slot {} named twice", slot);
            }
        }
        for r in rows {
            if let Some(src) = r.mamba.cow_src {
                prop_assert!(
                    !own_slots.contains(&src),
                    "row {} copies from slot {src}, a request's own slot",
                    r.request_id
                );
            }
        }
        let prefill_tokens: u64 = rows[..n_prefill]
            .iter()
            .map(|r| u64::from(r.input_length))
            .sum();
        let all_tokens: u64 = rows.iter().map(|r| u64::from(r.input_length)).sum();
        prop_assert!(
            prefill_tokens <= u64::from(cfg.max_scheduled_tokens),
            "prefill tokens {} > budget {}",
            prefill_tokens,
            cfg.max_scheduled_tokens
        );
        prop_assert!(
            all_tokens <= u64::from(cfg.max_scheduled_tokens) + u64::from(d.saturating_sub(1)),
            "row tokens {} exceed budget {} (+{} for the last decode row)",
            all_tokens,
            cfg.max_scheduled_tokens,
            d.saturating_sub(1)
        );
        let mut ids = BTreeSet::new();
        let mut slots = BTreeSet::new();
        for row in rows {
            let id = &row.request_id;
            prop_assert!(ids.insert(id.clone()), "request {id} has two rows");
            prop_assert!(
                row.slot >= 1 && row.slot <= cfg.max_batch_size && slots.insert(row.slot),
                "row of {} has slot {} (duplicate or out of 1..={})",
                id,
                row.slot,
                cfg.max_batch_size
            );
            let table = fwd.page_table_of(row).to_vec();
            let distinct: BTreeSet<PageId> = table.iter().copied().collect();
            prop_assert_eq!(distinct.len(), table.len(), "row of {} repeats a page", id);
            prop_assert!(
                table.iter().all(|&p| p >= 1 && p < cfg.device_pages),
                "row of {id}: device page out of range in {table:?}"
            );
            prop_assert_eq!(
                self.s.occupied_pages(id),
                Some(table.clone()),
                "row of {} : page table differs from the request's occupied pages",
                id
            );
            prop_assert!(
                row.begin + row.size == row.pages_len,
                "row of {}: begin {} + size {} != pages {}",
                id,
                row.begin,
                row.size,
                row.pages_len
            );
            let Some(l) = self.live.get_mut(id) else {
                return Err(fail(format!(
                    "row for {id}, which the engine no longer waits for (finished/aborted)"
                )));
            };
            let recompute = row.kind == RowKind::Prefill
                && l.prefill_end == Some(l.prompt.len() as u32)
                && row.prefill_length as usize == l.prompt.len() + l.delivered;
            if recompute {
                // Deadlock breaker: a retracted request recomputes its whole history.
                let history = std::mem::take(&mut l.delivered_tokens);
                l.prompt.extend(history);
                l.delivered = 0;
                l.prefill_end = None;
                l.decode_rows = 0;
            }
            let plen = l.prompt.len() as u32;
            let capacity = u64::from(row.pages_len) * u64::from(ps);
            match row.kind {
                RowKind::Prefill => {
                    let ext = row.extend_prefix_len;
                    let end = ext + row.input_length;
                    prop_assert_eq!(row.prefill_length, plen, "prefill_length of {}", id);
                    prop_assert!(
                        row.input_length >= 1 && end <= plen,
                        "chunk {}..{} of {}'s {}-token prompt",
                        ext,
                        end,
                        id,
                        plen
                    );
                    match l.prefill_end {
                        Some(prev) => prop_assert_eq!(ext, prev, "chunk of {} not contiguous", id),
                        None => {
                            prop_assert!(
                                ext % ps == 0 && ext <= (plen - 1) / ps * ps,
                                "first chunk of {} starts at {} (ps {}, prompt {})",
                                id,
                                ext,
                                ps,
                                plen
                            );
                            if cfg.disable_prefix_cache {
                                prop_assert_eq!(ext, 0, "prefix hit with the prefix cache off");
                            }
                        }
                    }
                    l.prefill_end = Some(end);
                    let want = &l.prompt[ext as usize..end as usize];
                    prop_assert_eq!(fwd.input_ids_of(row), want, "input ids of {}", id);
                    let mut shifted: Vec<Token> = l.prompt[(ext as usize + 1).min(end as usize)..]
                        .iter()
                        .copied()
                        .take(row.input_length as usize)
                        .collect();
                    shifted.resize(row.input_length as usize, -1);
                    prop_assert_eq!(
                        fwd.shifted_input_ids_of(row),
                        &shifted[..],
                        "shifted ids of {}",
                        id
                    );
                    prop_assert!(
                        capacity >= u64::from(end) + u64::from(d),
                        "prefill row of {}: {} pages hold {} tokens < chunk end {} + reserve {}",
                        id,
                        row.pages_len,
                        capacity,
                        end,
                        d
                    );
                }
                RowKind::Decode | RowKind::Recovery => {
                    prop_assert_eq!(
                        l.prefill_end,
                        Some(plen),
                        "decode row of {} before its prompt was scheduled",
                        id
                    );
                    prop_assert_eq!(row.input_length, d, "decode input_length of {}", id);
                    l.decode_rows += 1;
                    if d >= 1 && l.reserve_intact {
                        let need = u64::from(plen) + u64::from(l.decode_rows) - 1 + u64::from(d);
                        prop_assert!(
                            capacity >= need,
                            "decode step {} of {}: {} pages hold {} tokens < {}",
                            l.decode_rows,
                            id,
                            row.pages_len,
                            capacity,
                            need
                        );
                    }
                    if row.kind == RowKind::Recovery {
                        let tokens = l.prompt.len() + l.delivered;
                        prop_assert_eq!(row.prefill_length, 0, "recovery prefill_length");
                        prop_assert_eq!(row.begin, 0, "recovery begin");
                        prop_assert_eq!(row.hist_token_len, tokens as i32 - 1, "hist_token_len");
                    } else {
                        prop_assert_eq!(row.prefill_length, plen, "decode prefill_length");
                    }
                }
            }
        }
        let mut seen_ops = BTreeSet::new();
        for wb in &plan.write_backs {
            prop_assert!(
                wb.op_id > self.max_op && seen_ops.insert(wb.op_id),
                "write-back op id {} not fresh",
                wb.op_id
            );
            prop_assert!(
                wb.pairs.iter().all(|p| in_range(&cfg, p, Tier::Device)),
                "write-back pair out of range: {:?}",
                wb.pairs
            );
        }
        for lb in &plan.load_backs {
            prop_assert!(
                lb.op_id > self.max_op && seen_ops.insert(lb.op_id),
                "load-back op id {} not fresh",
                lb.op_id
            );
            prop_assert!(
                lb.pairs.iter().all(|p| in_range(&cfg, p, Tier::Host)),
                "load-back pair out of range: {:?}",
                lb.pairs
            );
        }
        if let Some(&max) = seen_ops.iter().next_back() {
            self.max_op = max;
        }
        for a in &plan.aborted {
            prop_assert!(
                self.live.contains_key(&a.request_id),
                "scheduler aborted {}, which the engine no longer waits for",
                a.request_id
            );
            prop_assert!(
                !ids.contains(&a.request_id),
                "{} aborted and scheduled in one plan",
                a.request_id
            );
            prop_assert_eq!(
                self.s.request_state(&a.request_id),
                Some(StateKind::Finished),
                "state of scheduler-aborted {}",
                a.request_id.clone()
            );
        }
        Ok(())
    }

    fn trace_plan(&mut self, plan: &ExecutionPlan) {
        eprintln!("plan #{}:", self.plans);
        for row in &plan.forward.rows {
            eprintln!(
                "  {:?} {} slot {} in {} ext {} prefill_len {} pages {:?} new {}+{}",
                row.kind,
                row.request_id,
                row.slot,
                row.input_length,
                row.extend_prefix_len,
                row.prefill_length,
                plan.forward.page_table_of(row),
                row.begin,
                row.size
            );
        }
        for wb in &plan.write_backs {
            eprintln!("  write-back {wb:?}");
        }
        for lb in &plan.load_backs {
            eprintln!("  load-back {lb:?}");
        }
        for a in &plan.aborted {
            eprintln!("  aborted {a:?}");
        }
        let states: Vec<_> = self
            .s
            .request_ids()
            .into_iter()
            .map(|id| {
                let st = self.s.request_state(&id);
                (id, st)
            })
            .collect();
        eprintln!("  states {states:?}\n  stats {:?}", self.s.stats());
    }

    // ----- one engine step -----

    /// Builds a plan, checks it, and answers it. `finish_all`: the engine finishes
    /// every request at its next result (drain mode).
    fn step(&mut self, g: &StepGen, finish_all: bool) -> Result<(), TestCaseError> {
        let plan = self.s.next_plan();
        self.plans += 1;
        if self.trace {
            self.trace_plan(&plan);
        }
        self.check_plan(&plan)?;
        for a in &plan.aborted {
            self.live.remove(&a.request_id);
        }
        self.pending
            .extend(plan.write_backs.iter().map(|w| w.op_id));

        let mut answer = Vec::new();
        for (i, row) in plan.forward.rows.iter().enumerate() {
            let Some(l) = self.live.get_mut(&row.request_id) else {
                continue;
            };
            if l.finishing {
                continue; // the engine already finished it; overlap leftovers
            }
            let produces = match row.kind {
                RowKind::Prefill => l.prefill_end == Some(l.prompt.len() as u32),
                RowKind::Decode | RowKind::Recovery => true,
            };
            if !produces {
                continue;
            }
            let token = (g.token + i as Token) % 4;
            answer.push(EngineEvent::ExtendResult {
                request_id: row.request_id.clone(),
                tokens: vec![token],
            });
            l.produced += 1;
            if finish_all || l.produced >= l.max_new {
                l.finishing = true;
                answer.push(EngineEvent::Finish {
                    request_id: row.request_id.clone(),
                });
            } else if let (Some(n), true) = (g.reserve, row.kind != RowKind::Prefill) {
                if n < self.cfg.decode_input_tokens {
                    l.reserve_intact = false;
                }
                answer.push(EngineEvent::UpdateReserve {
                    request_id: row.request_id.clone(),
                    tokens: n,
                });
            }
        }

        let mut acks = Vec::new();
        let mut still = Vec::new();
        for (i, &op) in self.pending.iter().enumerate() {
            let bit = 1u16 << (i % 16);
            if finish_all || g.ack_mask & bit != 0 {
                let success = finish_all || g.fail_mask & bit == 0;
                acks.push(EngineEvent::WriteBackDone { op_id: op, success });
            } else {
                still.push(op);
            }
        }
        self.pending = still;

        let mut forward = std::mem::take(&mut self.deferred);
        if g.defer && !finish_all {
            self.deferred = answer;
        } else {
            forward.extend(answer);
        }
        let events = if g.acks_first {
            acks.into_iter().chain(forward).collect()
        } else {
            forward.into_iter().chain(acks).collect()
        };
        self.deliver(events)
    }

    /// Sends events a well-behaved engine produced: every one must be accepted.
    fn deliver(&mut self, events: Vec<EngineEvent>) -> Result<(), TestCaseError> {
        if events.is_empty() {
            return Ok(());
        }
        let sent = events.clone();
        if self.trace {
            eprintln!("  events: {sent:?}");
        }
        if let Err(e) = self.s.advance(events) {
            return Err(fail(format!(
                "engine events refused: {:?}\n  batch: {sent:?}",
                e.rejected
            )));
        }
        for ev in sent {
            match ev {
                EngineEvent::ExtendResult { request_id, tokens } => {
                    if let Some(l) = self.live.get_mut(&request_id) {
                        l.delivered += tokens.len();
                        l.delivered_tokens.extend_from_slice(&tokens);
                    }
                }
                EngineEvent::Finish { request_id } => {
                    self.live.remove(&request_id);
                }
                _ => {}
            }
        }
        Ok(())
    }

    // ----- random outside events -----

    fn pick_ever(&self, i: usize) -> RequestId {
        if self.ever.is_empty() {
            RequestId::new("never-submitted")
        } else {
            self.ever[i % self.ever.len()].clone()
        }
    }

    fn abort(&mut self, i: usize) -> Result<(), TestCaseError> {
        let id = self.pick_ever(i);
        match self.s.abort(&id) {
            Ok(()) => {
                self.live.remove(&id);
                Ok(())
            }
            Err(SchedError::UnknownRequest(_) | SchedError::InvalidTransition { .. }) => {
                prop_assert!(!self.live.contains_key(&id), "abort of live {id} refused");
                Ok(())
            }
            Err(e) => Err(fail(format!("abort of {id}: unexpected error {e:?}"))),
        }
    }

    fn update_reserve(&mut self, i: usize, n: u32) -> Result<(), TestCaseError> {
        let id = self.pick_ever(i);
        let state = self.s.request_state(&id);
        let result = self.s.advance(vec![EngineEvent::UpdateReserve {
            request_id: id.clone(),
            tokens: n,
        }]);
        // A request queued again to recompute after it decoded (a retraction the host
        // could not take) still takes its last row's late answers.
        let decoded = self.live.get(&id).is_some_and(|l| l.delivered > 0);
        match result {
            Ok(()) => {
                if let Some(l) = self.live.get_mut(&id)
                    && n < self.cfg.decode_input_tokens
                {
                    l.reserve_intact = false;
                }
                prop_assert!(
                    matches!(
                        state,
                        None | Some(
                            StateKind::Decoding
                                | StateKind::Retracting
                                | StateKind::Retracted
                                | StateKind::Finished
                        )
                    ) || (state == Some(StateKind::Submitted) && decoded),
                    "UpdateReserve accepted in state {state:?}"
                );
            }
            Err(BatchError { rejected }) => {
                prop_assert_eq!(rejected.len(), 1);
                let ok = matches!(
                    rejected[0].error,
                    SchedError::UnknownRequest(_) | SchedError::InvalidTransition { .. }
                );
                prop_assert!(
                    ok,
                    "UpdateReserve({id}) in {state:?}: unexpected {:?}",
                    rejected[0].error
                );
            }
        }
        Ok(())
    }

    // ----- refused events change nothing -----

    fn snapshot(&mut self) -> Snapshot {
        let stats = self.s.stats();
        let requests = self
            .s
            .request_ids()
            .into_iter()
            .map(|id| {
                let state = self.s.request_state(&id);
                let tokens = self.s.request_tokens(&id);
                let pages = self.s.occupied_pages(&id);
                (id, state, tokens, pages)
            })
            .collect();
        let cache = self.s.cache();
        Snapshot {
            stats,
            requests,
            evictable: [cache.evictable(Tier::Device), cache.evictable(Tier::Host)],
            idle: self.s.is_idle(),
        }
    }

    fn invalid(&mut self, inv: Invalid) -> Result<(), TestCaseError> {
        let known = self.s.request_ids();
        let pick = |i: usize| known.get(i % known.len().max(1)).cloned();
        // (event, acceptable errors as a predicate description)
        let (event, expect): (EngineEvent, Expect) = match inv {
            Invalid::ForState(i, k) => {
                let Some(id) = pick(i) else { return Ok(()) };
                let state = self.s.request_state(&id).expect("listed id is known");
                let finish = EngineEvent::Finish {
                    request_id: id.clone(),
                };
                let extend = EngineEvent::ExtendResult {
                    request_id: id.clone(),
                    tokens: vec![1],
                };
                let reserve = EngineEvent::UpdateReserve {
                    request_id: id.clone(),
                    tokens: 1,
                };
                let negative = EngineEvent::ExtendResult {
                    request_id: id.clone(),
                    tokens: vec![2, -1],
                };
                // Queued again to recompute after it decoded, a request still takes its
                // last row's late answers: only a malformed one is invalid then.
                let decoded = self.live.get(&id).is_some_and(|l| l.delivered > 0);
                match state {
                    StateKind::Submitted if decoded => (negative, Expect::Token),
                    StateKind::Submitted
                    | StateKind::Prefilling
                    | StateKind::Draining
                    | StateKind::WritingBack => {
                        let ev = vec![finish, extend, reserve].swap_remove(usize::from(k % 3));
                        (ev, Expect::Transition(state))
                    }
                    StateKind::PrefillDone => (reserve, Expect::Transition(state)),
                    _ => (negative, Expect::Token),
                }
            }
            Invalid::UnknownId(k) => {
                let request_id = RequestId::new(format!("unknown-{k}"));
                let ev = match k % 4 {
                    0 => EngineEvent::Finish { request_id },
                    1 => EngineEvent::Abort { request_id },
                    2 => EngineEvent::UpdateReserve {
                        request_id,
                        tokens: 1,
                    },
                    _ => EngineEvent::ExtendResult {
                        request_id,
                        tokens: vec![1],
                    },
                };
                (ev, Expect::Unknown)
            }
            Invalid::UnknownOp(op_id) => (
                EngineEvent::WriteBackDone {
                    op_id,
                    success: true,
                },
                Expect::Op,
            ),
            Invalid::NegativeToken(i) => {
                let Some(id) = pick(i) else { return Ok(()) };
                (
                    EngineEvent::ExtendResult {
                        request_id: id,
                        tokens: vec![-3],
                    },
                    Expect::TokenOrTransition,
                )
            }
        };
        let before = self.snapshot();
        let result = self.s.advance(vec![event.clone()]);
        let after = self.snapshot();
        let Err(BatchError { rejected }) = result else {
            return Err(fail(format!("invalid event {event:?} accepted")));
        };
        prop_assert_eq!(rejected.len(), 1);
        prop_assert_eq!(rejected[0].index, 0);
        let err = &rejected[0].error;
        let ok = match expect {
            Expect::Transition(st) => {
                matches!(err, SchedError::InvalidTransition { state, .. } if *state == st)
            }
            Expect::Token => matches!(err, SchedError::InvalidToken { .. }),
            Expect::TokenOrTransition => matches!(
                err,
                SchedError::InvalidToken { .. } | SchedError::InvalidTransition { .. }
            ),
            Expect::Unknown => matches!(err, SchedError::UnknownRequest(_)),
            Expect::Op => matches!(err, SchedError::UnknownOp(_)),
        };
        prop_assert!(ok, "{event:?}: expected {expect:?}, got {err:?}");
        prop_assert_eq!(
            before,
            after,
            "refused event {:?} changed the scheduler",
            event
        );
        Ok(())
    }

    // ----- the end -----

    /// Runs steps in which the engine finishes every request at its next result and
    /// acknowledges every write-back successfully, until the scheduler is idle or
    /// `max_steps` have run. Returns whether it became idle.
    fn drain(&mut self, max_steps: usize) -> Result<bool, TestCaseError> {
        let deferred = std::mem::take(&mut self.deferred);
        self.deliver(deferred)?;
        self.check("delivering deferred results")?;
        let g = StepGen {
            ack_mask: u16::MAX,
            fail_mask: 0,
            defer: false,
            acks_first: true,
            reserve: None,
            token: 0,
        };
        for _ in 0..max_steps {
            if self.s.is_idle() {
                return Ok(true);
            }
            self.step(&g, true)?;
            self.check("a drain step")?;
        }
        Ok(self.s.is_idle())
    }

    /// Aborts everything, acknowledges everything, plans until idle, and checks that
    /// every page is free or cached, and free after `clear_cache`.
    fn quiesce(&mut self) -> Result<(), TestCaseError> {
        for id in self.s.request_ids() {
            let r = self.s.abort(&id);
            prop_assert!(r.is_ok(), "final abort of {}: {:?}", id, r);
            self.live.remove(&id);
        }
        self.check("final aborts")?;
        let acks: Vec<EngineEvent> = self
            .pending
            .drain(..)
            .map(|op_id| EngineEvent::WriteBackDone {
                op_id,
                success: true,
            })
            .collect();
        self.deliver(acks)?;
        self.check("final acknowledgements")?;
        for _ in 0..4 {
            if self.s.is_idle() {
                break;
            }
            let plan = self.s.next_plan();
            prop_assert!(
                plan.forward.rows.is_empty() && plan.write_backs.is_empty(),
                "work planned after everything was aborted: {:?}",
                plan
            );
            self.check("a final plan")?;
        }
        prop_assert!(
            self.s.is_idle(),
            "not idle after aborting and acknowledging everything: {:?}",
            self.s.request_ids()
        );
        prop_assert!(self.live.is_empty());
        let s = self.s.stats();
        let usable = [self.cfg.usable_device_pages(), self.cfg.usable_host_pages()];
        prop_assert_eq!(
            u64::from(s.available_device_pages) + s.cached_device_pages,
            u64::from(usable[0]),
            "idle: device pages neither free nor cached: {:?}",
            s
        );
        prop_assert_eq!(
            u64::from(s.available_host_pages) + s.cached_host_pages,
            u64::from(usable[1]),
            "idle: host pages neither free nor cached: {:?}",
            s
        );
        prop_assert_eq!(
            (s.waiting, s.prefilling, s.decoding, s.retracted),
            (0, 0, 0, 0)
        );
        let cache = self.s.cache();
        prop_assert_eq!(
            [cache.evictable(Tier::Device), cache.evictable(Tier::Host)],
            [s.cached_device_pages, s.cached_host_pages],
            "idle: cached pages still locked"
        );
        if let Some(states) = s.states {
            // At quiescence only the tree holds state slots.
            prop_assert_eq!(
                (
                    states.free_device_slots + states.device_states + states.held_at_root,
                    states.free_host_slots + states.host_states
                ),
                (
                    self.cfg.mamba.map_or(0, |m| m.device_slots),
                    self.cfg.mamba.map_or(0, |m| m.host_slots)
                ),
                "idle: state slots neither free nor cached: {:?}",
                states
            );
        }
        if let Some(groups) = &s.groups {
            // At quiescence no request holds group pages: only snapshots do.
            prop_assert_eq!(
                groups.live_tables,
                0,
                "idle: group tables held: {:?}",
                groups
            );
        }
        self.s.clear_cache();
        self.check("clear_cache")?;
        if let Some(groups) = self.s.stats().groups {
            for g in &groups.groups {
                prop_assert_eq!(
                    g.free_pages + 1,
                    g.total_pages,
                    "after clear_cache group pages are held: {:?}",
                    groups
                );
            }
        }
        let s = self.s.stats();
        prop_assert_eq!(
            (s.available_device_pages, s.available_host_pages),
            (usable[0], usable[1]),
            "after clear_cache not every page is free: {:?}",
            s
        );
        prop_assert_eq!((s.cached_device_pages, s.cached_host_pages), (0, 0));
        if let Some(m) = &self.cfg.mamba {
            // Every exit returned the requests' slots, and the cached states left with
            // their KV: both pools are whole.
            let states = s.states.expect("a hybrid scheduler reports its states");
            prop_assert_eq!(
                (states.free_device_slots, states.free_host_slots),
                (m.device_slots, m.host_slots),
                "after clear_cache not every state slot is free: {:?}",
                states
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    Transition(StateKind),
    Token,
    TokenOrTransition,
    Unknown,
    Op,
}

/// What can be observed of one request: state, token count, page table.
type RequestView = (
    RequestId,
    Option<StateKind>,
    Option<usize>,
    Option<Vec<PageId>>,
);

#[derive(Debug, PartialEq)]
struct Snapshot {
    stats: SchedulerStats,
    requests: Vec<RequestView>,
    evictable: [u64; 2],
    idle: bool,
}

fn run_ops(case: &Case) -> Result<Harness, TestCaseError> {
    let mut h = Harness::new(case.config.clone())?;
    h.check("construction")?;
    for (n, op) in case.ops.iter().enumerate() {
        if h.trace {
            eprintln!("op #{n}: {op:?}");
        }
        match op {
            Op::Submit(gens) => h.submit(&case.bases, gens)?,
            Op::Step(g) => h.step(g, false)?,
            Op::Abort(i) => h.abort(*i)?,
            Op::UpdateReserve(i, k) => h.update_reserve(*i, *k)?,
            Op::Invalid(inv) => h.invalid(*inv)?,
        }
        h.check(&format!("op #{n} {op:?}"))?;
    }
    Ok(h)
}

/// Drives `h` with [`Harness::drain`] and fails unless the scheduler becomes idle, then
/// checks quiescence.
fn assert_drains(mut h: Harness) -> Result<(), TestCaseError> {
    let steps = 64 + 8 * h.live.len();
    let idle = h.drain(steps)?;
    if !idle {
        let left: Vec<_> =
            h.s.request_ids()
                .into_iter()
                .map(|id| {
                    let st = h.s.request_state(&id);
                    let tokens = h.s.request_tokens(&id);
                    (id, st, tokens)
                })
                .collect();
        return Err(fail(format!(
            "no progress: not idle after {steps} drain steps; left (id, state, tokens): \
             {left:?}; {:?}; evictable {}",
            h.s.stats(),
            h.s.cache().evictable(Tier::Device)
        )));
    }
    h.quiesce()
}

/// Integration tests have no `lib.rs` above them, so proptest's default location does
/// not resolve; tests run with the package root as working directory.
const REGRESSIONS: &str = "proptest-regressions/proptest_invariants.txt";

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 20_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
        .. ProptestConfig::default()
    })]

    /// Invariants after every operation, refused events are side-effect free, and the
    /// pools are whole again at quiescence.
    #[test]
    fn invariants_hold_under_random_operations(case in case_strategy(60)) {
        let mut h = run_ops(&case)?;
        h.drain(32)?;
        h.quiesce()?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 20_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
        .. ProptestConfig::default()
    })]

    /// Progress: once submissions stop and the engine finishes every request at its next
    /// result (acknowledging every write-back), the scheduler drains to idle by itself.
    /// Nobody aborts anything; a request that can never fit the device pool again must be
    /// given up by the scheduler with an `AbortNotice` (which counts as progress).
    #[test]
    fn drains_to_idle_without_outside_aborts(case in case_strategy(40)) {
        let h = run_ops(&case)?;
        assert_drains(h)?;
    }
}

// ----- minimal counterexamples found by the properties, kept as named tests ------------

/// A prompt of `n` zeros (every minimal case below shares one prefix).
fn zeros(n: usize) -> ReqGen {
    ReqGen {
        base: 0,
        prefix: 0,
        suffix: vec![0; n],
        max_new: 1,
        duplicate: false,
    }
}

fn submit(reqs: &[(usize, u32)]) -> Op {
    Op::Submit(
        reqs.iter()
            .map(|&(len, max_new)| ReqGen {
                max_new,
                ..zeros(len)
            })
            .collect(),
    )
}

fn step(defer: bool) -> Op {
    Op::Step(StepGen {
        ack_mask: u16::MAX,
        fail_mask: 0,
        defer,
        acks_first: false,
        reserve: None,
        token: 0,
    })
}

#[allow(clippy::too_many_arguments)]
fn small_config(
    page_size: u32,
    device_pages: u32,
    host_pages: u32,
    max_scheduled_tokens: u32,
    max_batch_size: u32,
    decode_input_tokens: u32,
    disable_l2_cache: bool,
    publish_prefix_mid_flight: bool,
) -> SchedulerConfig {
    SchedulerConfig {
        page_size,
        device_pages,
        host_pages,
        max_scheduled_tokens,
        max_batch_size,
        decode_input_tokens,
        disable_l2_cache,
        publish_prefix_mid_flight,
        ..SchedulerConfig::default()
    }
}

fn replay(config: SchedulerConfig, ops: Vec<Op>, progress: bool) {
    let case = Case {
        config,
        bases: [vec![0], vec![0], vec![0]],
        ops,
    };
    let result = run_ops(&case).and_then(|mut h| {
        if progress {
            assert_drains(h)
        } else {
            h.drain(32)?;
            h.quiesce()
        }
    });
    if let Err(e) = result {
        panic!("{e}\n(rerun with KVTIER_PROPTEST_TRACE=1 for the plans and events)");
    }
}

/// Found at a5a12a3 (fixed by the write-back tickets of 286a755): r3 finishes while
/// r2's retract write-back of the same prefix is in flight; the match splits the node
/// being written back, the in-flight op only knew the suffix node, so the prefix node's
/// host copy never became readable while the suffix's device copy was demoted — r2's
/// recovery row then lacked 2 pages of its KV ("decode step 1 of r2: 12 pages hold 12
/// tokens < 14").
#[test]
fn regression_split_of_a_node_under_write_back() {
    replay(
        small_config(1, 33, 13, 15, 3, 1, false, false),
        vec![
            submit(&[(7, 2)]),
            submit(&[(13, 2)]),
            submit(&[(9, 1)]),
            step(false),
            step(true),
            step(false),
        ],
        false,
    );
}

/// A request that can never fit the device pool again waits Retracted forever when part
/// of its prefix is cached on device: recovery's `ExceedsDevicePool` test counts
/// load-back + new + tail pages but not the device-resident prefix pages it must also
/// hold (here 1 + 7 + 2 + 2 = 12 > 11 usable, but 7 + 2 + 2 = 11 passes), and
/// `can_free` then fails on every plan.
#[test]
fn regression_retracted_request_too_large_with_device_prefix_never_aborted() {
    replay(
        small_config(1, 12, 9, 8, 1, 2, false, true),
        vec![submit(&[(8, 2)]), submit(&[(1, 1)]), step(false)],
        true,
    );
}

/// Deadlock: r1 and r2 are retracted and keep their tail pages (tail + reserve) on
/// device; r3 is mid-prefill and needs 2 more pages with 1 free. No request is
/// Decoding or PrefillDone, so there is no retraction victim; r1/r2 cannot be
/// recovered; nothing is aborted; every later plan is empty.
#[test]
fn regression_prefill_blocked_by_retracted_tails_deadlocks() {
    replay(
        small_config(1, 17, 7, 4, 2, 2, true, false),
        vec![
            submit(&[(3, 3)]),
            submit(&[(6, 2), (10, 1)]),
            step(false),
            step(false),
            step(false),
            step(false),
        ],
        true,
    );
}

/// A hybrid `small_config` with `device_slots` state slots, chunk 2.
fn hybrid(config: SchedulerConfig, device_slots: u32) -> SchedulerConfig {
    SchedulerConfig {
        mamba: Some(MambaSettings {
            device_slots,
            host_slots: 0,
            chunk: 2,
        }),
        ..config
    }
}

/// Found with the hybrid configs: a 14-token request is retracted, then recomputed with
/// its two generated tokens as a 16-token prompt that, with its decode slot, needs 9
/// of the 8 usable pages: it must be given up, not left prefilling forever.
#[test]
fn regression_hybrid_recompute_too_large_for_the_pool() {
    let ops = vec![
        submit(&[(14, 3)]),
        step(false),
        step(false),
        step(false),
        step(false),
    ];
    let config = small_config(2, 9, 8, 5, 1, 1, true, false);
    replay(config.clone(), ops.clone(), true);
    replay(hybrid(config, 2), ops, true);
}

/// A paged config: one required full-history group of one token a page and `pages`
/// pages (the dummy included).
fn paged(config: SchedulerConfig, pages: u32) -> SchedulerConfig {
    SchedulerConfig {
        paged: Some(paged_settings(config.page_size, 1, None, pages)),
        ..config
    }
}

/// Found with the paged configs: a prompt that needs more pages than a group's whole
/// pool (6 of 5) was accepted and prefilled until its own snapshots filled the pool,
/// then waited forever. It is refused at submission (`PromptTooLongForGroup`).
#[test]
fn regression_paged_prompt_larger_than_a_group_pool() {
    let config = paged(small_config(1, 12, 0, 4, 1, 1, true, false), 6);
    let mut s = Scheduler::new(config.clone()).expect("a valid config");
    let refused = s.submit(vec![RequestSpec::new("r1", vec![0, 1, 0, 0, 0])]);
    let err = refused.expect_err("6 pages of group `h` in a pool of 5");
    assert!(
        matches!(&err.rejected[0].error, SchedError::PromptTooLongForGroup { group, pages: 6, usable: 5, .. } if group == "h"),
        "{err:?}"
    );
    replay(config, vec![submit(&[(4, 3)]), step(false)], true);
}
