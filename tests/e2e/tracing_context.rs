//! Span context travels inside messages: what the actors do for a call is recorded
//! under the caller's span, on every runtime.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier::{BlockingHandle, Runtime, System};
use kvtier_types::{EngineEvent, RequestSpec, SchedulerConfig};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Events and new spans seen: (message field, or `span NAME`; names of the spans in
/// scope, innermost first).
type Seen = Arc<Mutex<Vec<(String, Vec<String>)>>>;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

struct Capture(Seen);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let scope = ctx
            .span_scope(id)
            .map(|scope| scope.skip(1).map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        seen.push((format!("span {}", attrs.metadata().name()), scope));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let scope = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        seen.push((message.0, scope));
    }
}

fn config() -> SchedulerConfig {
    SchedulerConfig {
        page_size: 4,
        device_pages: 64,
        host_pages: 64,
        // Every step is "slow": the scheduler records each one.
        slow_step_threshold: Some(Duration::ZERO),
        ..SchedulerConfig::default()
    }
}

/// The actors run on their own thread here, so the caller's span is in scope there
/// only if the messages carry it. (One test in this binary: it sets the global
/// subscriber, which every thread sees.)
#[test]
fn the_callers_span_reaches_the_scheduler_actor() {
    let seen: Seen = Arc::default();
    let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&seen)));
    tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
    for runtime in [Runtime::Actix, Runtime::Deterministic] {
        seen.lock().expect("lock").clear();
        {
            let system = BlockingHandle::new(
                System::builder(config())
                    .runtime(runtime)
                    .start()
                    .expect("system starts"),
            );
            let step = tracing::info_span!("engine_step");
            let _entered = step.enter();
            system
                .submit(vec![RequestSpec::new("r1", (1..=10).collect())])
                .expect("submit");
            let plan = system.next_plan().expect("plan");
            assert_eq!(plan.forward.rows.len(), 1);
            system
                .advance(vec![EngineEvent::Finish {
                    request_id: "r1".into(),
                }])
                .expect("finish");
            system.shutdown().expect("shutdown");
        }
        // The subscriber is global: other tests of this binary running meanwhile add
        // events of their own (outside any `engine_step`), so look for ours among them.
        let seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let in_step = |scope: &Vec<String>| scope.iter().any(|name| name == "engine_step");
        let slow: Vec<_> = seen
            .iter()
            .filter(|(message, _)| message.contains("slow_step"))
            .collect();
        assert!(
            !slow.is_empty(),
            "{runtime:?}: no slow_step event in {seen:?}"
        );
        assert!(
            slow.iter().any(|(_, scope)| in_step(scope)),
            "{runtime:?}: the step was recorded outside the caller's span: {slow:?}"
        );
        // The request's phases are spans under its `request` span.
        let queued: Vec<_> = seen
            .iter()
            .filter(|(what, scope)| {
                what == "span phase" && scope.first().is_some_and(|s| s == "request")
            })
            .collect();
        assert!(!queued.is_empty(), "{runtime:?}: no request lifecycle span");
        assert!(
            queued.iter().any(|(_, scope)| in_step(scope)),
            "{runtime:?}: the request span does not descend from the caller's: {queued:?}"
        );
    }
}
