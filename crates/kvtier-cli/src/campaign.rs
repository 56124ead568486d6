//! `kvtier campaign`: the seeded campaign (docs/campaign.md).

use std::time::Instant;

use anyhow::{Result, bail};
use kvtier_sim::campaign::{CampaignOptions, run_campaign};

use crate::{CampaignArgs, report};

/// `kvtier campaign`: runs the seeds, prints the coverage table and every failure with
/// its shrunk reproduction; fails if any seed did.
pub fn run(args: CampaignArgs) -> Result<()> {
    if args.seeds == 0 {
        bail!("--seeds must be positive");
    }
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let options = CampaignOptions {
        from: args.from,
        seeds: args.seeds,
        jobs: jobs.max(1),
        shrink_budget: args.shrink_budget,
    };
    let bar = indicatif::ProgressBar::new(args.seeds).with_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} seeds ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message("campaign");
    let started = Instant::now();
    let campaign = run_campaign(&options, |done, failed| {
        bar.set_position(done);
        if failed > 0 {
            bar.set_message(format!("campaign, {failed} failed"));
        }
    });
    bar.finish_and_clear();
    let wall_s = started.elapsed().as_secs_f64();
    report::campaign(&campaign, jobs, wall_s);
    if args.json {
        println!("{}", report::campaign_json(&campaign, jobs, wall_s)?);
    }
    let bad = campaign.failures.len() + campaign.errors.len();
    if bad > 0 {
        bail!("{bad} of {} seeds failed", campaign.seeds);
    }
    Ok(())
}
