//! `shardes estimate`: how good each strategy's gradient estimate is, against the true
//! gradient (`shardes::estimate`).
//!
//! For every strategy (the config's, under each coupling it takes, or `--strategies`) and
//! every population size `--n`, it draws `--repeats` independent estimates at the problem's
//! initial parameters (generations `0 .. K − 1`, lr 1, shaping `--shaping`, default
//! `none`) and prints the mean cosine to the reference gradient, the relative bias with its
//! standard error, the relative variance and the relative MSE (definitions in
//! `shardes::estimate::metrics`). The reference is the analytic gradient for `quadratic`
//! and otherwise central differences `(f(θ + h e_c) − f(θ − h e_c)) / 2h` over every
//! parameter, evaluated on the devices in one program of `2d` members (`h = --step`,
//! default the config's σ), with their agreement with the differences at `2h` printed as
//! a check of the reference itself. `--plot out.svg` draws the cosine against `n`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use shardes::estimate::{central_differences, cosine, sampling_dimension, Estimator, Quality};
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{leaf_infos, Coupling, EsSpec, ShapingSpec, StrategySpec};
use shardes::problem::quadratic::quadratic_instance;

use crate::config::{quadratic, Config, ConfigError, ProblemConfig};
use crate::out::Stdout;
use crate::plot::{register_fonts, write_atomic, FONT};
use crate::setup;

/// Arguments of `shardes estimate`.
#[derive(Debug, clap::Args)]
pub struct EstimateArgs {
    /// The run configuration (TOML): its problem, `[es]` and devices.
    pub config: PathBuf,
    /// Independent estimates per strategy and n (generations 0 .. K − 1).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub repeats: u32,
    /// Population sizes (comma separated); each a multiple of devices × pairing.
    #[arg(long, default_value = "64,256,1024", value_delimiter = ',')]
    pub n: Vec<usize>,
    /// Strategies separated by `;` (default: the config's strategy under each coupling it
    /// takes: gaussian, orthogonal_hd, and sobol for low rank).
    #[arg(long)]
    pub strategies: Option<String>,
    /// Fitness shaping of the estimates (`none` estimates the gradient at its own scale).
    #[arg(long, default_value = "none")]
    pub shaping: String,
    /// Central-difference step h (default: the config's sigma); ignored for `quadratic`.
    #[arg(long)]
    pub step: Option<f32>,
    /// Also draw the cosine against n to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `spec` with its Gaussian directions drawn by `coupling` (`None` where the strategy
/// cannot take it: `sobol` on full rank).
fn coupled(spec: &StrategySpec, coupling: Coupling) -> Option<StrategySpec> {
    match spec {
        StrategySpec::Mirrored(inner) => {
            coupled(inner, coupling).map(|s| StrategySpec::Mirrored(Box::new(s)))
        }
        StrategySpec::Coupled { inner, .. } => coupled(inner, coupling),
        StrategySpec::LowRank { .. }
        | StrategySpec::SeedRegenerated { .. }
        | StrategySpec::IidGaussian => {
            if coupling == Coupling::Gaussian {
                Some(spec.clone())
            } else if coupling.needs_factors() && !matches!(spec, StrategySpec::LowRank { .. }) {
                None
            } else {
                Some(StrategySpec::Coupled {
                    inner: Box::new(spec.clone()),
                    coupling,
                })
            }
        }
    }
}

fn strategies(args: &EstimateArgs, config: &Config) -> Result<Vec<StrategySpec>> {
    match &args.strategies {
        Some(list) => list
            .split(';')
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                s.trim().parse::<StrategySpec>().map_err(|e| {
                    ConfigError::new(
                        format!("--strategies: {e}"),
                        "separate strategies with ';', e.g. \"mirrored(lowrank(r=1)); \
                         mirrored(lowrank(r=1, coupling=orthogonal_hd))\"",
                    )
                    .into()
                })
            })
            .collect(),
        None => Ok(
            [Coupling::Gaussian, Coupling::OrthogonalHd, Coupling::Sobol]
                .into_iter()
                .filter_map(|c| coupled(&config.es.strategy, c))
                .collect(),
        ),
    }
}

/// One row of the report.
struct Row {
    strategy: String,
    n: usize,
    quality: Quality,
}

