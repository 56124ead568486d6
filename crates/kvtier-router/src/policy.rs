//! Where a request goes: round-robin, the least-loaded instance, or the one with the
//! longest cached prefix of its prompt (ties and overload broken by load), the way
//! Dynamo's and llm-d's KV routers place requests.

use kvtier_types::{Token, hash::block_hash};

use crate::RouterError;
use crate::index::KvIndex;

/// A routing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// Instances in turn.
    RoundRobin,
    /// The instance with the fewest requests outstanding.
    LeastLoaded,
    /// The instance holding the longest prefix of the prompt on any tier, among those
    /// not more than `max_imbalance` requests busier than the least loaded; then the
    /// less loaded.
    Prefix,
}

impl Policy {
    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastLoaded => "least-loaded",
            Policy::Prefix => "prefix",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = RouterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "round-robin" => Ok(Policy::RoundRobin),
            "least-loaded" => Ok(Policy::LeastLoaded),
            "prefix" => Ok(Policy::Prefix),
            other => Err(RouterError::Policy(other.to_owned())),
        }
    }
}

/// Where one request went, and how much of its prompt the router believed cached there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub worker: usize,
    /// Blocks of the prompt the index showed on that instance.
    pub predicted_blocks: u32,
}

/// A router over an index.
#[derive(Debug)]
pub struct Router {
    policy: Policy,
    index: KvIndex,
    page_size: usize,
    shared_disk: bool,
    max_imbalance: u64,
    next: usize,
}

impl Router {
    /// A router over `workers` instances whose pages hold `page_size` tokens.
    /// `shared_disk`: they share one L3 store, so a block on `DISK` is every instance's.
    pub fn new(
        policy: Policy,
        workers: usize,
        page_size: usize,
        shared_disk: bool,
    ) -> Result<Self, RouterError> {
        if page_size == 0 {
            return Err(RouterError::PageSize);
        }
        Ok(Self {
            policy,
            index: KvIndex::new(workers)?,
            page_size,
            shared_disk,
            max_imbalance: 64,
            next: 0,
        })
    }

    /// How many requests busier than the least-loaded instance `Prefix` still sends
    /// work to (64 by default: a production batch).
    pub fn with_max_imbalance(mut self, requests: u64) -> Self {
        self.max_imbalance = requests;
        self
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn index(&self) -> &KvIndex {
        &self.index
    }

    pub fn index_mut(&mut self) -> &mut KvIndex {
        &mut self.index
    }

    /// The prompt's block hashes as the instances publish them: whole pages, each hash
    /// chained to the one before.
    pub fn block_hashes(&self, prompt: &[Token]) -> Vec<u64> {
        let mut parent = None;
        prompt
            .chunks_exact(self.page_size)
            .map(|page| {
                let h = block_hash(parent, page);
                parent = Some(h);
                h
            })
            .collect()
    }

    /// Places a request with `prompt`; `loads[w]` is instance `w`'s outstanding
    /// requests.
    pub fn route(&mut self, prompt: &[Token], loads: &[u64]) -> Result<Decision, RouterError> {
        let workers = self.index.workers();
        if loads.len() != workers {
            return Err(RouterError::Loads {
                got: loads.len(),
                workers,
            });
        }
        let matched = self
            .index
            .matched_blocks(&self.block_hashes(prompt), self.shared_disk);
        // Ties go round: the instance after the last one chosen comes first, so equally
        // loaded instances (an idle cluster) share the work.
        let turn = |w: usize| (w + workers - self.next % workers) % workers;
        let worker = match self.policy {
            Policy::RoundRobin => self.next % workers,
            Policy::LeastLoaded => (0..workers)
                .min_by_key(|&w| (loads[w], turn(w)))
                .unwrap_or(0),
            Policy::Prefix => {
                let floor = loads.iter().copied().min().unwrap_or(0);
                let cap = floor.saturating_add(self.max_imbalance);
                (0..workers)
                    .filter(|&w| loads[w] <= cap)
                    .max_by_key(|&w| (matched[w], std::cmp::Reverse((loads[w], turn(w)))))
                    .unwrap_or(0)
            }
        };
        self.next = worker + 1;
        Ok(Decision {
            worker,
            predicted_blocks: matched[worker],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Event, Medium};

    fn router(policy: Policy) -> Router {
        Router::new(policy, 3, 2, false).unwrap()
    }

    #[test]
    fn prefix_picks_the_longest_cached_prefix_then_the_least_loaded() {
        let mut r = router(Policy::Prefix);
        let prompt = [1, 2, 3, 4, 5];
        let hashes = r.block_hashes(&prompt);
        assert_eq!(hashes.len(), 2, "whole pages only");
        r.index_mut().apply(
            1,
            &Event::Stored {
                hashes: hashes[..1].to_vec(),
                medium: Medium::Cpu,
            },
        );
        r.index_mut().apply(
            2,
            &Event::Stored {
                hashes: hashes.clone(),
                medium: Medium::Gpu,
            },
        );
        let d = r.route(&prompt, &[0, 0, 5]).unwrap();
        assert_eq!((d.worker, d.predicted_blocks), (2, 2));
        // Nothing cached anywhere: the least loaded; on a tie, the one after the last
        // chosen (2).
        let d = r.route(&[9, 9, 9], &[3, 1, 1]).unwrap();
        assert_eq!((d.worker, d.predicted_blocks), (1, 0));
        assert_eq!(r.route(&[9, 9, 9], &[1, 1, 1]).unwrap().worker, 2);
        // Too busy next to the others: the next best.
        let mut r = r.with_max_imbalance(4);
        assert_eq!(r.route(&prompt, &[0, 0, 5]).unwrap().worker, 1);
    }

    #[test]
    fn round_robin_and_least_loaded_ignore_the_cache() {
        let mut r = router(Policy::RoundRobin);
        let picks: Vec<usize> = (0..4)
            .map(|_| r.route(&[1, 2], &[9, 0, 0]).unwrap().worker)
            .collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        let mut r = router(Policy::LeastLoaded);
        assert_eq!(r.route(&[1, 2], &[2, 1, 1]).unwrap().worker, 1);
        let idle: Vec<usize> = (0..3)
            .map(|_| r.route(&[1, 2], &[0, 0, 0]).unwrap().worker)
            .collect();
        assert_eq!(idle, [2, 0, 1], "an idle cluster shares the work");
        assert!(r.route(&[1, 2], &[0, 0]).is_err(), "one load per instance");
        assert!("nearest".parse::<Policy>().is_err());
    }
}
