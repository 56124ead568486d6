//! The campaign's fault hooks: each kind of fault at a seeded rate, every firing counted.
//!
//! A new hook is one more [`FaultKind`] (its name, and whether it may change what the
//! cache-on run computes) and one more roll in the hook that injects it. Each kind rolls
//! its own stream, so dropping one kind while shrinking leaves the others' decisions as
//! they were.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier::{Delivery, Fault, FaultHooks};
use kvtier_device::CopyFaults;
use kvtier_l3::{L3Backend, L3Error, L3Faults, L3Key};
use kvtier_types::{EngineEvent, LoadBackOp, WriteBackOp};
use serde::Serialize;

use super::SeedRng;
use crate::tokens::splitmix64;

/// A kind of fault the campaign injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum FaultKind {
    /// A write-back copy fails (acknowledged with `success: false`).
    WriteBackCopy,
    /// A prefetch's get fails outright (the store is down).
    L3GetFails,
    /// A prefetch finds a tail of its objects gone (evicted between lookup and get).
    L3ObjectsLost,
    /// A submit-time existence query fails (no hits).
    L3ExistsFails,
    /// A backup's put fails outright.
    L3PutFails,
    /// A backup's put stores only a leading part of its objects, then fails.
    L3PutPartial,
    /// A delivery on the deterministic bus is held back a few ticks.
    BusDelay,
    /// The bus delivers another ready message than the oldest.
    BusReorder,
    /// A load-back copy fails after copying a leading part (maybe none) of its pages.
    LoadBackCopy,
    /// The engine acknowledges a write-back, prefetch or backup one to three steps late.
    SlowAck,
    /// Not a fault but a planted bug, never drawn: the store serves the second object of
    /// a get under the first key, its own checks passing. Only the oracle can catch it;
    /// tests plant it to show that the campaign fails closed.
    L3ServesWrongObject,
}

impl FaultKind {
    /// Every kind a seed draws, in table order.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::WriteBackCopy,
        FaultKind::L3GetFails,
        FaultKind::L3ObjectsLost,
        FaultKind::L3ExistsFails,
        FaultKind::L3PutFails,
        FaultKind::L3PutPartial,
        FaultKind::BusDelay,
        FaultKind::BusReorder,
        FaultKind::LoadBackCopy,
        FaultKind::SlowAck,
    ];

    /// Its name in the coverage table.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::WriteBackCopy => "fault: write-back copy fails",
            FaultKind::L3GetFails => "fault: L3 get fails",
            FaultKind::L3ObjectsLost => "fault: L3 objects lost",
            FaultKind::L3ExistsFails => "fault: L3 lookup fails",
            FaultKind::L3PutFails => "fault: L3 backup fails",
            FaultKind::L3PutPartial => "fault: L3 backup partial",
            FaultKind::BusDelay => "fault: bus delay",
            FaultKind::BusReorder => "fault: bus reorder",
            FaultKind::LoadBackCopy => "fault: load-back copy fails",
            FaultKind::SlowAck => "fault: acknowledgement late",
            FaultKind::L3ServesWrongObject => "planted: L3 serves a wrong object",
        }
    }

    /// Whether the fault only reorders messages, so the cache-off run takes it too
    /// (the others change what the cache-on run computes, never what it answers).
    pub fn bus_only(self) -> bool {
        matches!(self, FaultKind::BusDelay | FaultKind::BusReorder)
    }

    fn index(self) -> usize {
        self as usize
    }

    /// What seeds this kind's own random streams: its name, so a kind added anywhere in
    /// the enum leaves the others' streams as they were.
    pub(crate) fn stream_key(self) -> u64 {
        self.name()
            .bytes()
            .fold(0, |h, b| splitmix64(h ^ u64::from(b)))
    }
}

/// Fault rates, per mille of the chances each kind gets; kinds not listed never fire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultRates(pub BTreeMap<FaultKind, u16>);