/// Runs `shardes estimate`.
pub fn run(args: &EstimateArgs) -> Result<()> {
    let config = Config::load(&args.config)?;
    let shaping: ShapingSpec = args
        .shaping
        .parse()
        .map_err(|e| ConfigError::new(format!("--shaping: {e}"), "use e.g. --shaping none"))?;
    if args.n.is_empty() || args.n.contains(&0) {
        return Err(ConfigError::new(
            "--n: population sizes must be positive",
            "e.g. --n 64,256,1024",
        )
        .into());
    }
    if let Some(path) = &args.plot {
        crate::inspect::check_writable("--plot", path)?;
    }
    let specs = strategies(args, &config)?;
    // Every ES is checked before anything compiles.
    let devices = config.devices;
    let spec_for = |s: &StrategySpec, n: usize| -> EsSpec {
        let mut e: EsSpec = config.es.clone();
        e.strategy = s.clone();
        e.n = n;
        e.lr = 1.0;
        e.shaping = shaping;
        e
    };
    for s in &specs {
        for &n in &args.n {
            spec_for(s, n).build(devices).map_err(|e| {
                anyhow!(ConfigError::new(
                    format!("{s} at n = {n}: {e}"),
                    "pick n a multiple of devices × pairing (--n), or fewer devices"
                ))
            })?;
        }
    }
    let (_, problem, _) = setup::problem(&config)?;
    let client = setup::client(&config)?;
    let leaves = leaf_infos(&problem.params);
    let mut out = Stdout::new();
    out.line(format_args!("shardes estimate {}", args.config.display()));
    out.line(format_args!(
        "  problem  {}: {} parameters in {} leaves",
        problem.summary,
        problem.params.num_params(),
        leaves.len()
    ));
    let reference = match &config.problem {
        ProblemConfig::Quadratic { .. } => {
            let q = quadratic(&config.problem)?;
            let inst = quadratic_instance(q, config.run.seed).map_err(setup::problem_error)?;
            out.line(format_args!(
                "  reference  the analytic gradient H (θ − θ*)"
            ));
            inst.gradient(&problem.params).map_err(|e| anyhow!("{e}"))?
        }
        _ => {
            let h = args.step.unwrap_or(config.es.sigma);
            let t = std::time::Instant::now();
            let g = central_differences(
                &client,
                devices,
                &*problem.model,
                &problem.params,
                &problem.batch,
                h,
            )?;
            let g2 = central_differences(
                &client,
                devices,
                &*problem.model,
                &problem.params,
                &problem.batch,
                2.0 * h,
            )?;
            out.line(format_args!(
                "  reference  central differences, h = {h} ({} members, {:.1} s; cosine to h = {}: {:.6})",
                2 * g.len(),
                t.elapsed().as_secs_f64(),
                2.0 * h,
                cosine(&g, &g2)
            ));
            g
        }
    };
    let norm = reference.iter().map(|x| x * x).sum::<f64>().sqrt();
    out.line(format_args!(
        "  estimates  {} repeats each at the initial parameters, lr 1, shaping {shaping}, {devices} devices; ‖∇f‖ = {norm:.4}",
        args.repeats
    ));
    out.line(format_args!(""));
    out.line(format_args!(
        "{:<50} {:>6} {:>7}  {:>15}  {:>17}  {:>10}  {:>10}",
        "strategy", "n", "dim", "cosine", "rel. bias (se)", "rel. var", "rel. MSE"
    ));
    let mut rows = Vec::new();
    for s in &specs {
        let dim = sampling_dimension(from_spec(s).as_ref(), &leaves);
        for &n in &args.n {
            let es = spec_for(s, n);
            let est = Estimator::from_spec(
                &client,
                &es,
                devices,
                &*problem.model,
                &problem.params,
                problem.key,
                &problem.batch,
            )?;
            let draws: Vec<Vec<f64>> = (0..args.repeats)
                .map(|g| est.estimate(g).map(|e| e.gradient))
                .collect::<Result<_, _>>()?;
            let q = Quality::of(&draws, &reference).ok_or_else(|| {
                anyhow!("the reference gradient is zero: nothing to compare with")
            })?;
            out.line(format_args!(
                "{:<50} {:>6} {:>7}  {:>7.4} ± {:<6.4}  {:>8.4} ({:.4})  {:>10.4}  {:>10.4}",
                s.to_string(),
                n,
                dim,
                q.cosine,
                q.cosine_sd,
                q.relative_bias,
                q.bias_se,
                q.relative_variance,
                q.relative_mse
            ));
            rows.push(Row {
                strategy: s.to_string(),
                n,
                quality: q,
            });
        }
    }
    if let Some(path) = &args.plot {
        draw(path, &rows, &problem.summary)?;
        out.line(format_args!(""));
        out.line(format_args!("plot     {}", path.display()));
    }
    out.finish()
}

/// The cosine against n (log scale), one line per strategy.
fn draw(path: &Path, rows: &[Row], title: &str) -> Result<()> {
    register_fonts()?;
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing the plot: {e}");
    let ns: Vec<f64> = rows.iter().map(|r| (r.n as f64).log2()).collect();
    let lo = ns.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = ns.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 1.0, hi + 1.0)
    };
    let top = rows
        .iter()
        .map(|r| r.quality.cosine)
        .fold(0.0f64, f64::max)
        .max(0.05);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("cosine to the true gradient: {title}"), (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(lo - 0.2..hi + 0.2, 0.0..(top * 1.1).min(1.0))
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("population n")
            .x_label_formatter(&|x| format!("{:.0}", 2f64.powf(*x)))
            .y_desc("mean cosine")
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(|e| err(&e))?;
        let mut names: Vec<&str> = Vec::new();
        for r in rows {
            if !names.contains(&r.strategy.as_str()) {
                names.push(&r.strategy);
            }
        }
        for (i, name) in names.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.strategy == *name)
                .map(|r| ((r.n as f64).log2(), r.quality.cosine))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name.to_string())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .label_font((FONT, 13))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    write_atomic(path, svg.as_bytes())
}
