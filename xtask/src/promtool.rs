//! `promtool` for the metrics test: Debian's `prometheus` package, downloaded with apt
//! and unpacked under `target/tools/prometheus` (the binary only; no service is
//! installed or started). The tests find it through `KVTIER_PROMTOOL`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run_command;

/// The unpacked `promtool`, fetched on first use.
pub fn prepare(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/tools/prometheus");
    let promtool = dir.join("usr/bin/promtool");
    if promtool.is_file() {
        return Ok(promtool);
    }
    let downloads = root.join("target/tools/downloads");
    std::fs::create_dir_all(&downloads).context("creating target/tools/downloads")?;
    let mut download = Command::new("apt-get");
    download
        .args(["download", "prometheus"])
        .current_dir(&downloads);
    run_command(&mut download).context("apt-get download prometheus")?;
    let deb = std::fs::read_dir(&downloads)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("prometheus_") && n.ends_with(".deb"))
        })
        .context("no prometheus .deb after apt-get download")?;
    let mut unpack = Command::new("dpkg-deb");
    unpack.arg("-x").arg(&deb).arg(&dir);
    run_command(&mut unpack).context("dpkg-deb -x prometheus")?;
    if !promtool.is_file() {
        bail!("{} is not in the prometheus package", promtool.display());
    }
    Ok(promtool)
}
