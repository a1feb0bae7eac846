//! `shardes rollout CONFIG`: replays a trained control policy and prints each episode's
//! return.
//!
//! The policy is the unperturbed one of `--params` (default: the run's
//! `OUT/params.safetensors`), on `--episodes K` episodes (default: the config's) whose
//! reset states are drawn as training draws them (`fold_in(key(seed), 1)`), so with the
//! config's count they are exactly the training episodes. An in-program environment runs
//! its whole rollout as one program on one device; a MuJoCo model (`problem.mjcf`) is
//! simulated on host threads with the policy evaluated on one device per step, and
//! `--csv FILE` writes its trajectory: `episode,step,qpos_0,…` from the reset state
//! (step 0) to the step that ended the episode.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use shardes::hlo::es::leaf_infos;
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::{fold_in, key};
use shardes::hlo::problems::control::rollout::{policy_program, returns_program};
use shardes::hlo::problems::control::Control;
use shardes::host_control::{HostControl, Rollouts};
use shardes::io::{read_params, read_params_inferred};
use shardes::runtime::{Buffer, Client, CompileOptions};

use crate::config::{control, Config, ConfigError, ProblemConfig};
use crate::inspect::{at_least_one, check_writable};
use crate::out::{outln, Stdout};
use crate::setup;

/// Arguments of `shardes rollout`.
#[derive(Debug, Clone, clap::Args)]
pub struct RolloutArgs {
    /// The run configuration (TOML) of a `control` problem.
    pub config: PathBuf,
    /// The policy (safetensors). Default: OUT/params.safetensors of the config's run.
    #[arg(long)]
    pub params: Option<PathBuf>,
    /// Episodes to play. Default: the config's `episodes` (the training episodes).
    #[arg(long, value_parser = at_least_one())]
    pub episodes: Option<usize>,
    /// Write the qpos trajectory of every episode to this CSV file (MuJoCo models only).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// PJRT plugin: `cpu`, `cpu-jax`, `cuda`, `tpu` or a path (overrides the config's `plugin`).
    #[arg(long)]
    pub plugin: Option<String>,
}

/// Runs `shardes rollout`.
pub fn run(args: &RolloutArgs) -> Result<()> {
    let config = Config::load(&args.config)?;
    if !matches!(config.problem, ProblemConfig::Control { .. }) {
        return Err(ConfigError::new(
            format!(
                "problem \"{}\": shardes rollout replays control policies",
                config.problem.name()
            ),
            "pass the config of a control problem (e.g. examples/cartpole.toml)",
        )
        .into());
    }
    if let Some(path) = &args.csv {
        check_writable("--csv", path)?;
    }
    let params_path = args
        .params
        .clone()
        .unwrap_or_else(|| config.run.out.join("params.safetensors"));
    let seed_key = key(config.run.seed).map_err(|e| {
        ConfigError::new(
            format!("run.seed = {}: {e}", config.run.seed),
            "use a seed below 2^63",
        )
    })?;
    let client = setup::client_for(args.plugin.as_deref().or(config.plugin.as_deref()), 1)?;
    let mut out = Stdout::new();
    let returns = match setup::host_control(&config)? {
        Some(host) => {
            let host = match args.episodes {
                Some(k) => host.with_episodes(k)?,
                None => host,
            };
            let params = load_policy(
                &params_path,
                &host.init(seed_key)?,
                &host.widths(),
                &describe_mjcf(&host),
            )?;
            outln!(
                out,
                "rollout {} with {}: {} episodes of at most {} steps",
                host.env().path().display(),
                params_path.display(),
                host.spec().episodes(),
                host.spec().episode_length()
            );
            mjcf_returns(&client, &host, &params, seed_key, args.csv.as_deref())?
        }
        None => {
            if args.csv.is_some() {
                return Err(ConfigError::new(
                    "--csv writes the qpos of MuJoCo models; this config's environment \
                     (problem.env) runs inside the program",
                    "drop --csv, or replay a config with problem.mjcf",
                )
                .into());
            }
            let c = control(&config.problem, config.es.shaping)?;
            let c = match args.episodes {
                Some(k) => Control::new(c.env(), k, c.episode_length(), c.hidden())?,
                None => c,
            };
            let params = load_policy(
                &params_path,
                &c.init(seed_key)?,
                &c.widths(),
                c.env().name(),
            )?;
            outln!(
                out,
                "rollout {} with {}: {} episodes of {} steps",
                c.env(),
                params_path.display(),
                c.episodes(),
                c.episode_length()
            );
            program_returns(&client, &c, &params, seed_key)?
        }
    };
    for (e, r) in returns.iter().enumerate() {
        outln!(out, "episode {e}: return {r:.4}");
    }
    let mean = returns.iter().sum::<f64>() / returns.len().max(1) as f64;
    let (lo, hi) = returns
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &r| {
            (a.min(r), b.max(r))
        });
    outln!(out, "mean return {mean:.4} (min {lo:.4}, max {hi:.4})");
    if let Some(path) = &args.csv {
        outln!(out, "qpos trajectories in {}", path.display());
    }
    out.finish()
}

fn describe_mjcf(h: &HostControl) -> String {
    format!(
        "{} (nu = {})",
        h.env().path().display(),
        h.env().action_dim()
    )
}

