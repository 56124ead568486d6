//! The device actor's core: executes each plan's cache ops on the arenas through the
//! kernel library, then hands the forward rows to the model runner.

use std::any::Any;

use kvtier_types::{
    EngineEvent, ExecutionPlan, LoadBackOp, RequestId, Token, TransferKind, TransferPair,
    WriteBackOp,
};

use crate::{DeviceError, KvArenas};

/// A request the engine submitted since its last plan, announced to the model runner
/// with the next plan (its prompt and how many tokens to generate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRequest {
    /// The request.
    pub id: RequestId,
    /// Its prompt.
    pub prompt: Vec<Token>,
    /// Tokens to generate before it finishes.
    pub max_new_tokens: usize,
}

/// What runs a plan's forward rows over the arenas: an engine's model runner, or the
/// oracle engine that proves the KV it reads is right.
pub trait ModelRunner: Send + std::fmt::Debug {
    /// Requests submitted since the last plan (before their first row).
    fn admit(&mut self, _requests: &[NewRequest]) {}

    /// Device pages just loaded back from host (`src` host page → `dst` device page).
    fn loaded(&mut self, _pairs: &[TransferPair]) {}

    /// Host pages just written back from device (`src` device page → `dst` host page);
    /// told only when the copy happened.
    fn written_back(&mut self, _pairs: &[TransferPair]) {}

    /// A load-back that failed: its `dst` device pages hold no valid KV. The rows of the
    /// next `forward` whose page tables include them are void: the scheduler ignores
    /// their results and schedules their requests again, so a runner should skip them.
    fn load_failed(&mut self, _pairs: &[TransferPair]) {}

    /// Runs the plan's forward rows and appends the engine's events.
    fn forward(
        &mut self,
        plan: &ExecutionPlan,
        arenas: &mut KvArenas,
        events: &mut Vec<EngineEvent>,
    ) -> Result<(), DeviceError>;

    /// The runner, for reading it back.
    fn as_any(&self) -> &dyn Any;

    /// The runner, for taking it back out of the system.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// Fault injection: which copies fail.
pub trait CopyFaults: Send + std::fmt::Debug {
    /// Whether this write-back's copy fails (it then copies nothing).
    fn fail_write_back(&mut self, op: &WriteBackOp) -> bool;

    /// How many leading pairs of this load-back are copied before it fails; `None`: it
    /// succeeds. A failed load-back is reported whole, however much it copied.
    fn fail_load_back(&mut self, _op: &LoadBackOp) -> Option<usize> {
        None
    }
}

/// Every copy succeeds.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCopyFaults;

impl CopyFaults for NoCopyFaults {
    fn fail_write_back(&mut self, _: &WriteBackOp) -> bool {
        false
    }
}

/// Fails every `n`-th write-back (the `n`-th, `2n`-th, …) and, if asked, every `m`-th
/// load-back (copying half its pages first); `0` fails none.
#[derive(Debug, Default, Clone, Copy)]
pub struct FailEveryNth {
    write_backs: Every,
    load_backs: Every,
}

/// Every `n`-th of a kind of copy.
#[derive(Debug, Default, Clone, Copy)]
struct Every {
    n: u64,
    seen: u64,
}

impl Every {
    fn hit(&mut self) -> bool {
        self.seen += 1;
        self.n > 0 && self.seen.is_multiple_of(self.n)
    }
}

impl FailEveryNth {
    /// Fails every `n`-th write-back.
    pub fn new(n: u64) -> Self {
        Self {
            write_backs: Every { n, seen: 0 },
            load_backs: Every::default(),
        }
    }

    /// Also fails every `m`-th load-back.
    pub fn with_load_backs(mut self, m: u64) -> Self {
        self.load_backs = Every { n: m, seen: 0 };
        self
    }
}

impl CopyFaults for FailEveryNth {
    fn fail_write_back(&mut self, _: &WriteBackOp) -> bool {
        self.write_backs.hit()
    }

    fn fail_load_back(&mut self, op: &LoadBackOp) -> Option<usize> {
        self.load_backs.hit().then_some(op.pairs.len() / 2)
    }
}

/// Counters of the device actor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Write-back ops executed (failed ones included).
    pub write_backs: u64,
    /// Write-back ops that failed (acknowledged with `success: false`).
    pub failed_write_backs: u64,
    /// KV pages written back.
    pub pages_written: u64,
    /// Load-back ops executed (failed ones included).
    pub load_backs: u64,
    /// Load-back ops that failed (reported with `LoadBackFailed`).
    pub failed_load_backs: u64,
    /// KV pages loaded back.
    pub pages_loaded: u64,
    /// Bytes moved by both (KV pages and state slots).
    pub moved_bytes: u64,
}

/// The device actor's core: the arenas, the model runner and the copy faults.
#[derive(Debug)]
pub struct DeviceCore {
    arenas: KvArenas,
    runner: Option<Box<dyn ModelRunner>>,
    faults: Box<dyn CopyFaults>,
    stats: DeviceStats,
}

