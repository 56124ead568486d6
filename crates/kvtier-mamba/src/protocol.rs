//! The Mamba actor's protocol: one message carries a step's ops for this family, run in
//! order, each answered on its own (a refused op changes nothing and does not stop the
//! others).

use kvtier_types::hash::PageHash;
use kvtier_types::{ActorCore, ActorName, OpId, Tier, TransferPair};

use crate::{Admitted, MambaCore, MambaError, MambaStats, Slot, StateMatch, StateSource};

/// One operation on the Mamba family.
#[derive(Debug)]
#[non_exhaustive]
pub enum MambaOp {
    /// A new scheduling step: last step's copy sources are no longer protected.
    BeginStep,
    /// How much of a prompt is reusable with its state ([`MambaCore::match_prefix`]).
    Match {
        /// The prompt's page hashes (except-last pages), root first.
        path: Vec<PageHash>,
        /// KV pages cached on device.
        kv_device_pages: u32,
        /// KV pages cached on host.
        kv_host_pages: u32,
    },
    /// A request's pair, from a cached state or from nothing ([`MambaCore::admit`]).
    Admit {
        /// Where its state comes from.
        source: Option<StateSource>,
    },
    /// A fresh checkpoint slot ([`MambaCore::renew_checkpoint`]).
    RenewCheckpoint,
    /// Caches a checkpoint as the state after `path` ([`MambaCore::publish`]).
    Publish {
        /// The prefix it follows.
        path: Vec<PageHash>,
        /// The request's slot holding it.
        slot: Slot,
    },
    /// The state half of a write-back ([`MambaCore::prepare_write_back`]).
    PrepareWriteBack {
        /// The write-back op.
        op: OpId,
        /// The states of the written path.
        keys: Vec<PageHash>,
    },
    /// A write-back finished ([`MambaCore::ack_write_back`]).
    AckWriteBack {
        /// The op.
        op: OpId,
        /// Whether its copies landed.
        success: bool,
    },
    /// The KV under these states left `tier` ([`MambaCore::drop_states`]).
    DropStates {
        /// The states.
        keys: Vec<PageHash>,
        /// The tier.
        tier: Tier,
    },
    /// Counters and gauges.
    Stats,
    /// The invariant check ([`MambaCore::check_invariants`]).
    CheckInvariants,
}

/// The answer to one [`MambaOp`].
#[derive(Debug)]
#[non_exhaustive]
pub enum MambaResult {
    /// Done, nothing to say.
    Done,
    /// The match.
    Matched(StateMatch),
    /// The admission, or `None` (nothing taken) when the slots cannot be had.
    Admitted(Option<Admitted>),
    /// A fresh checkpoint slot, if one could be had.
    Checkpoint(Option<Slot>),
    /// Whether the checkpoint was attached (else its depth had a state already).
    Published(bool),
    /// Copies for the plan.
    Pairs(Vec<TransferPair>),
    /// The counters.
    Stats(MambaStats),
}

/// A message to the Mamba actor: a step's ops, in order.
#[derive(Debug)]
pub struct MambaMsg(pub Vec<MambaOp>);

/// The Mamba actor's answer: one result per op, in order.
#[derive(Debug)]
pub struct MambaReply(pub Vec<Result<MambaResult, MambaError>>);

impl MambaCore {
    /// Runs one op.
    pub fn apply(&mut self, op: MambaOp) -> Result<MambaResult, MambaError> {
        Ok(match op {
            MambaOp::BeginStep => {
                self.begin_step();
                MambaResult::Done
            }
            MambaOp::Match {
                path,
                kv_device_pages,
                kv_host_pages,
            } => MambaResult::Matched(self.match_prefix(&path, kv_device_pages, kv_host_pages)),
            MambaOp::Admit { source } => MambaResult::Admitted(self.admit(source)),
            MambaOp::RenewCheckpoint => MambaResult::Checkpoint(self.renew_checkpoint()),
            MambaOp::Publish { path, slot } => MambaResult::Published(self.publish(&path, slot)?),
            MambaOp::PrepareWriteBack { op, keys } => {
                MambaResult::Pairs(self.prepare_write_back(op, &keys)?)
            }
            MambaOp::AckWriteBack { op, success } => {
                self.ack_write_back(op, success)?;
                MambaResult::Done
            }
            MambaOp::DropStates { keys, tier } => {
                self.drop_states(&keys, tier);
                MambaResult::Done
            }
            MambaOp::Stats => MambaResult::Stats(self.stats()),
            MambaOp::CheckInvariants => {
                self.check_invariants()?;
                MambaResult::Done
            }
        })
    }
}

impl ActorCore for MambaCore {
    const NAME: ActorName = ActorName::MAMBA;
    type Msg = MambaMsg;
    type Reply = MambaReply;

    fn handle(&mut self, msg: MambaMsg) -> MambaReply {
        MambaReply(msg.0.into_iter().map(|op| self.apply(op)).collect())
    }

    fn message_name(_: &MambaMsg) -> &'static str {
        "MambaBatch"
    }

    fn reply_name(_: &MambaReply) -> &'static str {
        "MambaResults"
    }
}
