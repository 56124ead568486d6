//! Tracing: each request's lifecycle is a span with a child span per phase and its
//! cached tokens per tier; steps slower than the threshold are recorded.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kvtier_types::SchedulerConfig;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Recorded fields: (name, value) in recording order.
type FieldList = Vec<(String, String)>;

/// What the test layer saw: span fields by span (and each span's parent), and events
/// with their parent span.
#[derive(Default)]
struct Seen {
    spans: Vec<(String, FieldList)>,
    parents: Vec<(String, Option<String>)>,
    events: Vec<(Option<String>, FieldList)>,
    closed: usize,
}

struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        ));
    }
}

struct Capture(Arc<Mutex<Seen>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        attrs.record(&mut fields);
        let parent = ctx
            .span_scope(id)
            .and_then(|mut scope| scope.nth(1))
            .map(|s| format!("{}#{}", s.name(), s.id().into_u64()));
        let mut seen = self.0.lock().expect("lock");
        let name = format!("{}#{}", attrs.metadata().name(), id.into_u64());
        seen.parents.push((name.clone(), parent));
        seen.spans.push((name, fields.0));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        values.record(&mut fields);
        let mut seen = self.0.lock().expect("lock");
        let suffix = format!("#{}", id.into_u64());
        if let Some(span) = seen.spans.iter_mut().find(|(n, _)| n.ends_with(&suffix)) {
            span.1.extend(fields.0);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        let parent = ctx
            .event_span(event)
            .map(|s| format!("{}#{}", s.name(), s.id().into_u64()));
        self.0.lock().expect("lock").events.push((parent, fields.0));
    }

    fn on_close(&self, _: Id, _: Context<'_, S>) {
        self.0.lock().expect("lock").closed += 1;
    }
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn request_lifecycle_and_slow_steps_are_traced() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&seen)));
    tracing::subscriber::with_default(subscriber, || {
        let config = SchedulerConfig {
            slow_step_threshold: Some(Duration::ZERO),
            ..fixture()
        };
        let mut s = sched(config);
        let mut engine = Engine::with_max_new(3);
        submit(&mut s, "r1", tokens(1, 9));
        drain(&mut s, &mut engine, 20);
        submit(&mut s, "r2", tokens(1, 9));
        drain(&mut s, &mut engine, 20);
    });
    let seen = seen.lock().expect("lock");
    let span_of = |id: &str| {
        seen.spans
            .iter()
            .find(|(n, f)| n.starts_with("request#") && field(f, "gen_ai.request.id") == Some(id))
            .unwrap_or_else(|| panic!("no span for {id}"))
    };
    let (r1, r1_fields) = span_of("r1");
    let (r2, r2_fields) = span_of("r2");
    assert_eq!(field(r1_fields, "gen_ai.usage.prompt_tokens"), Some("9"));
    assert_eq!(field(r1_fields, "gen_ai.usage.cached_tokens"), Some("0"));
    assert_eq!(
        field(r2_fields, "gen_ai.usage.cached_tokens"),
        Some("8"),
        "r2 reuses r1's 4 pages"
    );
    let tier =
        |name: &str| -> u32 { field(r2_fields, name).map_or(0, |v| v.parse().expect("a number")) };
    assert_eq!(
        tier("kvtier.cached_tokens.device")
            + tier("kvtier.cached_tokens.host")
            + tier("kvtier.cached_tokens.l3"),
        8,
        "the tiers split the cached tokens"
    );
    assert_eq!(
        field(r1_fields, "gen_ai.usage.completion_tokens"),
        Some("3")
    );
    assert_eq!(field(r1_fields, "kvtier.outcome"), Some("finished"));
    // The phases are child spans of the request's, named by `otel.name`, in order.
    let phases = |span: &str| -> Vec<String> {
        seen.parents
            .iter()
            .filter(|(child, p)| p.as_deref() == Some(span) && child.starts_with("phase#"))
            .filter_map(|(child, _)| {
                let (_, fields) = seen.spans.iter().find(|(n, _)| n == child)?;
                field(fields, "otel.name").map(str::to_owned)
            })
            .collect()
    };
    assert_eq!(phases(r1), ["queued", "prefilling", "decoding", "finished"]);
    assert_eq!(phases(r2), ["queued", "prefilling", "decoding", "finished"]);
    // The copy done for r1: its write-back, a child span with its pages.
    let copies: Vec<&FieldList> = seen
        .parents
        .iter()
        .filter(|(child, p)| p.as_deref() == Some(r1) && child.starts_with("copy#"))
        .filter_map(|(child, _)| seen.spans.iter().find(|(n, _)| n == child).map(|(_, f)| f))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(field(copies[0], "otel.name"), Some("write_back"));
    assert_eq!(
        field(copies[0], "kvtier.pages"),
        Some("5"),
        "11 tokens with KV, pages of 2"
    );
    assert!(seen.closed >= 2, "spans close when requests are forgotten");
    let slow = seen
        .events
        .iter()
        .filter(|(_, f)| field(f, "message") == Some("slow_step"))
        .count();
    assert!(slow >= 6, "a zero threshold records every step ({slow})");
}

#[test]
fn fast_steps_record_nothing() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&seen)));
    tracing::subscriber::with_default(subscriber, || {
        let config = SchedulerConfig {
            slow_step_threshold: Some(Duration::from_secs(60)),
            ..fixture()
        };
        let mut s = sched(config);
        submit(&mut s, "r1", tokens(1, 9));
        drain(&mut s, &mut Engine::with_max_new(2), 20);
    });
    let seen = seen.lock().expect("lock");
    assert!(
        seen.events
            .iter()
            .all(|(_, f)| field(f, "message") != Some("slow_step"))
    );
}
