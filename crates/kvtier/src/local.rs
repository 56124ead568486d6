//! The system as a plain synchronous value: its actors run on the caller's thread
//! while a call waits (no thread hop), or, built over a [`Handle`], on their own.

use kvtier_device::{DeviceCore, NewRequest};
use kvtier_types::{ActorCore, EngineEvent, ExecutionPlan, KvEvent, RequestId, RequestSpec};

use crate::conversation::Call;
use crate::runtime::Driver;
use crate::{BlockingHandle, Handle, KvError, ShutdownReport, SystemStats};

/// A system called synchronously. Not `Send` when its actors run on this thread. The
/// same actors, messages and decisions as a [`Handle`]'s system.
#[derive(Debug)]
pub struct LocalSystem {
    driver: Box<dyn Driver>,
}

/// A system on its own thread, called through a blocking handle.
#[derive(Debug)]
struct Remote(BlockingHandle);

/// A remote system nobody shut down is shut down with its view, so its thread ends
/// (after an explicit `shutdown` this answers `ShutDown` at once).
impl Drop for Remote {
    fn drop(&mut self) {
        drop(self.0.shutdown());
    }
}

impl Driver for Remote {
    fn call(
        &mut self,
        call: Call,
        span: tracing::Span,
    ) -> Result<crate::conversation::Outcome, KvError> {
        crate::handle::block_on(self.0.handle().call(call, span))
    }
}

impl LocalSystem {
    pub(crate) fn new(driver: Box<dyn Driver>) -> Self {
        Self { driver }
    }

    /// The synchronous view of a system on its own thread.
    pub fn from_handle(handle: Handle) -> Self {
        Self::new(Box::new(Remote(BlockingHandle::new(handle))))
    }

    fn call(&mut self, call: Call) -> Result<crate::conversation::Outcome, KvError> {
        self.driver.call(call, tracing::Span::current())
    }

    /// See [`Handle::submit`].
    pub fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        self.call(Call::Submit(specs))?.done()
    }

    /// See [`Handle::settle_lookups`].
    pub fn settle_lookups(&mut self) -> Result<(), KvError> {
        self.call(Call::SettleLookups)?.done()
    }

    /// [`Self::submit`], then [`Self::settle_lookups`] whatever the submit answered (a
    /// batch with a refused spec still queued the others, and their lookups are out):
    /// the next plan sees every answer, on every runtime. What a replay on a virtual
    /// clock calls. The submit's answer is returned.
    pub fn submit_settled(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        let submitted = self.submit(specs);
        self.settle_lookups()?;
        submitted
    }

    /// See [`Handle::next_plan`].
    pub fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        self.call(Call::NextPlan)?.plan()
    }

    /// See [`Handle::advance`].
    pub fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        self.call(Call::Advance(events))?.done()
    }

    /// See [`Handle::abort`].
    pub fn abort(&mut self, id: RequestId) -> Result<(), KvError> {
        self.call(Call::Abort(id))?.done()
    }

    /// See [`Handle::stats`].
    pub fn stats(&mut self) -> Result<SystemStats, KvError> {
        self.call(Call::Stats)?.stats()
    }

    /// See [`Handle::take_kv_events`].
    pub fn take_kv_events(&mut self) -> Result<Vec<KvEvent>, KvError> {
        self.call(Call::TakeKvEvents)?.kv_events()
    }

    /// See [`Handle::execute`].
    pub fn execute(
        &mut self,
        plan: ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        self.call(Call::Execute(Box::new(plan), new_requests))?
            .events()
    }

    /// See [`Handle::take_device`].
    pub fn take_device(&mut self) -> Result<Option<DeviceCore>, KvError> {
        self.take_core::<DeviceCore>()
    }

    /// See [`Handle::take_core`].
    pub fn take_core<C: ActorCore>(&mut self) -> Result<Option<C>, KvError> {
        self.call(Call::TakeCore(C::NAME))?.core::<C>()
    }

    /// See [`Handle::ask`].
    pub fn ask<C: ActorCore>(&mut self, msg: C::Msg) -> Result<C::Reply, KvError> {
        self.call(Call::ask::<C>(msg))?.reply::<C>()
    }

    /// See [`Handle::shutdown`].
    pub fn shutdown(mut self) -> Result<ShutdownReport, KvError> {
        self.call(Call::Shutdown)?.report()
    }
}
