//! Fault hooks: every mail and every answer passes them, on every runtime.
//!
//! `Fault::Fail` drops the delivery (and the handles inside it) and fails the call with
//! [`KvError::DeliveryFailed`] on every runtime alike. Delays and picks order the
//! deterministic bus; under actix and the direct path a delay delivers at once (the
//! order of concurrent deliveries is the runtime's).

use kvtier_types::ActorName;

use crate::KvError;

/// A message about to be delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Sequence number of the delivery in the system (from 0).
    pub seq: u64,
    /// The sender.
    pub from: ActorName,
    /// The receiver.
    pub to: ActorName,
    /// The message or reply name (as in `docs/messages.md`).
    pub message: &'static str,
}

/// What to do with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Deliver it now.
    Deliver,
    /// Hold it back this many ticks (other ready messages go first; the deterministic
    /// bus only).
    Delay(u64),
    /// Drop it: the call it belongs to fails with [`KvError::DeliveryFailed`].
    Fail,
}

/// Fault injection. The defaults deliver everything in sending order.
pub trait FaultHooks: Send + std::fmt::Debug {
    /// Called once per delivery when it is sent.
    fn on_send(&mut self, _delivery: &Delivery) -> Fault {
        Fault::Deliver
    }

    /// Picks which of the ready deliveries (in sending order) goes next (the
    /// deterministic bus only).
    fn pick(&mut self, _ready: &[Delivery]) -> usize {
        0
    }
}

/// Delivers everything in sending order.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFaults;

impl FaultHooks for NoFaults {}

/// The hooks and the delivery count of one system.
#[derive(Debug)]
pub(crate) struct Post {
    hooks: Box<dyn FaultHooks>,
    seq: u64,
}

impl Post {
    pub fn new(hooks: Box<dyn FaultHooks>) -> Self {
        Self { hooks, seq: 0 }
    }

    /// Asks the hooks about one delivery: its record and how long to hold it, or the
    /// error of a failed delivery.
    pub fn send(
        &mut self,
        from: ActorName,
        to: ActorName,
        message: &'static str,
    ) -> Result<(Delivery, u64), KvError> {
        let delivery = Delivery {
            seq: self.seq,
            from,
            to,
            message,
        };
        self.seq += 1;
        match self.hooks.on_send(&delivery) {
            Fault::Deliver => Ok((delivery, 0)),
            Fault::Delay(ticks) => Ok((delivery, ticks)),
            Fault::Fail => Err(KvError::DeliveryFailed { to, message }),
        }
    }

    pub fn pick(&mut self, ready: &[Delivery]) -> usize {
        self.hooks.pick(ready)
    }
}
