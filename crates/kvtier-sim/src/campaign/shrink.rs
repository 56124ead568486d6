//! Shrinking a failing spec: greedy, one simplification at a time, keeping any that
//! still fails the same check, until none does (or the budget of runs is spent).

use super::faults::FaultRates;
use super::spec::{AbortPoint, ClientAbort, Prefix, RunSpec};
use super::{Failure, run_spec};

/// The smallest spec found that still fails `failure`'s check, with its failure, and the
/// runs spent.
pub fn shrink(spec: &RunSpec, failure: &Failure, budget: usize) -> (RunSpec, Failure, usize) {
    let mut best = (spec.clone(), failure.clone());
    let mut runs = 0;
    'improve: loop {
        for candidate in candidates(&best.0) {
            if runs >= budget {
                break 'improve;
            }
            if candidate.validate().is_err() || candidate.weight() >= best.0.weight() {
                continue;
            }
            runs += 1;
            // A run that errors (a temporary directory it could not make) proves nothing.
            if let Ok(report) = run_spec(&candidate)
                && let Some(f) = report.failure
                && f.check == failure.check
            {
                best = (candidate, f);
                continue 'improve;
            }
        }
        break;
    }
    (best.0, best.1, runs)
}

/// Simpler specs, the bigger cuts first.
fn candidates(spec: &RunSpec) -> Vec<RunSpec> {
    let mut out = Vec::new();
    let n = spec.requests.len();
    // Whole halves of the requests, then each request (the last first).
    if n > 1 {
        out.push(without(spec, &(n / 2..n).collect::<Vec<_>>()));
        out.push(without(spec, &(0..n / 2).collect::<Vec<_>>()));
    }
    for i in (0..n).rev() {
        out.push(without(spec, &[i]));
    }
    // Fewer faults, then no L3.
    for &kind in spec.faults.0.keys() {
        let mut s = spec.clone();
        s.faults.0.remove(&kind);
        out.push(s);
    }
    if !spec.faults.0.is_empty() {
        out.push(RunSpec {
            faults: FaultRates::default(),
            ..spec.clone()
        });
    }
    for k in 0..spec.first_in_state.len() {
        let mut s = spec.clone();
        s.first_in_state.remove(k);
        out.push(s);
    }
    if spec.l3.is_some() {
        out.push(RunSpec {
            l3: None,
            ..spec.clone()
        });
    }
    // Fewer aborts, shorter prompts and answers, earlier arrivals.
    for i in 0..n {
        let r = &spec.requests[i];
        let mut edit = |f: &mut dyn FnMut(&mut RunSpec)| {
            let mut s = spec.clone();
            f(&mut s);
            out.push(s);
        };
        if r.abort.is_some() {
            edit(&mut |s| s.requests[i].abort = None);
        }
        for v in smaller(r.own_tokens, 1) {
            edit(&mut |s| s.requests[i].own_tokens = v);
        }
        if let Prefix::Base { tokens, .. } = r.prefix {
            edit(&mut |s| s.requests[i].prefix = Prefix::None);
            for v in smaller(tokens, 1) {
                edit(&mut |s| {
                    if let Prefix::Base { tokens, .. } = &mut s.requests[i].prefix {
                        *tokens = v;
                    }
                });
            }
        }
        if matches!(r.prefix, Prefix::Follows(_)) {
            edit(&mut |s| s.requests[i].prefix = Prefix::None);
        }
        for v in smaller(r.max_new, 1) {
            edit(&mut |s| set_max_new(s, i, v));
        }
        for v in smaller(r.arrival, 0) {
            edit(&mut |s| s.requests[i].arrival = v);
        }
    }
    // Shorter bases (a request taking more than is left takes all of it).
    for b in 0..spec.bases.len() {
        for v in smaller(spec.bases[b].tokens, 1) {
            let mut s = spec.clone();
            s.bases[b].tokens = v;
            for r in &mut s.requests {
                if let Prefix::Base { base, tokens } = &mut r.prefix
                    && *base == b
                {
                    *tokens = (*tokens).min(v);
                }
            }
            out.push(s);
        }
    }
    out
}

/// Values below `v` down to `min` to try, the biggest cuts first: the minimum, half,
/// three quarters, one less.
fn smaller(v: u32, min: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for c in [min, v / 2, v - v / 4, v.saturating_sub(1)] {
        if c >= min && c < v && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// `spec` without the requests at `drop`: their follow-ups start afresh.
fn without(spec: &RunSpec, drop: &[usize]) -> RunSpec {
    let mut s = spec.clone();
    let gone: Vec<String> = drop
        .iter()
        .map(|&i| spec.requests[i].name.clone())
        .collect();
    let mut i = 0;
    s.requests.retain(|_| {
        i += 1;
        !drop.contains(&(i - 1))
    });
    for r in &mut s.requests {
        if let Prefix::Follows(parent) = &r.prefix
            && gone.contains(parent)
        {
            r.prefix = Prefix::None;
        }
    }
    s
}

/// Sets request `i`'s `max_new`, keeping its abort within the answer.
fn set_max_new(spec: &mut RunSpec, i: usize, max_new: u32) {
    let r = &mut spec.requests[i];
    r.max_new = max_new;
    if let Some(ClientAbort {
        at: AbortPoint::Generated(k),
        ..
    }) = r.abort
        && k >= max_new
    {
        r.abort = (max_new > 1).then_some(ClientAbort {
            at: AbortPoint::Generated(max_new - 1),
            before_advance: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_come_biggest_first_and_stay_in_range() {
        assert_eq!(smaller(100, 1), [1, 50, 75, 99]);
        assert_eq!(smaller(2, 1), [1]);
        assert_eq!(smaller(1, 1), Vec::<u32>::new());
        assert_eq!(smaller(3, 0), [0, 1, 2]);
    }

    #[test]
    fn every_candidate_is_smaller_and_dropping_a_parent_frees_its_follow_ups() {
        let spec = (0..200)
            .map(RunSpec::draw)
            .find(|s| {
                s.requests
                    .iter()
                    .any(|r| matches!(r.prefix, Prefix::Follows(_)))
            })
            .expect("some seed draws a follow-up");
        for candidate in candidates(&spec) {
            assert!(candidate.weight() <= spec.weight());
            assert!(candidate.validate().is_ok(), "{candidate:#?}");
        }
        let parent = spec
            .requests
            .iter()
            .find_map(|r| match &r.prefix {
                Prefix::Follows(p) => Some(p.clone()),
                _ => None,
            })
            .expect("a follow-up");
        let at = spec
            .requests
            .iter()
            .position(|r| r.name == parent)
            .expect("its parent");
        let cut = without(&spec, &[at]);
        assert_eq!(cut.requests.len(), spec.requests.len() - 1);
        assert!(
            cut.requests
                .iter()
                .all(|r| r.prefix != Prefix::Follows(parent.clone()))
        );
    }
}