impl DeviceCore {
    /// A device over these arenas, with no runner (plans' forward rows are left to the
    /// engine) and no faults.
    pub fn new(arenas: KvArenas) -> Self {
        Self {
            arenas,
            runner: None,
            faults: Box::new(NoCopyFaults),
            stats: DeviceStats::default(),
        }
    }

    /// Runs forward rows through `runner`.
    pub fn with_runner(mut self, runner: Box<dyn ModelRunner>) -> Self {
        self.runner = Some(runner);
        self
    }

    /// Fails copies as `faults` says.
    pub fn with_faults(mut self, faults: Box<dyn CopyFaults>) -> Self {
        self.faults = faults;
        self
    }

    /// Executes one plan: write-backs first (they read device pages the forward may
    /// overwrite), then load-backs, then the forward rows. Returns the write-back acks
    /// followed by the runner's events, ready for `advance`.
    ///
    /// A write-back whose copy fails (injected, or refused by the kernel library) is
    /// acknowledged with `success: false`: the scheduler rolls its host pages back and
    /// the device copy stays the valid one. A load-back whose copy fails is reported
    /// with `LoadBackFailed` (before any row's events, as the scheduler expects), and
    /// the runner is told so it skips the rows that would read its pages.
    pub fn execute(
        &mut self,
        plan: &ExecutionPlan,
        new_requests: &[NewRequest],
    ) -> Result<Vec<EngineEvent>, DeviceError> {
        if let Some(runner) = &mut self.runner {
            runner.admit(new_requests);
        }
        let page_bytes = self.arenas.geometry().page_bytes();
        let slot_bytes = self.arenas.state_slot_bytes();
        // Bytes and KV pages a list of pairs moves (state slots move no pages).
        let moves = |pairs: &[TransferPair]| {
            let kv = pairs.iter().filter(|p| p.kind == TransferKind::Kv).count() as u64;
            let states = pairs.len() as u64 - kv;
            (kv, kv * page_bytes + states * slot_bytes)
        };
        let mut events = Vec::with_capacity(plan.write_backs.len() + plan.forward.rows.len());
        for op in &plan.write_backs {
            self.stats.write_backs += 1;
            let success =
                !self.faults.fail_write_back(op) && self.arenas.write_back(&op.pairs).is_ok();
            if success {
                let (pages, bytes) = moves(&op.pairs);
                self.stats.pages_written += pages;
                self.stats.moved_bytes += bytes;
                if let Some(runner) = &mut self.runner {
                    runner.written_back(&op.pairs);
                }
            } else {
                self.stats.failed_write_backs += 1;
            }
            events.push(EngineEvent::WriteBackDone {
                op_id: op.op_id,
                success,
            });
        }
        let layers = self.arenas.geometry().layers;
        for op in &plan.load_backs {
            self.stats.load_backs += 1;
            let copied = match self.faults.fail_load_back(op) {
                Some(part) => {
                    let part = part.min(op.pairs.len());
                    self.arenas
                        .load_back(&op.pairs[..part], 0..layers)
                        .map(|()| part)
                }
                None => self
                    .arenas
                    .load_back(&op.pairs, 0..layers)
                    .map(|()| op.pairs.len()),
            };
            let landed = matches!(copied, Ok(n) if n == op.pairs.len());
            let (pages, bytes) = moves(&op.pairs[..copied.unwrap_or(0)]);
            self.stats.moved_bytes += bytes;
            if landed {
                self.stats.pages_loaded += pages;
            } else {
                self.stats.failed_load_backs += 1;
                events.push(EngineEvent::LoadBackFailed { op_id: op.op_id });
            }
            if let Some(runner) = &mut self.runner {
                if landed {
                    runner.loaded(&op.pairs);
                } else {
                    runner.load_failed(&op.pairs);
                }
            }
        }
        // Rows that start from a cached recurrent state copy it into their working slot
        // first (copy on write), after the load-backs that may have brought it.
        let cow: Vec<TransferPair> = plan
            .forward
            .rows
            .iter()
            .filter_map(|row| {
                let m = row.mamba;
                Some(TransferPair {
                    kind: TransferKind::Mamba,
                    src: m.cow_src?,
                    dst: m.working?,
                })
            })
            .collect();
        if !cow.is_empty() {
            self.arenas.copy_device_states(&cow)?;
            self.stats.moved_bytes += cow.len() as u64 * slot_bytes;
        }
        if let Some(runner) = &mut self.runner {
            runner.forward(plan, &mut self.arenas, &mut events)?;
        }
        Ok(events)
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// The arenas (for fault injection and inspection).
    pub fn arenas_mut(&mut self) -> &mut KvArenas {
        &mut self.arenas
    }

    /// The model runner, if any.
    pub fn runner(&self) -> Option<&dyn ModelRunner> {
        self.runner.as_deref()
    }

    /// Takes the model runner out.
    pub fn take_runner(&mut self) -> Option<Box<dyn ModelRunner>> {
        self.runner.take()
    }
}
