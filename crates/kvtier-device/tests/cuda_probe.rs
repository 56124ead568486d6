//! The CUDA backend (feature `cuda`), under its own harness so that a GPU test that cannot
//! run is reported as SKIPPED, never as passed.
//!
//! * Everywhere: `cuda::probe()` finds a device, or fails with the typed
//!   `DeviceError::NoCudaDevice` and a message naming the failed call
//!   (`no CUDA device: cudaGetDeviceCount returned …`); `CudaArenas::new` fails the same way.
//! * With a GPU: the CUDA arenas and the CPU arenas run the same operations on the same
//!   bytes (write-back, layer-wise load-back, device → device, zeroing, refused requests,
//!   seeded random batches), with both host-copy paths, and every item of both arenas must
//!   then be equal.
//!
//! Without a device the GPU tests print `SKIPPED: no CUDA device` and are counted as
//! skipped; `KVTIER_REQUIRE_CUDA=1` makes them fail instead (for GPU machines). The
//! closing line is `cuda_probe: N passed, N failed, N skipped`. Accepts libtest's
//! `--list` (for nextest, which then shows the GPU tests as skipped), `--exact` and name
//! filters.

use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Instant;

use kvtier_device::cuda::{self, CudaArenas, CudaDevice, HostCopy};
use kvtier_device::{DeviceError, KvArenas, KvGeometry};
use kvtier_types::{Tier, TransferKind, TransferPair};

struct Case {
    name: &'static str,
    /// Needs a CUDA device: skipped without one.
    gpu: bool,
    run: fn(),
}