/// The policy of `path` for layer `widths` (observation, hidden, action) in the structure
/// of `template` (this problem's policy); a policy of other sizes is the user's to fix,
/// named by what differs: the action size first, then the observation, then the hidden.
fn load_policy(
    path: &Path,
    template: &ParamTree,
    widths: &[usize],
    problem: &str,
) -> Result<ParamTree> {
    let hint = "pass --params of a run of this config (its OUT/params.safetensors), or run \
                `shardes run CONFIG` first";
    let bad = |what: String| -> anyhow::Error {
        ConfigError::new(format!("--params {}: {what}", path.display()), hint).into()
    };
    let file = read_params_inferred(path).map_err(|e| bad(e.to_string()))?;
    // The file's widths from its weights `layers.{i}.w` (out, in).
    let mut found = Vec::new();
    for i in 0.. {
        let name = format!("layers.{i}.w");
        let Some((_, w)) = file.leaves().into_iter().find(|(p, _)| *p == name) else {
            break;
        };
        if let [out, inp] = w.shape() {
            if i == 0 {
                found.push(*inp);
            }
            found.push(*out);
        }
    }
    if found.len() >= 2 && found != widths {
        let (fa, wa) = (found[found.len() - 1], widths[widths.len() - 1]);
        return Err(bad(if fa != wa {
            format!("its policy gives {fa} actions, but {problem} takes {wa}")
        } else if found[0] != widths[0] {
            format!(
                "its policy reads {} observations, but {problem} gives {}",
                found[0], widths[0]
            )
        } else {
            format!(
                "its policy has hidden sizes {:?}, but the config's (problem.hidden) are {:?}",
                &found[1..found.len() - 1],
                &widths[1..widths.len() - 1]
            )
        }));
    }
    read_params(path, template).map_err(|e| bad(e.to_string()))
}

/// Uploads `params`' leaves to device 0.
fn upload(client: &Client, params: &ParamTree) -> Result<Vec<Buffer>> {
    params
        .leaves()
        .iter()
        .map(|(_, a)| Ok(client.buffer_from_host(a.data(), a.shape(), 0)?))
        .collect()
}

/// The returns of an in-program environment: its rollout program on one device.
fn program_returns(
    client: &Client,
    c: &Control,
    params: &ParamTree,
    seed_key: shardes::hlo::prng::Key,
) -> Result<Vec<f64>> {
    let module = returns_program(c, &leaf_infos(params))?;
    let exe = client
        .compile(&module.to_mlir(), &CompileOptions::new(1))
        .context("compiling the rollout program")?;
    let reset = c.reset_states(fold_in(seed_key, 1))?;
    let mut bufs = upload(client, params)?;
    bufs.push(client.buffer_from_host(reset.data(), reset.shape(), 0)?);
    let refs: Vec<&Buffer> = bufs.iter().collect();
    let mut outs = exe.execute(&[refs])?;
    let returns = outs.remove(0).remove(0).to_host::<f32>()?;
    Ok(returns.into_iter().map(f64::from).collect())
}

/// The returns on a MuJoCo model: the simulations on host threads, the policy on one
/// device per step; with `csv`, every episode's qpos until it ends.
fn mjcf_returns(
    client: &Client,
    h: &HostControl,
    params: &ParamTree,
    seed_key: shardes::hlo::prng::Key,
    csv: Option<&Path>,
) -> Result<Vec<f64>> {
    let k = h.spec().episodes();
    let module = policy_program(&h.widths(), &leaf_infos(params), k)?;
    let exe = client
        .compile(&module.to_mlir(), &CompileOptions::new(1))
        .context("compiling the policy program")?;
    let leaves = upload(client, params)?;
    let reset = h.reset_states(fold_in(seed_key, 1))?;
    let mut rollouts = Rollouts::new(h.env(), k, &reset)?;
    let obs_dims = [k, h.env().obs_dim()];
    let nq = h.env().model().nq();
    let mut text = String::new();
    let mut ended = vec![false; k];
    if csv.is_some() {
        text.push_str("episode,step");
        for i in 0..nq {
            let _ = write!(text, ",qpos_{i}");
        }
        text.push('\n');
        for (e, ep) in rollouts.episodes().iter().enumerate() {
            row(&mut text, e, 0, ep.data().qpos());
        }
    }
    let stats = rollouts.run(
        h.spec().episode_length(),
        |obs| {
            let x = client.buffer_from_host(obs, &obs_dims, 0)?;
            let mut args: Vec<&Buffer> = leaves.iter().collect();
            args.push(&x);
            let mut outs = exe.execute(&[args])?;
            Ok(outs.remove(0).remove(0).to_host::<f32>()?)
        },
        |t, r| {
            if csv.is_some() {
                for (e, ep) in r.episodes().iter().enumerate() {
                    if !ended[e] {
                        row(&mut text, e, t + 1, ep.data().qpos());
                        ended[e] = !ep.alive();
                    }
                }
            }
            Ok(())
        },
    )?;
    if let Some(path) = csv {
        std::fs::write(path, text)
            .with_context(|| format!("writing the trajectories to {}", path.display()))?;
    }
    Ok(stats.returns)
}

fn row(text: &mut String, episode: usize, step: usize, qpos: &[f64]) {
    let _ = write!(text, "{episode},{step}");
    for q in qpos {
        let _ = write!(text, ",{q}");
    }
    text.push('\n');
}
