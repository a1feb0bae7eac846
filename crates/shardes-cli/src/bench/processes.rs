//! `shardes bench` under `mpirun` (or with `--phases` on one process): a generation of a run
//! across processes, split into its phases on every process — local evaluation (`ask +
//! apply` of the process's own members), the wait for the slowest process (a barrier
//! before each collective, timed apart), the fitness gather, the update exchange (the
//! partial sums across processes, `how_hosts = B`) and the rest (`tell` or the partial sum
//! and the update on the devices, with their host transfers) — and the bytes each process
//! sends per generation. Process 0 prints the table; the slowest process's median
//! generation is shown beside it.

use anyhow::{Context, Result};
use serde::Serialize;
use shardes::bench::Stats;
use shardes::population::Phases;
use shardes::population::{CompileWhen, Place, Start};
use shardes::SplitTrainer;

use super::{parse_how, print_report, BenchArgs};
use crate::config::Config;
use crate::run::processes::Group;

/// One placement across processes, measured.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    /// `A` or `B`.
    pub how_hosts: String,
    /// The generation on this process (process 0), ms.
    pub generation_ms: Stats,
    /// The mean generation (the timed rounds' wall time over their count), ms: the same on
    /// every process, which run in lockstep.
    pub mean_generation_ms: f64,
    /// Waiting for the slowest process before the collectives, ms.
    pub wait_ms: Stats,
    /// The slowest process's median generation, ms.
    pub slowest_generation_ms: f64,
    /// Local evaluation, ms.
    pub evaluate_ms: Stats,
    /// Fitness gather, ms.
    pub gather_ms: Stats,
    /// Update exchange, ms.
    pub exchange_ms: Stats,
    /// The rest, ms.
    pub rest_ms: Stats,
    /// Bytes process 0 sends per generation for the fitness gather.
    pub gather_bytes: usize,
    /// Bytes process 0 sends per generation for the update exchange.
    pub exchange_bytes: usize,
    /// Emission and compile of this process's programs, ms.
    pub build_ms: f64,
}

/// The report of `shardes bench` across processes.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessesReport {
    /// Processes.
    pub processes: usize,
    /// Devices per process.
    pub devices: usize,
    /// Population size.
    pub n: usize,
    /// Strategy name.
    pub strategy: String,
    /// Placement inside a process.
    pub how: String,
    /// Timed rounds.
    pub rounds: usize,
    /// One entry per placement across processes.
    pub variants: Vec<PhaseReport>,
}

/// Runs the phase benchmark of `config` on this process of `group` (every process runs
/// it; process 0 prints).
pub fn run(args: &BenchArgs, config: &Config, mut group: Group) -> Result<()> {
    group.agree_config(config)?;
    group.check_split(config)?;
    let hosts = match &args.how_hosts {
        Some(h) => parse_how(h)?,
        None => vec![config.es.hosts_how()],
    };
    let s = group.setup(config)?;
    let p = &s.problem;
    let mut trainers = Vec::with_capacity(hosts.len());
    for &h in &hosts {
        let t = SplitTrainer::placed(
            &s.client,
            &s.es,
            &*p.model,
            &p.params,
            Start {
                key: p.key,
                batch: &p.batch,
                generation: 0,
            },
            Place::Group(group.dist()?, h),
            CompileWhen::Now,
        )
        .with_context(|| format!("building the programs for how_hosts {h}"))?
        .with_barriers(true);
        trainers.push(t);
    }
    let mut samples: Vec<Vec<(f64, Phases)>> = vec![Vec::new(); trainers.len()];
    for round in 0..args.warmup + args.generations {
        for (t, out) in trainers.iter_mut().zip(&mut samples) {
            let t0 = std::time::Instant::now();
            t.step_in(group.dist()?)?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            if round >= args.warmup {
                out.push((ms, t.phases()));
            }
        }
    }
    let mut variants = Vec::with_capacity(trainers.len());
    for ((h, t), s) in hosts.iter().zip(&trainers).zip(&samples) {
        let stats =
            |f: &dyn Fn(&(f64, Phases)) -> f64| Stats::of(&s.iter().map(f).collect::<Vec<f64>>());
        let generation_ms = stats(&|x| x.0);
        let mean_generation_ms = s.iter().map(|x| x.0).sum::<f64>() / s.len().max(1) as f64;
        let slowest = group
            .dist()?
            .gather_fitness(&[generation_ms.median as f32])?
            .into_iter()
            .fold(0f32, f32::max);
        let last = s.last().map(|x| x.1).unwrap_or_default();
        let bt = t.build_times();
        variants.push(PhaseReport {
            how_hosts: h.to_string(),
            generation_ms,
            slowest_generation_ms: f64::from(slowest),
            mean_generation_ms,
            wait_ms: stats(&|x| x.1.wait_ms),
            evaluate_ms: stats(&|x| x.1.evaluate_ms),
            gather_ms: stats(&|x| x.1.gather_ms),
            exchange_ms: stats(&|x| x.1.exchange_ms),
            rest_ms: stats(&|x| x.1.rest_ms),
            gather_bytes: last.gather_bytes,
            exchange_bytes: last.exchange_bytes,
            build_ms: bt.emit_ms + bt.compile_ms,
        });
    }
    let report = ProcessesReport {
        processes: group.size(),
        devices: config.devices,
        n: config.es.n,
        strategy: config.es.strategy.to_string(),
        how: config.es.how.to_string(),
        rounds: args.generations,
        variants,
    };
    if group.is_lead() {
        print_report(args, &table(&report), &report)?;
    }
    group.finish();
    Ok(())
}

/// The report as a table.
fn table(r: &ProcessesReport) -> String {
    let mut s = format!(
        "{} n={} processes={} × devices={} how={} rounds={}\n",
        r.strategy, r.n, r.processes, r.devices, r.how, r.rounds
    );
    s.push_str(&format!(
        "{:<28}{:>12}{:>18}\n",
        "", "ms (median)", "min..max"
    ));
    let row = |s: &mut String, name: &str, st: &Stats| {
        s.push_str(&format!(
            "  {name:<26}{:>12.2}{:>18}\n",
            st.median,
            format!("{:.2}..{:.2}", st.min, st.max)
        ));
    };
    for v in &r.variants {
        s.push_str(&format!("how_hosts {}\n", v.how_hosts));
        row(&mut s, "generation", &v.generation_ms);
        s.push_str(&format!(
            "  {:<26}{:>12.2}\n",
            "generation (mean)", v.mean_generation_ms
        ));
        row(&mut s, "local evaluation", &v.evaluate_ms);
        row(&mut s, "waiting for the slowest", &v.wait_ms);
        row(&mut s, "fitness gather", &v.gather_ms);
        row(&mut s, "update exchange", &v.exchange_ms);
        row(&mut s, "rest (tell, transfers)", &v.rest_ms);
        s.push_str(&format!(
            "  {:<26}{:>12.2}\n",
            "slowest process generation", v.slowest_generation_ms
        ));
        s.push_str(&format!(
            "  bytes sent per generation: fitness {} B, update {} B; build {:.0} ms\n",
            v.gather_bytes, v.exchange_bytes, v.build_ms
        ));
    }
    s
}

/// Whether `shardes bench` measures the phases: under `mpirun`, or asked with `--phases`.
pub fn wanted(args: &BenchArgs, group: &Group) -> bool {
    args.phases || group.size() > 1
}
