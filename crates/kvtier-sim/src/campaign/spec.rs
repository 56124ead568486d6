//! What a seed draws: the run spec, and the draw itself.
//!
//! A spec is plain data, so a shrunk reproduction prints as its `Debug` and a regression
//! test can build it by hand. Token streams are named by seeds, not listed: shortening
//! a prompt keeps the first tokens of the same stream.

use std::collections::BTreeMap;

use kvtier_fsm::StateKind;
use kvtier_types::{SchedulerConfig, Token};

use super::faults::{FaultKind, FaultRates};
use super::{CampaignError, SeedRng};
use crate::oracle::Verify;
use crate::tokens::{gen_tokens, splitmix64, tag};

/// Page sizes a seed draws from, with their weights: the small ones stress page
/// boundaries, 16 and 64 are what engines use.
const PAGE_SIZES: [(u32, u64); 6] = [(1, 1), (2, 1), (4, 2), (8, 1), (16, 3), (64, 3)];

/// Most requests a seed draws.
const MAX_REQUESTS: u64 = 16;

/// Steps between the waves of requests of an L3 run.
const WAVE_STEPS: u64 = 60;

/// Total prompt tokens above which the oracle samples instead of checking every slot.
const FULL_VERIFY_TOKENS: u64 = 4096;

/// Everything one seed runs: the scheduler's config, the L3 store, the requests and the
/// faults.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// The seed it was drawn from (also seeds the fault hooks).
    pub seed: u64,
    /// Tokens per page.
    pub page_size: u32,
    /// Device pool, page 0 included.
    pub device_pages: u32,
    /// Host pool, page 0 included (0: none).
    pub host_pages: u32,
    /// The host tier as a cache (finish write-backs, host hits); retraction uses the
    /// host pool either way.
    pub l2: bool,
    /// The embedded L3 store, when drawn (cache-on runs only).
    pub l3: Option<L3Spec>,
    /// Rows per plan.
    pub max_batch_size: u32,
    /// Token budget per plan.
    pub max_scheduled_tokens: u32,
    /// Decode-first mixed batches.
    pub mixed_prefill_decode: bool,
    /// Mid-flight prefix publication.
    pub publish_mid_flight: bool,
    /// How much the oracle checks.
    pub verify: Verify,
    /// Shared prompt prefixes.
    pub bases: Vec<Base>,
    /// The requests, in submission order.
    pub requests: Vec<RequestDraw>,
    /// Client aborts of whichever request first reaches a state.
    pub first_in_state: Vec<StateAbort>,
    /// Fault rates (per mille) by kind.
    pub faults: FaultRates,
}

/// The L3 store of a cache-on run: a `LocalStore` in a fresh directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L3Spec {
    /// Prefetch only when more than this many leading pages are in the store.
    pub prefetch_threshold: u32,
    /// Objects the memory tier holds (0: every get reads the disk).
    pub memory_pages: u32,
    /// Objects the disk tier holds before it evicts the oldest (0: unbounded).
    pub disk_pages: u32,
}

/// A shared prefix: the first `tokens` of stream `stream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// The token stream.
    pub stream: u64,
    /// Its length.
    pub tokens: u32,
}

/// What a prompt starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prefix {
    /// Nothing shared.
    None,
    /// The first `tokens` of a shared base.
    Base {
        /// Index in `RunSpec::bases`.
        base: usize,
        /// Tokens taken.
        tokens: u32,
    },
    /// An earlier request's prompt and answer (a follow-up turn); submitted once that
    /// request finished, never if it did not.
    Follows(String),
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDraw {
    /// Its id.
    pub name: String,
    /// The step at which it is submitted (a follow-up: at the first step from here on
    /// after its parent finished).
    pub arrival: u32,
    /// What its prompt starts with.
    pub prefix: Prefix,
    /// The stream of its own tokens, after the prefix.
    pub stream: u64,
    /// How many of them (at least 1).
    pub own_tokens: u32,
    /// Tokens it generates before the engine finishes it.
    pub max_new: u32,
    /// A client abort, if drawn.
    pub abort: Option<ClientAbort>,
}

