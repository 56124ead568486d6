//! Where each waiting prompt's last probe got to, so the next one resumes there
//! ([`RadixCore::probe_resumed`]) instead of matching the prompt from the root again.
//!
//! A waiting request is probed every step (its prefetch check, its first chunk), and
//! at a production trace's queue lengths those matches from the root were a quarter of
//! the replay. A mark changes no decision, only what a probe compares: a resumed probe
//! is the probe (checked in debug builds).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use kvtier_types::Token;

use super::RadixCore;
use crate::TokenRef;
use crate::{NodeId, Probe};

/// Marks of the prompts that were refused, by prompt allocation. A request's tokens are
/// one `Arc` from submission until they grow, so the allocation's address names the
/// prompt; the weak reference kept beside the mark holds the allocation, so no other
/// prompt can take that address while the mark exists. Only refused prompts are
/// marked, and an admitted one is forgotten, so a workload whose requests wait for
/// nothing pays one lookup in an empty map per probe.
#[derive(Debug, Default)]
pub(crate) struct PromptMarks {
    marks: BTreeMap<usize, (Weak<Vec<Token>>, NodeId)>,
    /// Entries after the last sweep of prompts no request holds any more.
    swept: usize,
}

impl PromptMarks {
    fn get(&self, prompt: &Arc<Vec<Token>>) -> Option<NodeId> {
        self.marks
            .get(&(Arc::as_ptr(prompt) as usize))
            .map(|&(_, node)| node)
    }

    fn set(&mut self, prompt: &Arc<Vec<Token>>, node: NodeId) {
        let key = Arc::as_ptr(prompt) as usize;
        match self.marks.get_mut(&key) {
            Some(entry) => entry.1 = node,
            None => {
                self.marks.insert(key, (Arc::downgrade(prompt), node));
                if self.marks.len() > 2 * self.swept + 1024 {
                    self.marks.retain(|_, (weak, _)| weak.strong_count() > 0);
                    self.swept = self.marks.len();
                }
            }
        }
    }

    fn forget(&mut self, prompt: &Arc<Vec<Token>>) {
        if !self.marks.is_empty() {
            self.marks.remove(&(Arc::as_ptr(prompt) as usize));
        }
    }
}

impl RadixCore {
    /// [`RadixCore::probe`] of a waiting request's tokens, resumed from where its last
    /// refused probe got to; and where this one got to.
    pub(crate) fn probe_marked(&self, tokens: &TokenRef) -> (Probe, NodeId) {
        self.probe_resumed(tokens, self.marks.get(tokens.whole()))
    }

    /// The request of `tokens` was refused this step after a probe that got to
    /// `reached`: its next probe resumes there.
    pub(crate) fn mark(&mut self, tokens: &TokenRef, reached: NodeId) {
        self.marks.set(tokens.whole(), reached);
    }

    /// The request of `tokens` got what it asked for: it is probed no more.
    pub(crate) fn unmark(&mut self, tokens: &TokenRef) {
        self.marks.forget(tokens.whole());
    }
}