const CASES: &[Case] = &[
    Case {
        name: "probe_finds_a_device_or_says_why_not",
        gpu: false,
        run: probe_finds_a_device_or_says_why_not,
    },
    Case {
        name: "arenas_without_a_device_are_a_typed_error",
        gpu: false,
        run: arenas_without_a_device_are_a_typed_error,
    },
    Case {
        name: "gpu_write_back_then_load_back_match_cpu",
        gpu: true,
        run: gpu_write_back_then_load_back_match_cpu,
    },
    Case {
        name: "gpu_layer_wise_load_back_matches_cpu",
        gpu: true,
        run: gpu_layer_wise_load_back_matches_cpu,
    },
    Case {
        name: "gpu_device_to_device_and_zeroing_match_cpu",
        gpu: true,
        run: gpu_device_to_device_and_zeroing_match_cpu,
    },
    Case {
        name: "gpu_items_of_4_byte_words_match_cpu",
        gpu: true,
        run: gpu_items_of_4_byte_words_match_cpu,
    },
    Case {
        name: "gpu_large_batches_match_cpu",
        gpu: true,
        run: gpu_large_batches_match_cpu,
    },
    Case {
        name: "gpu_random_batches_match_cpu",
        gpu: true,
        run: gpu_random_batches_match_cpu,
    },
    Case {
        name: "gpu_refused_requests_copy_nothing",
        gpu: true,
        run: gpu_refused_requests_copy_nothing,
    },
    Case {
        name: "gpu_arenas_move_across_threads",
        gpu: true,
        run: gpu_arenas_move_across_threads,
    },
    Case {
        name: "gpu_timed_copies_land_intact",
        gpu: true,
        run: gpu_timed_copies_land_intact,
    },
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let require = std::env::var("KVTIER_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    if flag("--list") {
        // libtest's terse listing, as nextest reads it. Without a device the GPU tests are
        // listed as ignored, so nextest reports them skipped rather than passed.
        let runnable = require || cuda::probe().is_ok();
        let ignored = flag("--ignored");
        for case in CASES {
            if (case.gpu && !runnable) == ignored {
                println!("{}: test", case.name);
            }
        }
        return ExitCode::SUCCESS;
    }
    let exact = flag("--exact");
    let filters: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let selected: Vec<&Case> = CASES
        .iter()
        .filter(|case| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if exact {
                        case.name == *f
                    } else {
                        case.name.contains(f)
                    }
                })
        })
        .collect();

    let probe = cuda::probe();
    match &probe {
        Ok(device) => println!("CUDA device: {}", describe(device)),
        Err(err) => println!("probe: {err}"),
    }
    println!("running {} tests", selected.len());
    let (mut passed, mut failed, mut skipped) = (0usize, Vec::new(), Vec::new());
    for case in selected {
        if case.gpu && probe.is_err() {
            if require {
                println!(
                    "test {} ... FAILED (KVTIER_REQUIRE_CUDA=1 and no CUDA device)",
                    case.name
                );
                failed.push(case.name);
            } else {
                println!("test {} ... SKIPPED: no CUDA device", case.name);
                skipped.push(case.name);
            }
            continue;
        }
        let started = Instant::now();
        match panic::catch_unwind(AssertUnwindSafe(case.run)) {
            Ok(()) => {
                println!(
                    "test {} ... ok ({:.2}s)",
                    case.name,
                    started.elapsed().as_secs_f64()
                );
                passed += 1;
            }
            Err(_) => {
                println!("test {} ... FAILED", case.name);
                failed.push(case.name);
            }
        }
    }
    println!();
    if !skipped.is_empty() {
        let reason = probe
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default();
        println!(
            "SKIPPED: no CUDA device: {} GPU tests did not run ({reason}): {}",
            skipped.len(),
            skipped.join(", ")
        );
    }
    if !failed.is_empty() {
        println!("FAILED: {}", failed.join(", "));
    }
    println!(
        "cuda_probe: {passed} passed, {} failed, {} skipped",
        failed.len(),
        skipped.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn describe(device: &CudaDevice) -> String {
    format!(
        "{} (ordinal {} of {}, sm_{}{}, {:.1} GiB, {} SMs, driver CUDA {}.{}, runtime CUDA {}.{})",
        device.name,
        device.ordinal,
        device.device_count,
        device.compute_capability.0,
        device.compute_capability.1,
        device.total_memory as f64 / f64::from(1u32 << 30),
        device.multiprocessors,
        device.driver_version / 1000,
        device.driver_version % 1000 / 10,
        device.runtime_version / 1000,
        device.runtime_version % 1000 / 10
    )
}

// ---------------------------------------------------------------------------------------
// Everywhere

fn probe_finds_a_device_or_says_why_not() {
    match cuda::probe() {
        Ok(device) => {
            assert!(!device.name.is_empty(), "a device has a name");
            assert!(device.total_memory > 0, "a device has memory");
            assert!(device.device_count >= 1);
            assert!(device.compute_capability.0 >= 1);
            assert!(device.runtime_version >= 12000, "{device:?}");
        }
        Err(err) => {
            let text = err.to_string();
            println!("    probe: {text}");
            let DeviceError::NoCudaDevice {
                call,
                code,
                name,
                message,
                runtime_version,
                ..
            } = &err
            else {
                panic!("without a device the probe must say NoCudaDevice, got {err:?}");
            };
            assert_eq!(call, "cudaGetDeviceCount");
            assert_ne!(*code, 0, "a failure has a non-zero cudaError_t");
            assert!(name.starts_with("cudaError"), "error name: {name}");
            assert!(!message.is_empty(), "the runtime's description is kept");
            assert!(
                *runtime_version >= 12000,
                "the linked runtime reports its version without a driver: {err:?}"
            );
            assert!(
                text.starts_with(&format!(
                    "no CUDA device: cudaGetDeviceCount returned {code} ({name}: "
                )),
                "message: {text}"
            );
            assert!(text.contains(message.as_str()), "message: {text}");
        }
    }
}

fn arenas_without_a_device_are_a_typed_error() {
    let bad = KvGeometry {
        layers: 0,
        ..geometry(1)
    };
    assert!(
        matches!(
            CudaArenas::new(bad, 4, 4),
            Err(DeviceError::InvalidGeometry(_))
        ),
        "the geometry is checked before any CUDA call"
    );
    match cuda::probe() {
        Ok(_) => {
            let arenas = CudaArenas::new(geometry(2), 4, 4).expect("arenas on a present device");
            assert_eq!(arenas.backend(), "cuda");
            assert_eq!(arenas.host_copy(), HostCopy::Kernel);
        }
        Err(expected) => {
            let err = CudaArenas::new(geometry(2), 4, 4).expect_err("no device, no arenas");
            assert_eq!(err, expected, "the same typed error as the probe");
        }
    }
}

// ---------------------------------------------------------------------------------------
// With a GPU: the same operations on the CPU and CUDA arenas give the same bytes.

const HOST_COPIES: [HostCopy; 2] = [HostCopy::Kernel, HostCopy::CopyEngine];

fn geometry(layers: u32) -> KvGeometry {
    KvGeometry {
        layers,
        planes: 2,
        heads: 2,
        head_dim: 4,
        dtype_bytes: 2,
        page_size: 4,
    }
}

/// A byte pattern unique to (tag, page, layer, plane, offset).
fn pattern(tag: u8, page: u32, layer: u32, plane: u32, i: usize) -> u8 {
    (u32::from(tag) * 131 + page * 31 + layer * 7 + plane * 3 + i as u32) as u8
}

/// The CPU arenas (the reference) and the CUDA arenas, with the same geometry and pools.
struct Twin {
    cpu: KvArenas,
    gpu: CudaArenas,
    device_pages: u32,
    host_pages: u32,
}

impl Twin {
    fn new(geometry: KvGeometry, device_pages: u32, host_pages: u32, host_copy: HostCopy) -> Self {
        Self {
            cpu: KvArenas::new(geometry, device_pages, host_pages, 2).expect("CPU arenas"),
            gpu: CudaArenas::with_host_copy(geometry, device_pages, host_pages, host_copy)
                .expect("CUDA arenas"),
            device_pages,
            host_pages,
        }
    }

    fn geometry(&self) -> KvGeometry {
        *self.cpu.geometry()
    }

    /// Writes the pattern for (`tag`, `page`) into every item of `page` on both.
    fn fill(&mut self, tier: Tier, tag: u8, page: u32) {
        let g = self.geometry();
        let len = g.item_bytes() as usize;
        for layer in 0..g.layers {
            for plane in 0..g.planes {
                let bytes: Vec<u8> = (0..len)
                    .map(|i| pattern(tag, page, layer, plane, i))
                    .collect();
                self.cpu
                    .item_mut(tier, page, layer, plane)
                    .expect("item in range")
                    .copy_from_slice(&bytes);
                self.gpu
                    .write_item(tier, page, layer, plane, &bytes)
                    .expect("write item");
            }
        }
    }

    /// Runs `op` on both; both must accept or refuse it alike.
    fn apply(&mut self, op: &Op) {
        let (cpu, gpu) = match op {
            Op::WriteBack(pairs) => (self.cpu.write_back(pairs), self.gpu.write_back(pairs)),
            Op::LoadBack(pairs, layers) => (
                self.cpu.load_back(pairs, layers.clone()),
                self.gpu.load_back(pairs, layers.clone()),
            ),
            Op::CopyDevice(pairs) => (self.cpu.copy_device(pairs), self.gpu.copy_device(pairs)),
            Op::Zero(pages) => (self.cpu.zero_device(pages), self.gpu.zero_device(pages)),
        };
        assert_eq!(cpu, gpu, "CPU and CUDA answer {op:?} alike");
    }

    /// Every item of every page (but the reserved page 0) of both arenas is equal.
    fn assert_same(&mut self, what: &str) {
        let g = self.geometry();
        for (tier, pages) in [
            (Tier::Device, self.device_pages),
            (Tier::Host, self.host_pages),
        ] {
            for page in 1..pages {
                for layer in 0..g.layers {
                    for plane in 0..g.planes {
                        let want = self
                            .cpu
                            .item_mut(tier, page, layer, plane)
                            .expect("item in range")
                            .to_vec();
                        let got = self
                            .gpu
                            .read_item(tier, page, layer, plane)
                            .expect("read item");
                        assert!(
                            want == got,
                            "{what}: {tier:?} page {page} layer {layer} plane {plane} differs \
                             (CPU {:?}.., CUDA {:?}..)",
                            &want[..want.len().min(8)],
                            &got[..got.len().min(8)]
                        );
                    }
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    WriteBack(Vec<TransferPair>),
    LoadBack(Vec<TransferPair>, Range<u32>),
    CopyDevice(Vec<TransferPair>),
    Zero(Vec<u32>),
}

fn kv(pairs: &[(u32, u32)]) -> Vec<TransferPair> {
    pairs.iter().map(|&(s, d)| TransferPair::kv(s, d)).collect()
}

fn gpu_write_back_then_load_back_match_cpu() {
    for host_copy in HOST_COPIES {
        let mut t = Twin::new(geometry(3), 8, 8, host_copy);
        for page in [1, 2, 3] {
            t.fill(Tier::Device, 1, page);
        }
        t.apply(&Op::WriteBack(kv(&[(1, 5), (2, 6), (3, 7)])));
        t.assert_same(&format!("{host_copy:?}: after write-back"));
        t.apply(&Op::Zero(vec![1, 2, 3]));
        t.assert_same(&format!("{host_copy:?}: after zeroing"));
        t.apply(&Op::LoadBack(kv(&[(6, 4), (5, 1)]), 0..3));
        t.assert_same(&format!("{host_copy:?}: after load-back"));
    }
}

fn gpu_layer_wise_load_back_matches_cpu() {
    for host_copy in HOST_COPIES {
        let mut t = Twin::new(geometry(4), 8, 8, host_copy);
        t.fill(Tier::Host, 2, 3);
        t.fill(Tier::Host, 2, 4);
        let pairs = kv(&[(3, 1), (4, 6)]);
        for layers in [0..1, 1..3, 3..4] {
            t.apply(&Op::LoadBack(pairs.clone(), layers.clone()));
            t.assert_same(&format!("{host_copy:?}: after loading layers {layers:?}"));
        }
        t.apply(&Op::LoadBack(pairs, 2..2));
        t.assert_same(&format!("{host_copy:?}: after an empty layer range"));
    }
}

fn gpu_device_to_device_and_zeroing_match_cpu() {
    for host_copy in HOST_COPIES {
        let mut t = Twin::new(geometry(2), 8, 2, host_copy);
        t.fill(Tier::Device, 3, 7);
        t.fill(Tier::Device, 3, 5);
        t.apply(&Op::CopyDevice(kv(&[(7, 2), (5, 3)])));
        t.assert_same(&format!("{host_copy:?}: after device copy"));
        t.apply(&Op::Zero(vec![7]));
        t.assert_same(&format!("{host_copy:?}: after zeroing"));
        t.apply(&Op::CopyDevice(Vec::new()));
        t.apply(&Op::Zero(Vec::new()));
        t.assert_same(&format!("{host_copy:?}: after empty batches"));
    }
}

fn gpu_items_of_4_byte_words_match_cpu() {
    // Items of 12 and 20 bytes: whole 4-byte words, not 16-byte vectors.
    for (head_dim, planes) in [(3, 1), (5, 2)] {
        let g = KvGeometry {
            layers: 3,
            planes,
            heads: 1,
            head_dim,
            dtype_bytes: 2,
            page_size: 2,
        };
        assert_ne!(g.item_bytes() % 16, 0);
        for host_copy in HOST_COPIES {
            let mut t = Twin::new(g, 6, 6, host_copy);
            for page in 1..6 {
                t.fill(Tier::Device, 7, page);
            }
            t.apply(&Op::WriteBack(kv(&[(1, 5), (2, 4), (3, 3)])));
            t.apply(&Op::CopyDevice(kv(&[(4, 1)])));
            t.apply(&Op::Zero(vec![2, 5]));
            t.apply(&Op::LoadBack(kv(&[(5, 2), (4, 5)]), 1..3));
            t.assert_same(&format!("item {} bytes, {host_copy:?}", g.item_bytes()));
        }
    }
}

fn gpu_large_batches_match_cpu() {
    // 64 KiB pages, 256 pairs: 16 MiB per batch, as in the CPU backend's tests.
    let g = KvGeometry {
        layers: 8,
        planes: 2,
        heads: 8,
        head_dim: 128,
        dtype_bytes: 2,
        page_size: 2,
    };
    for host_copy in HOST_COPIES {
        let mut t = Twin::new(g, 300, 300, host_copy);
        for p in 1..=256 {
            t.fill(Tier::Device, 4, p);
        }
        let pairs: Vec<TransferPair> = (1..=256).map(|p| TransferPair::kv(p, 300 - p)).collect();
        t.apply(&Op::WriteBack(pairs.clone()));
        t.apply(&Op::Zero((1..=256).collect()));
        let back: Vec<TransferPair> = pairs
            .iter()
            .map(|p| TransferPair::kv(p.dst, p.src))
            .collect();
        t.apply(&Op::LoadBack(back, 0..8));
        t.assert_same(&format!("{host_copy:?}: 256-page round trip"));
    }
}

/// A small deterministic generator (64-bit LCG, high bits out).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    fn below(&mut self, n: u32) -> u32 {
        self.next() % n.max(1)
    }

    /// `count` distinct pages of `1..pages`, in random order.
    fn pages(&mut self, pages: u32, count: usize) -> Vec<u32> {
        let mut all: Vec<u32> = (1..pages).collect();
        for i in (1..all.len()).rev() {
            let j = self.below(i as u32 + 1) as usize;
            all.swap(i, j);
        }
        all.truncate(count);
        all
    }
}

fn gpu_random_batches_match_cpu() {
    let geometries = [
        geometry(5),
        KvGeometry {
            layers: 4,
            planes: 1,
            heads: 1,
            head_dim: 3,
            dtype_bytes: 2,
            page_size: 2,
        },
    ];
    for g in geometries {
        for host_copy in HOST_COPIES {
            let (device_pages, host_pages) = (24, 32);
            let mut t = Twin::new(g, device_pages, host_pages, host_copy);
            let mut rng = Lcg(0x6b76_7469_6572 ^ g.item_bytes());
            for page in 1..device_pages {
                t.fill(Tier::Device, 10, page);
            }
            for step in 0..60u32 {
                let n = 1 + rng.below(8) as usize;
                let op = match rng.below(5) {
                    0 => {
                        // Fresh bytes in a few device pages.
                        for page in rng.pages(device_pages, 2) {
                            t.fill(Tier::Device, (step % 200) as u8, page);
                        }
                        continue;
                    }
                    1 => {
                        let src = rng.pages(device_pages, n);
                        let dst = rng.pages(host_pages, n);
                        Op::WriteBack(
                            src.into_iter()
                                .zip(dst)
                                .map(|(s, d)| TransferPair::kv(s, d))
                                .collect(),
                        )
                    }
                    2 => {
                        let src = rng.pages(host_pages, n);
                        let dst = rng.pages(device_pages, n);
                        let first = rng.below(g.layers);
                        let end = first + 1 + rng.below(g.layers - first);
                        Op::LoadBack(
                            src.into_iter()
                                .zip(dst)
                                .map(|(s, d)| TransferPair::kv(s, d))
                                .collect(),
                            first..end,
                        )
                    }
                    3 => {
                        // Sources and destinations disjoint: no order inside a batch.
                        let both = rng.pages(device_pages, 2 * n);
                        let (src, dst) = both.split_at(both.len() / 2);
                        Op::CopyDevice(
                            src.iter()
                                .zip(dst)
                                .map(|(&s, &d)| TransferPair::kv(s, d))
                                .collect(),
                        )
                    }
                    _ => Op::Zero(rng.pages(device_pages, n)),
                };
                t.apply(&op);
            }
            t.assert_same(&format!(
                "item {} bytes, {host_copy:?}: after 60 random steps",
                g.item_bytes()
            ));
        }
    }
}

fn gpu_refused_requests_copy_nothing() {
    for host_copy in HOST_COPIES {
        let mut t = Twin::new(geometry(2), 4, 4, host_copy);
        t.fill(Tier::Device, 5, 1);
        let ops = [
            Op::WriteBack(kv(&[(1, 2), (1, 4)])),
            Op::WriteBack(kv(&[(1, 2), (0, 3)])),
            Op::LoadBack(kv(&[(2, 1)]), 1..3),
            Op::CopyDevice(vec![TransferPair {
                kind: TransferKind::Mamba,
                src: 1,
                dst: 2,
            }]),
            Op::Zero(vec![1, 9]),
        ];
        for op in &ops {
            assert!(run_on_gpu(&mut t.gpu, op).is_err(), "{op:?} accepted");
            t.apply(op);
        }
        t.assert_same(&format!("{host_copy:?}: after refused requests"));
        assert!(matches!(
            t.gpu.read_item(Tier::Host, 4, 0, 0),
            Err(DeviceError::PageOutOfRange {
                tier: Tier::Host,
                page: 4,
                pages: 4
            })
        ));
        assert!(
            t.gpu.read_item(Tier::Device, 1, 0, 2).is_err(),
            "plane out of range"
        );
        assert!(
            t.gpu.write_item(Tier::Device, 1, 0, 0, &[0u8; 3]).is_err(),
            "wrong item length"
        );
    }
}

/// Runs `op` on the CUDA arenas alone (for requests that must be refused).
fn run_on_gpu(gpu: &mut CudaArenas, op: &Op) -> Result<(), DeviceError> {
    match op {
        Op::WriteBack(pairs) => gpu.write_back(pairs),
        Op::LoadBack(pairs, layers) => gpu.load_back(pairs, layers.clone()),
        Op::CopyDevice(pairs) => gpu.copy_device(pairs),
        Op::Zero(pages) => gpu.zero_device(pages),
    }
}

fn gpu_arenas_move_across_threads() {
    let mut t = Twin::new(geometry(1), 4, 4, HostCopy::Kernel);
    t.fill(Tier::Device, 6, 1);
    let mut t = std::thread::spawn(move || {
        t.apply(&Op::WriteBack(kv(&[(1, 1)])));
        t
    })
    .join()
    .expect("the thread finished");
    t.assert_same("after a write-back on another thread");
}

fn gpu_timed_copies_land_intact() {
    // Llama-3-8B-class pages: 32 layers x K/V x 8 heads x 128 x bf16 x 16 tokens = 2 MiB.
    let g = KvGeometry {
        layers: 32,
        planes: 2,
        heads: 8,
        head_dim: 128,
        dtype_bytes: 2,
        page_size: 16,
    };
    let pages = 128u32;
    let bytes = g.page_bytes() as f64 * f64::from(pages);
    let pairs: Vec<TransferPair> = (1..=pages).map(|p| TransferPair::kv(p, p)).collect();
    // Device copies from the first half of the pages to the second.
    let half: Vec<TransferPair> = (1..=pages / 2)
        .map(|p| TransferPair::kv(p, p + pages / 2))
        .collect();
    // Pages of the first half whose bytes are followed through the timed copies.
    let followed = [1, 17, pages / 2];
    let item = |page: u32, layer: u32, plane: u32| -> Vec<u8> {
        (0..g.item_bytes() as usize)
            .map(|i| pattern(5, page, layer, plane, i))
            .collect()
    };
    for host_copy in HOST_COPIES {
        let mut a =
            CudaArenas::with_host_copy(g, pages + 1, pages + 1, host_copy).expect("CUDA arenas");
        for &page in &followed {
            for layer in 0..g.layers {
                for plane in 0..g.planes {
                    a.write_item(Tier::Device, page, layer, plane, &item(page, layer, plane))
                        .expect("write item");
                }
            }
        }
        let mut best = [f64::MAX; 3];
        for _ in 0..5 {
            let t = Instant::now();
            a.write_back(&pairs).expect("write-back");
            best[0] = best[0].min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            a.load_back(&pairs, 0..g.layers).expect("load-back");
            best[1] = best[1].min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            a.copy_device(&half).expect("device copy");
            best[2] = best[2].min(t.elapsed().as_secs_f64());
        }
        println!(
            "    {host_copy:?}: {pages} pages of {} KiB: write-back {:.1} GB/s, load-back {:.1} GB/s, \
             device copy {:.1} GB/s",
            g.page_bytes() >> 10,
            bytes / best[0] / 1e9,
            bytes / best[1] / 1e9,
            bytes / 2.0 / best[2] / 1e9
        );
        assert!(best.iter().all(|s| s.is_finite() && *s > 0.0), "{best:?}");
        // Every round wrote the device back, loaded it again and copied the first half
        // onto the second: a followed page's bytes are on host under both its ids, and
        // on device in the second half.
        for &page in &followed {
            for layer in 0..g.layers {
                for plane in 0..g.planes {
                    let want = item(page, layer, plane);
                    for (tier, at) in [
                        (Tier::Host, page),
                        (Tier::Host, page + pages / 2),
                        (Tier::Device, page + pages / 2),
                    ] {
                        let got = a.read_item(tier, at, layer, plane).expect("read item");
                        assert!(
                            got == want,
                            "{host_copy:?}: {tier:?} page {at} layer {layer} plane {plane} lost \
                             page {page}'s bytes"
                        );
                    }
                }
            }
        }
    }
}