/// A client abort (`LocalSystem::abort`) of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAbort {
    /// When.
    pub at: AbortPoint,
    /// For `InState`: between the plan's execution and its `advance` (the plan's events
    /// for the request then arrive after the abort), else after the `advance`.
    pub before_advance: bool,
}

/// A client abort of the first request (in id order) the scheduler holds in `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateAbort {
    /// The state.
    pub state: StateKind,
    /// As in [`ClientAbort`].
    pub before_advance: bool,
}

/// The point of a request's life at which the client aborts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortPoint {
    /// Right after its submit, before any plan.
    Submitted,
    /// Once it has generated this many tokens (fewer than its `max_new`).
    Generated(u32),
    /// The first time the scheduler holds it in this state (it may never).
    InState(StateKind),
}

/// States a client abort is drawn for — every state a request can be aborted in — with
/// their weights without and with an L3 store (the prefetch states need one; the rarer
/// states are weighted up).
pub(crate) const ABORT_STATES: [(StateKind, u64, u64); 10] = [
    (StateKind::Submitted, 1, 1),
    (StateKind::Prefetching, 0, 6),
    (StateKind::PrefetchDone, 0, 4),
    (StateKind::Prefilling, 2, 2),
    (StateKind::PrefillDone, 1, 1),
    (StateKind::Decoding, 1, 1),
    (StateKind::Retracting, 2, 2),
    (StateKind::Retracted, 2, 2),
    (StateKind::Draining, 1, 1),
    (StateKind::WritingBack, 1, 1),
];

fn draw_state(rng: &mut SeedRng, l3: bool) -> StateKind {
    let weights =
        ABORT_STATES.map(|(state, plain, with_l3)| (state, if l3 { with_l3 } else { plain }));
    rng.weighted(&weights).unwrap_or(StateKind::Decoding)
}

/// When a request can be seen in `state`: some states last only from a plan to its
/// `advance` (the plan issues the op, the advance completes it), some only from an
/// `advance` to the next plan; the others either way.
fn before_advance(rng: &mut SeedRng, state: StateKind) -> bool {
    match state {
        StateKind::Prefetching
        | StateKind::PrefillDone
        | StateKind::Retracting
        | StateKind::WritingBack => true,
        StateKind::PrefetchDone | StateKind::Draining => false,
        _ => rng.chance(500),
    }
}

