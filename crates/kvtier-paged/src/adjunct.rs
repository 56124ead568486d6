//! The prefix-cache adjunct: which groups a reusable prefix needs, where snapshots sit
//! (multiples of the alignment `A`), and what a snapshot holds (spec §2.3, §2.4).

use crate::{GroupRole, GroupSpec, PagedError, Segment};

/// The family's groups with the adjunct's choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjunct {
    groups: Vec<GroupSpec>,
    /// Indices of the required groups, in the order given (the first is read by
    /// commits).
    required: Vec<usize>,
    /// Indices of every state group: the groups a *terminal* hit continues from.
    continuation: Vec<usize>,
    alignment: u32,
}

/// A snapshot on a tree node at depth `prefix_len`: per group (by index), the segment it
/// owns, if it holds that group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Its depth in tokens (a multiple of `A`).
    pub prefix_len: u32,
    /// One slot per group of the adjunct.
    pub segments: Vec<Option<Segment>>,
}

impl Snapshot {
    /// An empty snapshot at `prefix_len` for `groups` groups.
    pub fn new(prefix_len: u32, groups: usize) -> Self {
        Self {
            prefix_len,
            segments: vec![None; groups],
        }
    }
}

/// What a snapshot is complete for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completeness {
    /// Every required history group is present.
    pub history: bool,
    /// Every required state group is present.
    pub state: bool,
    /// Every state group (the continuation set) is present.
    pub continuation: bool,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl Adjunct {
    /// Enables the adjunct over `groups` (any order; kept in id byte order) with the
    /// named required groups. Checks: valid groups with distinct ids, at least one
    /// required history group, every state group sliding, every required group's
    /// pages dividing the alignment `A` (the LCM of the required history groups' tokens
    /// per page).
    pub fn new(mut groups: Vec<GroupSpec>, required: &[&str]) -> Result<Self, PagedError> {
        for g in &groups {
            g.validate()
                .map_err(|e| PagedError::Config(e.to_string()))?;
        }
        groups.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(w) = groups.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(PagedError::Config(format!(
                "group `{}` is registered twice",
                w[0].id
            )));
        }
        let mut required_idx = Vec::with_capacity(required.len());
        for id in required {
            let i = groups
                .iter()
                .position(|g| g.id == *id)
                .ok_or_else(|| PagedError::UnknownGroup((*id).to_owned()))?;
            if required_idx.contains(&i) {
                return Err(PagedError::Config(format!(
                    "group `{id}` is required twice"
                )));
            }
            required_idx.push(i);
        }
        let history: Vec<usize> = required_idx
            .iter()
            .copied()
            .filter(|&i| groups[i].role == GroupRole::History)
            .collect();
        if history.is_empty() {
            return Err(PagedError::Config(
                "the adjunct needs at least one required history group".into(),
            ));
        }
        let mut alignment: u32 = 1;
        for &i in &history {
            let tpp = groups[i].tokens_per_page();
            alignment = alignment
                .checked_mul(tpp / gcd(alignment, tpp))
                .ok_or_else(|| PagedError::Config("the alignment overflows".into()))?;
        }
        for &i in &required_idx {
            let g = &groups[i];
            if !alignment.is_multiple_of(g.tokens_per_page()) {
                return Err(PagedError::Config(format!(
                    "required group `{}` has {} tokens a page, which does not divide the alignment {alignment}",
                    g.id,
                    g.tokens_per_page()
                )));
            }
        }
        let continuation = (0..groups.len())
            .filter(|&i| groups[i].role == GroupRole::State)
            .collect();
        Ok(Self {
            groups,
            required: required_idx,
            continuation,
            alignment,
        })
    }

    /// The groups, in id byte order.
    pub fn groups(&self) -> &[GroupSpec] {
        &self.groups
    }

    /// Index of a group by id.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.id == id)
    }

    /// The alignment `A`: snapshots sit at its multiples.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Required group indices, in the order given.
    pub fn required(&self) -> &[usize] {
        &self.required
    }

    /// Whether group `i` is required.
    pub fn is_required(&self, i: usize) -> bool {
        self.required.contains(&i)
    }

    /// State group indices (the continuation set).
    pub fn continuation(&self) -> &[usize] {
        &self.continuation
    }

    /// State groups that are not required: reusable only at a terminal hit.
    pub fn continuation_only(&self) -> impl Iterator<Item = usize> + '_ {
        self.continuation
            .iter()
            .copied()
            .filter(|&i| !self.is_required(i))
    }

    /// Required state groups.
    pub fn required_state(&self) -> impl Iterator<Item = usize> + '_ {
        self.required
            .iter()
            .copied()
            .filter(|&i| self.groups[i].role == GroupRole::State)
    }

    /// Required history groups.
    pub fn required_history(&self) -> impl Iterator<Item = usize> + '_ {
        self.required
            .iter()
            .copied()
            .filter(|&i| self.groups[i].role == GroupRole::History)
    }

    /// The widest window of a required state group (0 without any).
    pub fn max_required_window(&self) -> u32 {
        self.required_state()
            .filter_map(|i| self.groups[i].window())
            .max()
            .unwrap_or(0)
    }

    /// The widest window of a continuation group (0 without any): how far below a depth
    /// its state reaches.
    pub fn max_continuation_window(&self) -> u32 {
        self.continuation
            .iter()
            .filter_map(|&i| self.groups[i].window())
            .max()
            .unwrap_or(0)
    }

    /// Whether every group slides (a window model): a prefix's entries are then its
    /// last windows, which a first chunk can compute again from the tokens.
    pub fn slides_only(&self) -> bool {
        self.groups.iter().all(GroupSpec::is_sliding)
    }

    /// What `snapshot` is complete for. Each flag needs its set non-empty: without
    /// required state groups no snapshot is state-complete.
    pub fn completeness(&self, snapshot: &Snapshot) -> Completeness {
        let has = |i: &usize| snapshot.segments.get(*i).is_some_and(Option::is_some);
        let all_of = |set: &mut dyn Iterator<Item = usize>| {
            let mut any = false;
            for i in set {
                if !has(&i) {
                    return false;
                }
                any = true;
            }
            any
        };
        Completeness {
            history: all_of(&mut self.required_history()),
            state: all_of(&mut self.required_state()),
            continuation: all_of(&mut self.continuation.iter().copied()),
        }
    }

    /// Whether a required state group has a window so wide that its pages span more
    /// than one snapshot.
    pub fn has_required_state(&self) -> bool {
        self.required_state().next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(required: &[&str]) -> Result<Adjunct, PagedError> {
        Adjunct::new(
            vec![
                GroupSpec::sliding("v4.swa_kv", 64, 1, 113, 128, GroupRole::State),
                GroupSpec::sliding("v4.c4a.compressor_state", 4, 1, 1073, 8, GroupRole::State),
                GroupSpec::full_history("v4.c4a.compressed_kv", 64, 4, 177),
                GroupSpec::sliding(
                    "v4.c128a.compressor_state",
                    8,
                    1,
                    785,
                    128,
                    GroupRole::State,
                ),
                GroupSpec::full_history("v4.c128a.compressed_kv", 2, 128, 177),
                GroupSpec::sliding(
                    "v4.c4a.indexer_compressor_state",
                    4,
                    1,
                    1073,
                    8,
                    GroupRole::State,
                ),
            ],
            required,
        )
    }

    /// HYBRID-WORKLOADS H2: A = 256, every state group continuation-only.
    #[test]
    fn deepseek_v4_at_350() {
        let a = v4(&["v4.c4a.compressed_kv", "v4.c128a.compressed_kv"]).unwrap();
        assert_eq!(a.alignment(), 256);
        assert_eq!(a.continuation().len(), 4);
        assert_eq!(a.continuation_only().count(), 4);
        assert!(!a.has_required_state());
        assert_eq!(a.groups()[a.required()[0]].id, "v4.c4a.compressed_kv");
    }

    #[test]
    fn enablement_errors_name_the_problem() {
        let no_history = v4(&["v4.swa_kv"]).unwrap_err().to_string();
        assert!(no_history.contains("history"), "{no_history}");
        let unknown = v4(&["v4.nope"]).unwrap_err();
        assert_eq!(unknown, PagedError::UnknownGroup("v4.nope".into()));
        let twice = Adjunct::new(
            vec![
                GroupSpec::full_history("a", 4, 1, 8),
                GroupSpec::full_history("a", 4, 1, 8),
            ],
            &["a"],
        )
        .unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
        // A required state group whose pages do not divide A.
        let misaligned = Adjunct::new(
            vec![
                GroupSpec::full_history("h", 4, 1, 8),
                GroupSpec::sliding("s", 3, 1, 8, 6, GroupRole::State),
            ],
            &["h", "s"],
        )
        .unwrap_err();
        assert!(
            misaligned.to_string().contains("does not divide"),
            "{misaligned}"
        );
    }
}