impl FaultRates {
    /// The rate of `kind`.
    pub fn of(&self, kind: FaultKind) -> u16 {
        self.0.get(&kind).copied().unwrap_or(0)
    }

    /// Only the bus faults (the cache-off run's).
    pub fn bus_only(&self) -> FaultRates {
        FaultRates(
            self.0
                .iter()
                .filter(|(kind, _)| kind.bus_only())
                .map(|(&kind, &rate)| (kind, rate))
                .collect(),
        )
    }
}

/// How often each kind fired, shared by the hooks of one run (the planted bug too).
#[derive(Debug, Default)]
pub struct FaultTally([AtomicU64; FaultKind::ALL.len() + 1]);

impl FaultTally {
    fn fired(&self, kind: FaultKind) {
        self.0[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Firings of `kind` so far.
    pub fn count(&self, kind: FaultKind) -> u64 {
        self.0[kind.index()].load(Ordering::Relaxed)
    }
}

/// One kind's seeded coin: fires at its rate, counts what it fires.
#[derive(Debug)]
struct Dice {
    kind: FaultKind,
    per_mille: u16,
    rng: SeedRng,
    tally: Arc<FaultTally>,
}

impl Dice {
    fn new(seed: u64, rates: &FaultRates, kind: FaultKind, tally: &Arc<FaultTally>) -> Self {
        Self {
            kind,
            per_mille: rates.of(kind),
            // Each kind its own stream.
            rng: SeedRng::new(splitmix64(seed ^ kind.stream_key())),
            tally: Arc::clone(tally),
        }
    }

    /// Whether the fault fires now (counted if it does).
    fn roll(&mut self) -> bool {
        let fire = self.per_mille > 0 && self.rng.below(1000) < u64::from(self.per_mille);
        if fire {
            self.tally.fired(self.kind);
        }
        fire
    }

    /// A number in `0..n` from this kind's stream (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }
}

/// Write-back and load-back copies that fail at the seed's rates.
#[derive(Debug)]
pub struct CampaignCopyFaults {
    write_back: Dice,
    load_back: Dice,
}

impl CampaignCopyFaults {
    /// The device hooks of a run.
    pub fn new(seed: u64, rates: &FaultRates, tally: &Arc<FaultTally>) -> Self {
        Self {
            write_back: Dice::new(seed, rates, FaultKind::WriteBackCopy, tally),
            load_back: Dice::new(seed, rates, FaultKind::LoadBackCopy, tally),
        }
    }
}

impl CopyFaults for CampaignCopyFaults {
    fn fail_write_back(&mut self, _: &WriteBackOp) -> bool {
        self.write_back.roll()
    }

    fn fail_load_back(&mut self, op: &LoadBackOp) -> Option<usize> {
        if !self.load_back.roll() {
            return None;
        }
        Some(self.load_back.below(op.pairs.len() as u64 + 1) as usize)
    }
}

/// The engine's late acknowledgements: which of a plan's write-back, prefetch and
/// backup acknowledgements it holds back, and for how many steps.
#[derive(Debug)]
pub struct LateAcks {
    dice: Dice,
}

impl LateAcks {
    /// The late acknowledgements of a run.
    pub fn new(seed: u64, rates: &FaultRates, tally: &Arc<FaultTally>) -> Self {
        Self {
            dice: Dice::new(seed, rates, FaultKind::SlowAck, tally),
        }
    }

    /// Whether this run holds acknowledgements back at all.
    pub fn fires(&self) -> bool {
        self.dice.per_mille > 0
    }

    /// Steps to hold `event` back (1 to 3), if it is an acknowledgement held back now.
    pub fn delay(&mut self, event: &EngineEvent) -> Option<u64> {
        let ack = matches!(
            event,
            EngineEvent::WriteBackDone { .. }
                | EngineEvent::PrefetchDone { .. }
                | EngineEvent::BackupDone { .. }
        );
        (ack && self.dice.roll()).then(|| 1 + self.dice.below(3))
    }
}

/// L3 gets that fail, objects lost before a get, lookups that fail, and backups that fail
/// whole or part way, at the seed's rates.
#[derive(Debug)]
pub struct CampaignL3Faults {
    get_fails: Dice,
    lost: Dice,
    exists_fails: Dice,
    put_fails: Dice,
    put_partial: Dice,
    wrong_object: Dice,
    page_bytes: usize,
}

impl CampaignL3Faults {
    /// The L3 hooks of a run whose objects (pages) are `page_bytes` long.
    pub fn new(seed: u64, rates: &FaultRates, tally: &Arc<FaultTally>, page_bytes: usize) -> Self {
        Self {
            get_fails: Dice::new(seed, rates, FaultKind::L3GetFails, tally),
            lost: Dice::new(seed, rates, FaultKind::L3ObjectsLost, tally),
            exists_fails: Dice::new(seed, rates, FaultKind::L3ExistsFails, tally),
            put_fails: Dice::new(seed, rates, FaultKind::L3PutFails, tally),
            put_partial: Dice::new(seed, rates, FaultKind::L3PutPartial, tally),
            wrong_object: Dice::new(seed, rates, FaultKind::L3ServesWrongObject, tally),
            page_bytes,
        }
    }
}

fn injected(what: &str) -> L3Error {
    L3Error::Io {
        path: "injected".into(),
        source: std::io::Error::other(what.to_string()),
    }
}

impl L3Faults for CampaignL3Faults {
    fn before_get(&mut self, keys: &[L3Key], backend: &mut dyn L3Backend) -> Result<(), L3Error> {
        if self.get_fails.roll() {
            return Err(injected("the L3 store is down"));
        }
        if !keys.is_empty() && self.lost.roll() {
            // A tail of the objects is gone, from a random page on (the first included).
            let from = self.lost.below(keys.len() as u64) as usize;
            backend.remove(&keys[from..])?;
        }
        if keys.len() >= 2 && self.wrong_object.roll() {
            let mut other = vec![0u8; self.page_bytes];
            if backend.get(&keys[1..2], &mut [&mut other[..]])? == [true] {
                backend.remove(&keys[..1])?;
                backend.put(&keys[..1], &[&other[..]])?;
            }
        }
        Ok(())
    }

    fn before_exists(&mut self, _keys: &[L3Key]) -> Result<(), L3Error> {
        if self.exists_fails.roll() {
            return Err(injected("the L3 lookup failed"));
        }
        Ok(())
    }

    fn before_put(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        if self.put_fails.roll() {
            return Err(injected("the L3 store refused the backup"));
        }
        if !keys.is_empty() && self.put_partial.roll() {
            // The store takes a leading part (maybe nothing), then runs out of room.
            return Ok(self.put_partial.below(keys.len() as u64) as usize);
        }
        Ok(keys.len())
    }
}

/// Delays and reorders deliveries on the deterministic bus (never fails one: a failed
/// delivery fails the whole system by design).
#[derive(Debug)]
pub struct BusChaos {
    delay: Dice,
    reorder: Dice,
}

impl BusChaos {
    /// The bus hooks of a run.
    pub fn new(seed: u64, rates: &FaultRates, tally: &Arc<FaultTally>) -> Self {
        Self {
            delay: Dice::new(seed, rates, FaultKind::BusDelay, tally),
            reorder: Dice::new(seed, rates, FaultKind::BusReorder, tally),
        }
    }
}

impl FaultHooks for BusChaos {
    fn on_send(&mut self, _: &Delivery) -> Fault {
        if self.delay.roll() {
            Fault::Delay(1 + self.delay.below(4))
        } else {
            Fault::Deliver
        }
    }

    fn pick(&mut self, ready: &[Delivery]) -> usize {
        // Only a real choice counts as a reorder.
        if ready.len() > 1 && self.reorder.roll() {
            1 + self.reorder.below(ready.len() as u64 - 1) as usize
        } else {
            0
        }
    }
}