impl RunSpec {
    /// The spec seed `seed` draws. The same seed always draws the same spec.
    pub fn draw(seed: u64) -> RunSpec {
        let mut rng = SeedRng::new(seed);
        let page_size = rng.weighted(&PAGE_SIZES).unwrap_or(16);
        // Lengths scale with the page size so that a prompt spans a few pages whatever
        // it is, but never fewer than 8 tokens per unit.
        let unit = page_size.max(8);
        let l2 = rng.chance(700);
        // An L3 run shares more and spreads its arrivals further, so that prefixes leave
        // device and host before they are asked for again.
        let l3_on = l2 && rng.chance(500);
        let bases = (0..1 + rng.below(if l3_on { 4 } else { 3 }))
            .map(|_| Base {
                stream: rng.stream(),
                tokens: page_size * (1 + rng.below(8) as u32) + rng.below(u64::from(unit)) as u32,
            })
            .collect::<Vec<_>>();
        let n = 1 + rng.below(MAX_REQUESTS) as usize;
        let spread = if l3_on { 4 } else { 2 } * n as u64 + 1;
        let share = if l3_on { 13 } else { 9 };
        let mut requests: Vec<RequestDraw> = Vec::with_capacity(n);
        for i in 0..n {
            let followable: Vec<&RequestDraw> =
                requests.iter().filter(|r| r.abort.is_none()).collect();
            let prefix = match rng.below(20) {
                k if k < share => {
                    let base = rng.below(bases.len() as u64) as usize;
                    let tokens = 1 + rng.below(u64::from(bases[base].tokens)) as u32;
                    // Mostly the whole base, so that full pages are shared.
                    let tokens = if rng.chance(600) {
                        bases[base].tokens
                    } else {
                        tokens
                    };
                    Prefix::Base { base, tokens }
                }
                k if k < share + 3 && !followable.is_empty() => {
                    let parent = followable[rng.below(followable.len() as u64) as usize];
                    Prefix::Follows(parent.name.clone())
                }
                _ => Prefix::None,
            };
            let max_new = 1 + rng.below(32) as u32;
            let abort = rng.chance(200).then(|| match rng.below(20) {
                0..=1 => ClientAbort {
                    at: AbortPoint::Submitted,
                    before_advance: false,
                },
                2..=6 if max_new > 1 => ClientAbort {
                    at: AbortPoint::Generated(1 + rng.below(u64::from(max_new - 1)) as u32),
                    before_advance: false,
                },
                _ => {
                    let state = draw_state(&mut rng, l3_on);
                    ClientAbort {
                        at: AbortPoint::InState(state),
                        before_advance: before_advance(&mut rng, state),
                    }
                }
            });
            requests.push(RequestDraw {
                name: format!("r{i:02}"),
                // An L3 run comes in waves far apart: what the first wave computed has
                // left device and host (for L3) when the last wave asks for it again.
                arrival: (rng.below(spread) + if l3_on { WAVE_STEPS * rng.below(3) } else { 0 })
                    as u32,
                prefix,
                stream: rng.stream(),
                own_tokens: 1 + rng.below(3 * u64::from(unit)) as u32,
                max_new,
                abort,
            });
        }
        // Pools in units of the largest request (prompt and answer; a follow-up counts
        // its parent's): below one, some cannot fit at all; around one or two the pool
        // retracts and evicts; above three, nothing is under pressure.
        let largest = (0..requests.len())
            .map(|i| longest_prompt(&requests, &bases, i) + u64::from(requests[i].max_new))
            .max()
            .unwrap_or(1);
        let largest_pages = largest.div_ceil(u64::from(page_size)) + 1;
        let permille = match rng.below(20) {
            0..=7 => 800 + rng.below(700),
            8..=14 => 1500 + rng.below(1500),
            _ => 3000 + rng.below(5000),
        };
        let device_pages = 1 + (largest_pages * permille / 1000).max(1) as u32;
        let host_pages = if l3_on {
            // Below the shared prefixes' pages: they leave the host for L3.
            let bases: u64 = bases.iter().map(|b| u64::from(b.tokens / page_size)).sum();
            1 + (bases * (300 + rng.below(700)) / 1000).max(largest_pages / 2 + 1) as u32
        } else if l2 || rng.chance(700) {
            let usable = u64::from(device_pages - 1);
            1 + (usable * (300 + rng.below(3700)) / 1000).max(1) as u32
        } else {
            0
        };
        let l3 = l3_on.then(|| L3Spec {
            prefetch_threshold: rng.below(5) as u32,
            memory_pages: if rng.chance(300) {
                0
            } else {
                1 + rng.below(256) as u32
            },
            disk_pages: if rng.chance(300) {
                1 + rng.below(u64::from(device_pages)) as u32
            } else {
                0
            },
        });
        let max_scheduled_tokens = if rng.chance(300) {
            8192
        } else {
            page_size * (1 + rng.below(8) as u32) + rng.below(u64::from(unit)) as u32
        };
        // Each kind's rate from a stream of its own: a kind added later leaves the rest of
        // every seed's draw as it was.
        let mut faults = BTreeMap::new();
        for kind in FaultKind::ALL {
            let mut rng = SeedRng::new(splitmix64(seed ^ splitmix64(kind.stream_key())));
            if rng.chance(350) {
                faults.insert(kind, [20, 100, 300, 600][rng.below(4) as usize]);
            }
        }
        // Aborts of whichever request first reaches a state: rare states are reached by
        // some request far more often than by a given one.
        let first_in_state = if rng.chance(400) {
            (0..1 + rng.below(2))
                .map(|_| {
                    let state = draw_state(&mut rng, l3_on);
                    StateAbort {
                        state,
                        before_advance: before_advance(&mut rng, state),
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let prompt_tokens: u64 = (0..requests.len())
            .map(|i| longest_prompt(&requests, &bases, i))
            .sum();
        RunSpec {
            seed,
            page_size,
            device_pages,
            host_pages,
            l2,
            l3,
            max_batch_size: 1 + rng.below(8) as u32,
            max_scheduled_tokens,
            mixed_prefill_decode: rng.chance(300),
            publish_mid_flight: rng.chance(700),
            verify: if prompt_tokens <= FULL_VERIFY_TOKENS {
                Verify::Full
            } else {
                Verify::Sampled(8)
            },
            bases,
            requests,
            first_in_state,
            faults: FaultRates(faults),
        }
    }

    /// The scheduler config of the cache-on run (`cache`) or the cache-off run: the same
    /// pools and policy, with the prefix cache, the host tier as a cache and L3 off.
    pub fn config(&self, cache: bool) -> SchedulerConfig {
        SchedulerConfig {
            page_size: self.page_size,
            device_pages: self.device_pages,
            host_pages: self.host_pages,
            max_scheduled_tokens: self.max_scheduled_tokens,
            max_batch_size: self.max_batch_size,
            decode_input_tokens: 1,
            disable_l2_cache: !(cache && self.l2),
            enable_l3_storage: cache && self.l3.is_some(),
            prefetch_threshold: self.l3.as_ref().map_or(4, |l3| l3.prefetch_threshold),
            // Device-tier removals are how the campaign sees evictions.
            enable_kv_cache_events: cache,
            enable_mixed_prefill_decode: self.mixed_prefill_decode,
            disable_prefix_cache: !cache,
            publish_prefix_mid_flight: self.publish_mid_flight,
            ..SchedulerConfig::default()
        }
    }

    /// Checks what the draw guarantees and a hand-written spec may break: a valid config
    /// for both runs, bases and parents that exist (parents earlier, without a client
    /// abort), unique names, at least one own token, and aborts within the answer.
    pub fn validate(&self) -> Result<(), CampaignError> {
        let bad = |problem: String| Err(CampaignError::Spec(problem));
        for cache in [true, false] {
            if let Err(e) = self.config(cache).validate() {
                return bad(format!("config (cache {cache}): {e}"));
            }
        }
        if self.l3.is_some() && !self.l2 {
            return bad("L3 needs the host tier (l2)".into());
        }
        let mut names = BTreeMap::new();
        for (i, r) in self.requests.iter().enumerate() {
            if names.insert(r.name.as_str(), i).is_some() {
                return bad(format!("two requests are named {}", r.name));
            }
            if r.own_tokens == 0 || r.max_new == 0 {
                return bad(format!(
                    "{}: own_tokens and max_new must be positive",
                    r.name
                ));
            }
            match &r.prefix {
                Prefix::None => {}
                Prefix::Base { base, tokens } => {
                    if self.bases.get(*base).is_none_or(|b| *tokens > b.tokens) {
                        return bad(format!("{}: no base {base} of {tokens} tokens", r.name));
                    }
                }
                Prefix::Follows(parent) => {
                    let ok = names
                        .get(parent.as_str())
                        .is_some_and(|&p| p < i && self.requests[p].abort.is_none());
                    if !ok {
                        return bad(format!(
                            "{}: follows {parent}, which is not an earlier request without \
                             a client abort",
                            r.name
                        ));
                    }
                }
            }
            if let Some(ClientAbort {
                at: AbortPoint::Generated(k),
                ..
            }) = r.abort
                && (k == 0 || k >= r.max_new)
            {
                return bad(format!(
                    "{}: abort after {k} of {} tokens",
                    r.name, r.max_new
                ));
            }
        }
        Ok(())
    }

    /// The prompt of request `i` without its follow-up parent's part: its base prefix and
    /// its own tokens (`None` when there is no request `i`).
    pub fn own_prompt(&self, i: usize) -> Option<Vec<Token>> {
        let r = self.requests.get(i)?;
        let mut prompt = match r.prefix {
            Prefix::Base { base, tokens } => self
                .bases
                .get(base)
                .map(|b| gen_tokens(tag(9, 1, b.stream), b.tokens.min(tokens) as usize))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        prompt.extend(gen_tokens(tag(9, 2, r.stream), r.own_tokens as usize));
        Some(prompt)
    }

    /// A size for shrinking: requests, tokens, arrivals, aborts and faults all count.
    pub fn weight(&self) -> u64 {
        let tokens: u64 = self
            .requests
            .iter()
            .map(|r| {
                let prefix = match r.prefix {
                    Prefix::None => 0,
                    Prefix::Base { tokens, .. } => u64::from(tokens),
                    Prefix::Follows(_) => 5,
                };
                prefix + u64::from(r.own_tokens) + u64::from(r.max_new) + u64::from(r.arrival)
            })
            .sum();
        let bases: u64 = self.bases.iter().map(|b| u64::from(b.tokens)).sum();
        let aborts = self.requests.iter().filter(|r| r.abort.is_some()).count() as u64
            + self.first_in_state.len() as u64;
        1000 * self.requests.len() as u64
            + tokens
            + bases
            + 10 * aborts
            + 10 * self.faults.0.len() as u64
            + u64::from(self.l3.is_some())
    }
}

/// The longest prompt request `i` can have: a follow-up's includes its parent's prompt
/// and whole answer.
pub(crate) fn longest_prompt(requests: &[RequestDraw], bases: &[Base], i: usize) -> u64 {
    let r = &requests[i];
    let prefix = match &r.prefix {
        Prefix::None => 0,
        Prefix::Base { base, tokens } => bases
            .get(*base)
            .map_or(0, |b| u64::from((*tokens).min(b.tokens))),
        Prefix::Follows(parent) => requests[..i]
            .iter()
            .position(|p| p.name == *parent)
            .map_or(0, |p| {
                longest_prompt(requests, bases, p) + u64::from(requests[p].max_new)
            }),
    };
    prefix + u64::from(r.own_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_draws_the_same_valid_spec() {
        let mut page_sizes = std::collections::BTreeSet::new();
        let (mut l3, mut faults, mut aborts) = (0, 0, 0);
        for seed in 0..500 {
            let spec = RunSpec::draw(seed);
            assert_eq!(spec, RunSpec::draw(seed), "seed {seed}");
            if let Err(e) = spec.validate() {
                panic!("seed {seed}: {e}\n{spec:#?}");
            }
            page_sizes.insert(spec.page_size);
            l3 += u32::from(spec.l3.is_some());
            faults += u32::from(!spec.faults.0.is_empty());
            aborts += u32::from(spec.requests.iter().any(|r| r.abort.is_some()));
        }
        assert_eq!(
            page_sizes,
            PAGE_SIZES.iter().map(|&(p, _)| p).collect(),
            "every page size is drawn"
        );
        assert!(
            l3 > 50 && faults > 100 && aborts > 100,
            "{l3} {faults} {aborts}"
        );
        assert_ne!(RunSpec::draw(1), RunSpec::draw(2));
    }

    #[test]
    fn a_hand_written_spec_is_checked_before_it_runs() {
        let spec = RunSpec::draw(3);
        let bad = |edit: &dyn Fn(&mut RunSpec)| {
            let mut s = spec.clone();
            edit(&mut s);
            matches!(s.validate(), Err(CampaignError::Spec(_)))
        };
        assert!(spec.validate().is_ok());
        assert!(bad(&|s| s.page_size = 0));
        assert!(bad(&|s| s.device_pages = 1));
        assert!(bad(&|s| s.requests[0].own_tokens = 0));
        assert!(bad(
            &|s| s.requests[0].prefix = Prefix::Follows("nobody".into())
        ));
        assert!(bad(&|s| {
            s.requests[0].prefix = Prefix::Base {
                base: 99,
                tokens: 1,
            }
        }));
        assert!(bad(&|s| {
            s.requests[0].abort = Some(ClientAbort {
                at: AbortPoint::Generated(s.requests[0].max_new),
                before_advance: false,
            })
        }));
        assert!(bad(&|s| {
            let copy = s.requests[0].clone();
            s.requests.push(copy);
        }));
    }
}
