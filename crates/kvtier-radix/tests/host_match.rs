//! Port of the reference scheduler's `test_prefix_cache_host_match.cpp` (page size 2, a
//! 16-page host pool): after a device eviction, the host copy still matches and the
//! node is the load-back set (`NodesWithout<Device>`).

mod common;

use common::{assert_invariants, insert_fresh, new_cache};
use kvtier_types::Tier;

const PS: u32 = 2;
const TOKENS: [i32; 2] = [1, 2];

/// `HostCacheMatchAfterDeviceEvict` (device pool of 3 = 2 usable pages): the host copy
/// is added with `Insert<Host>`.
#[test]
fn host_cache_match_after_device_evict() {
    let mut cache = new_cache(PS, 3, 16);
    let dev = cache.allocate(Tier::Device, 1).expect("1 of 2 pages");
    assert_eq!(dev.len(), 1);
    assert_eq!(cache.available(Tier::Device), 1);
    cache
        .insert(Tier::Device, &TOKENS, 0, dev)
        .expect("device insert");

    let m = cache.match_prefix(&TOKENS);
    assert_eq!(m.device_pages, 1, "device hit after the device insert");
    assert_eq!(m.host_pages, 0, "no host hit yet");

    let host = cache.allocate(Tier::Host, 1).expect("1 host page");
    let res = cache
        .insert(Tier::Host, &TOKENS, 0, host)
        .expect("host insert");
    assert_eq!(res.inserted_pages, 1);

    let m = cache.match_prefix(&TOKENS);
    assert_eq!(m.device_pages, 1, "device still matches");
    assert_eq!(m.host_pages, 1, "host matches after the host insert");

    // Make room for 2 device pages: the node's device copy is evicted.
    assert!(cache.ensure_free(Tier::Device, 2));
    assert!(cache.available(Tier::Device) >= 2);

    let m = cache.match_prefix(&TOKENS);
    assert_eq!(m.device_pages, 0, "device copy evicted");
    assert_eq!(m.host_pages, 1, "host copy still matches");
    let load_back = cache.nodes_without(Tier::Device, m.host);
    assert_eq!(
        load_back,
        vec![m.host],
        "the host-only node is the load-back set"
    );
    assert_eq!(cache.stats().nodes, 1, "the host-only node is kept");
    assert_invariants(&mut cache);
}

/// `HostCacheMatchAfterDirectAttachResource` (device pool of 2 = 1 usable page): the
/// host copy is attached directly to the node found by `NodesWithout<Host>`, as the
/// write-back path does (`attach_for_write_back`, readable after a successful ack).
/// The reference then asks to free 2 device pages, which its 1-page pool can never
/// satisfy but which still evicts (non-transactional); ours asks for what the pool can
/// hold.
#[test]
fn host_cache_match_after_direct_attach_resource() {
    let mut cache = new_cache(PS, 2, 16);
    insert_fresh(&mut cache, Tier::Device, &TOKENS);

    let m = cache.match_prefix(&TOKENS);
    assert_eq!((m.device_pages, m.host_pages), (1, 0));

    let nodes = cache.nodes_without(Tier::Host, m.device);
    assert_eq!(nodes.len(), 1, "one node lacks a host copy");
    assert_eq!(nodes[0], m.device);
    let (ticket, pairs) = cache.attach_for_write_back(&nodes).expect("host room");
    assert_eq!(pairs.len(), 1);
    cache.write_back_done(ticket, true);
    assert!(cache.nodes_without(Tier::Host, m.device).is_empty());

    let m = cache.match_prefix(&TOKENS);
    assert_eq!(m.device_pages, 1);
    assert_eq!(m.host_pages, 1, "host matches after the direct attach");

    // 2 pages cannot be freed in a 1-page pool: a transactional miss evicts nothing.
    assert!(!cache.ensure_free(Tier::Device, 2));
    assert_eq!(cache.probe(&TOKENS).device_pages, 1);
    assert!(cache.ensure_free(Tier::Device, 1));

    let m = cache.match_prefix(&TOKENS);
    assert_eq!(m.device_pages, 0, "device evicted");
    assert_eq!(m.host_pages, 1, "host still matches");
    assert_eq!(cache.nodes_without(Tier::Device, m.host), vec![m.host]);
    assert_invariants(&mut cache);
}

/// A retracted request's recovery reads its locked path from the nodes
/// (`probe_path`, `match_path`) instead of matching its history token by token: the
/// answers must be the token match's, whatever tiers the path's nodes keep and
/// whatever is locked along it.
#[test]
fn a_locked_path_reads_like_a_token_match() {
    use common::{concat, insert_after_prefix, make_aligned_tokens};
    // 4 usable device pages, plenty of host.
    let mut cache = new_cache(PS, 5, 32);
    let x = make_aligned_tokens(2, PS, 1);
    let y = concat(&x, &make_aligned_tokens(2, PS, 100));
    let z = concat(&y, &make_aligned_tokens(2, PS, 200));
    insert_fresh(&mut cache, Tier::Host, &z);
    insert_fresh(&mut cache, Tier::Device, &x);
    insert_after_prefix(&mut cache, Tier::Device, &y, 2);
    // Three nodes: x (device + host), y's suffix (device + host), z's suffix (host).
    let end = cache.match_prefix(&z).host;
    let mid = cache.match_prefix(&y).device;
    assert_eq!(cache.depth_pages(end), 6);
    let probe = |cache: &kvtier_radix::RadixCore, node, tokens: &[i32]| {
        assert_eq!(cache.probe_path(node), cache.probe(tokens));
        cache.probe(tokens)
    };
    let p = probe(&cache, end, &z);
    assert_eq!(
        (p.device_pages, p.host_pages, p.device_unlocked_pages),
        (4, 6, 4)
    );
    // Locks along the path count as they do for the token match.
    let lock = cache.lock(mid, Tier::Device);
    let p = probe(&cache, end, &z);
    assert_eq!(p.device_unlocked_pages, 0);
    probe(&cache, mid, &y);
    cache.unlock(lock);
    // A device eviction under the path: the device prefix now ends higher up.
    assert!(cache.ensure_free(Tier::Device, 4));
    let p = probe(&cache, end, &z);
    assert_eq!((p.device_pages, p.host_pages), (0, 6));
    assert_eq!(cache.match_path(end), cache.match_prefix(&z));
    assert_eq!(cache.match_path(mid), cache.match_prefix(&y));
    assert_invariants(&mut cache);
}
