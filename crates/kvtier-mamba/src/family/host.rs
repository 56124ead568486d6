//! Host copies: write-backs, their acknowledgement, demotion and load-backs.

use std::fmt::Debug;

use kvtier_types::{TransferKind, TransferPair};

use super::*;
use crate::{Slot, SlotId};

impl<N: Copy + Ord + Debug> MambaFamily<N> {
    /// Evicts host states, oldest first by `(time, seq)`, until `need` host slots are
    /// free; none is evicted when that cannot succeed. States whose host KV is locked,
    /// and `protected`, stay.
    fn ensure_host<T: StateTree<Node = N>>(&mut self, tree: &T, need: u32) -> bool {
        if self.host.available() >= need {
            return true;
        }
        let mut victims: Vec<N> = self
            .attached
            .iter()
            .filter(|(n, a)| a.host.is_some() && !tree.host_locked(**n))
            .map(|(&n, _)| n)
            .collect();
        if self.host.available() + (victims.len() as u32) < need
            && !self.config.policy.evicts_without_a_fit()
        {
            return false;
        }
        victims.sort_by_key(|&n| (tree.age(n), n));
        for node in victims {
            if self.host.available() >= need {
                break;
            }
            if let Some(slot) = self.take_host(node) {
                self.host.release(slot);
                self.to_demote.remove(&node);
                self.stats.host_evicted += 1;
            }
        }
        self.host.available() >= need
    }

    /// The state half of a write-back of `nodes` (their KV is being copied to host):
    /// each node with a device state, no host state and none reserved gets a host slot,
    /// reserved — not attached — until the write-back is acknowledged. Returns the device
    /// → host copies and the nodes they are for: all of them, or none when the host pool
    /// cannot make room for all.
    pub fn prepare_write_back<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        nodes: &[N],
    ) -> (Vec<TransferPair>, Vec<N>) {
        if !self.config.host_copies() {
            return (Vec::new(), Vec::new());
        }
        let wanted: Vec<(N, SlotId, Option<u32>)> = nodes
            .iter()
            .filter_map(|&n| {
                let a = self.attached.get(&n)?;
                let device = a.device?;
                (a.host.is_none() && !self.pending.contains_key(&n)).then_some((
                    n,
                    device,
                    a.device_off,
                ))
            })
            .collect();
        if wanted.is_empty() || !self.ensure_host(tree, wanted.len() as u32) {
            return (Vec::new(), Vec::new());
        }
        let mut pairs = Vec::with_capacity(wanted.len());
        let mut filled = Vec::with_capacity(wanted.len());
        for (node, device, off) in wanted {
            let Some(host) = self.host.take() else {
                debug_assert!(false, "ensure_host made room");
                break;
            };
            self.pending.insert(
                node,
                PendingCopy {
                    host,
                    reads: device,
                    off,
                },
            );
            filled.push(node);
            pairs.push(TransferPair {
                kind: TransferKind::Mamba,
                src: device,
                dst: host,
            });
        }
        (pairs, filled)
    }

    /// A host slot for a state an L3 prefetch brings (evicting older host states if it
    /// must); `None` without host copies or room.
    pub fn allocate_host<T: StateTree<Node = N>>(&mut self, tree: &T) -> Option<Slot> {
        if !self.config.host_copies() || !self.ensure_host(tree, 1) {
            return None;
        }
        self.host.allocate()
    }

    /// Attaches a host state `slot` (filled by an L3 prefetch) to `node`; a node that
    /// already has a host state keeps it and the slot is freed. Returns whether it was
    /// attached.
    pub fn attach_host<T: StateTree<Node = N>>(&mut self, tree: &T, node: N, slot: Slot) -> bool {
        let occupied = self.host_slot(node).is_some() || self.pending.contains_key(&node);
        if node == tree.root() || occupied {
            self.host.free(slot);
            return false;
        }
        let id = self.host.adopt(slot);
        self.attached.entry(node).or_default().host = Some(id);
        true
    }

    /// A write-back of exactly `nodes`' states finished. On success each gets its host
    /// copy (never an ancestor: #620), and device copies that now have a host copy are
    /// demoted once nothing holds them; on failure the reserved host slots go back and
    /// nothing is demoted.
    pub fn write_back_done<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        nodes: &[N],
        success: bool,
    ) {
        for &node in nodes {
            if let Some(old) = self.retiring.remove(&node) {
                self.device.release(old);
            }
            let Some(PendingCopy {
                host: slot, off, ..
            }) = self.pending.remove(&node)
            else {
                continue;
            };
            if success {
                let a = self.attached.entry(node).or_default();
                a.host = Some(slot);
                a.host_off = off;
                self.stats.host_attached += 1;
                self.to_demote.insert(node);
            } else {
                self.host.release(slot);
            }
        }
        if success {
            self.demote_idle(tree);
        }
    }

    /// Demotes every device copy that has a host copy and no device lock; the others wait
    /// for the next try (each release of a request, each acknowledgement).
    pub fn demote_idle<T: StateTree<Node = N>>(&mut self, tree: &T) {
        let waiting: Vec<N> = self.to_demote.iter().copied().collect();
        for node in waiting {
            let Some(a) = self.attached.get(&node).copied() else {
                self.to_demote.remove(&node);
                continue;
            };
            if a.host.is_none() || a.device.is_none() {
                self.to_demote.remove(&node);
                continue;
            }
            if tree.device_locked(node) {
                continue;
            }
            self.to_demote.remove(&node);
            self.on_device_demoted(tree, node);
        }
    }

    /// Loads `node`'s host state back: a device slot attached at once, and the host →
    /// device copy. `None` (nothing changed) without a host state, with a device state
    /// already, or without a free device slot.
    pub fn load_back<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) -> Option<TransferPair> {
        let a = self.attached.get(&node)?;
        let host = a.host?;
        if a.device.is_some() {
            return None;
        }
        let dst = self.device.take()?;
        let a = self.attached.entry(node).or_default();
        a.device = Some(dst);
        a.device_off = a.host_off;
        self.track(tree, node);
        Some(TransferPair {
            kind: TransferKind::Mamba,
            src: host,
            dst,
        })
    }
}
