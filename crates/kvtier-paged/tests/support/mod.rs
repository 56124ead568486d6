//! A small prefix tree for the family's tests: nodes with a depth, a parent, an access
//! time and device locks, split the way the radix cache splits (the prefix node is new
//! and takes the suffix's access time; the suffix keeps its identity).

#![allow(dead_code)]

use kvtier_paged::{
    Adjunct, GroupPool, GroupRole, GroupSpec, PageTable, PagedFamily, RequestTables, Segment,
    Snapshot, SnapshotTree,
};
use kvtier_types::TreeView;

#[derive(Debug, Clone)]
struct TestNode {
    parent: Option<usize>,
    depth: u32,
    time: u64,
    refs: u32,
}

/// The tree.
#[derive(Debug)]
pub struct TestTree {
    nodes: Vec<TestNode>,
    /// Request tables the tree's owner keeps (the radix cache keeps running and
    /// stopped requests' tables).
    pub tables: Vec<RequestTables>,
}

impl Default for TestTree {
    fn default() -> Self {
        Self {
            nodes: vec![TestNode {
                parent: None,
                depth: 0,
                time: 0,
                refs: 0,
            }],
            tables: Vec::new(),
        }
    }
}

impl TestTree {
    /// A child of `parent` ending at `depth` tokens.
    pub fn insert(&mut self, parent: usize, depth: u32) -> usize {
        assert!(depth > self.nodes[parent].depth);
        self.nodes.push(TestNode {
            parent: Some(parent),
            depth,
            time: 0,
            refs: 0,
        });
        self.nodes.len() - 1
    }

    /// Locks (or unlocks) the device KV of `node` and its ancestors, as a running
    /// request's lock does.
    pub fn lock_path(&mut self, node: usize, delta: i32) {
        let mut cur = Some(node);
        while let Some(n) = cur {
            if n == 0 {
                break;
            }
            self.nodes[n].refs = (self.nodes[n].refs as i32 + delta) as u32;
            cur = self.nodes[n].parent;
        }
    }

    pub fn touch(&mut self, node: usize, time: u64) {
        self.nodes[node].time = time;
    }
}

impl TreeView for TestTree {
    type Node = usize;

    fn root(&self) -> usize {
        0
    }

    fn parent(&self, node: usize) -> Option<usize> {
        self.nodes[node].parent
    }

    fn depth(&self, node: usize) -> u32 {
        self.nodes[node].depth
    }

    fn device_refs(&self, node: usize) -> u32 {
        self.nodes[node].refs
    }

    fn age(&self, node: usize) -> (u64, u64) {
        (self.nodes[node].time, node as u64)
    }
}

impl SnapshotTree for TestTree {
    fn for_each_tables(&self, f: &mut dyn FnMut(&RequestTables)) {
        self.tables.iter().for_each(f);
    }

    fn split_at(&mut self, below: usize, depth: u32) -> Option<usize> {
        if depth == 0 || depth > self.nodes[below].depth {
            return None;
        }
        let mut n = below;
        while let Some(p) = self.nodes[n].parent {
            if self.nodes[p].depth < depth {
                break;
            }
            n = p;
        }
        if self.nodes[n].depth == depth {
            return Some(n);
        }
        let prefix = TestNode {
            parent: self.nodes[n].parent,
            depth,
            time: self.nodes[n].time,
            refs: self.nodes[n].refs,
        };
        self.nodes.push(prefix);
        let m = self.nodes.len() - 1;
        self.nodes[n].parent = Some(m);
        Some(m)
    }
}

/// The reference fixture's geometry (`paged_cache_test_fixture.h`): a full-history
/// group `fh` and a sliding state group `swa`, both required.
#[derive(Debug, Clone, Copy)]
pub struct Fixture {
    pub fh_rows: u32,
    pub fh_stride: u32,
    pub swa_rows: u32,
    pub window: u32,
    pub group_pages: u32,
}

/// `Large`: P 64, A 256, W 128.
pub const LARGE: Fixture = Fixture {
    fh_rows: 64,
    fh_stride: 4,
    swa_rows: 64,
    window: 128,
    group_pages: 32,
};

/// `Wide`: A 256, W 512.
pub const WIDE: Fixture = Fixture {
    window: 512,
    group_pages: 64,
    ..LARGE
};

/// `Small`: P 2, A 4, W 8.
pub const SMALL: Fixture = Fixture {
    fh_rows: 4,
    fh_stride: 1,
    swa_rows: 2,
    window: 8,
    group_pages: 16,
};

impl Fixture {
    pub fn groups(&self) -> Vec<GroupSpec> {
        vec![
            GroupSpec::full_history("fh", self.fh_rows, self.fh_stride, self.group_pages),
            GroupSpec::sliding(
                "swa",
                self.swa_rows,
                1,
                self.group_pages,
                self.window,
                GroupRole::State,
            ),
        ]
    }

    pub fn family(&self) -> PagedFamily<usize> {
        let adjunct = Adjunct::new(self.groups(), &["fh", "swa"]).expect("fixture adjunct");
        PagedFamily::new(adjunct, false)
    }
}

/// The fixture's `MakeCompleteSnapshot(len)`: a snapshot at `len` whose groups are
/// each built through a throwaway table acquired for `A` tokens and committed
/// (history) or checkpointed (state) there; the state segment's base is the
/// fixture's (`swa_base`: the reference's fixture stores 0 whatever the table says).
pub fn complete_snapshot(family: &mut PagedFamily<usize>, len: u32, swa_base: u32) -> Snapshot {
    let groups: Vec<GroupSpec> = family.adjunct().groups().to_vec();
    let a = family.adjunct().alignment();
    let mut snapshot = Snapshot::new(len, groups.len());
    for (i, g) in groups.iter().enumerate() {
        let pool: &mut GroupPool = family.pool(i);
        let mut t = PageTable::new();
        t.acquire(g, pool, a).expect("fixture pages");
        let segment = match g.role {
            GroupRole::History => t
                .commit_history(g, pool, a)
                .expect("commit")
                .expect("segment"),
            GroupRole::State => {
                let (seg, _) = t
                    .checkpoint_state(g, pool, a)
                    .expect("checkpoint")
                    .expect("segment");
                Segment {
                    base: swa_base,
                    ..seg
                }
            }
        };
        t.release_all(pool);
        snapshot.segments[i] = Some(segment);
    }
    snapshot
}

/// The fixture's `DowngradeSnapshotToHistoryOnly`: the state segment's pages freed.
pub fn downgrade_to_history_only(family: &mut PagedFamily<usize>, node: usize) {
    let mut snapshot = family.take_snapshot(node).expect("a snapshot");
    let swa = family.adjunct().index_of("swa").expect("swa");
    if let Some(seg) = snapshot.segments[swa].take() {
        family.pool(swa).free_ids(&seg.pages);
    }
    family.attach(node, snapshot);
}
