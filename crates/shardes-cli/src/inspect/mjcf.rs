//! `shardes check` and `shardes diag` on a control config with an MJCF (MuJoCo) model.
//!
//! Its episodes run on the host, so it has no loss program: what a run compiles is the
//! policy step (every member's actions from the observations) and the tell program
//! ([`shardes::host_control`]). [`plan`] loads the model, checks the `[es]` settings
//! against the policy's leaves and traces the policy step's reads (every leaf read, every
//! 2-D leaf through a seam) the way `check_model` traces a loss; [`programs`] builds the
//! two programs for `shardes diag`.

use anyhow::{Context, Result};
use shardes::hlo::builder::{TensorType, Value};
use shardes::hlo::es::ShardedES;
use shardes::hlo::es::{check_model, EsError, Finding, LeafInfo, Model, ModelParams};
use shardes::hlo::nn::Act;
use shardes::hlo::problems::control::host::PolicyStep;

use super::problem_shapes;
use super::task::{timed, BuiltProgram};
use crate::config::Config;
use crate::out::{outln, Stdout};
use crate::setup;

/// What a run of an MJCF control config would do, checked without compiling.
pub struct MjcfPlan {
    /// The run's ES.
    pub es: ShardedES,
    /// The policy step the run compiles.
    pub step: PolicyStep,
    /// The policy's leaves.
    pub leaves: Vec<LeafInfo>,
    /// The problem in words.
    pub summary: String,
    /// Steps per episode at most.
    pub episode_length: usize,
    /// The model file.
    pub mjcf: std::path::PathBuf,
    /// Leaves the policy step never reads, or reads without a seam.
    pub findings: Vec<Finding>,
}

/// The policy step as a "loss" for `check_model`: its actions from the observations, so
/// the trace records how the step reads every leaf (the member ids are a batch input
/// here; in the program they come from the chunk).
struct StepTrace<'a>(&'a PolicyStep);

impl Model for StepTrace<'_> {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        // check_model traces a chunk of two members.
        vec![
            ("obs".into(), self.0.obs_type()),
            ("ids".into(), TensorType::u32(&[2])),
        ]
    }

    fn loss(&self, params: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let [obs, ids] = batch else {
            return Err(EsError::Invalid {
                message: "the policy step trace takes the observations and the member ids".into(),
                fix: "pass both".into(),
            });
        };
        self.0.actions(params, obs, ids)
    }
}

/// Whether `config` is a control problem on an MJCF model.
pub fn is_mjcf(config: &Config) -> Result<bool> {
    Ok(crate::config::control_mjcf(&config.problem, config.es.shaping)?.is_some())
}

/// Checks an MJCF control config as a run would, without compiling anything.
pub fn plan(config: &Config) -> Result<MjcfPlan> {
    let (es, shapes) = problem_shapes(config)?;
    let Some(host) = setup::host_control(config)? else {
        anyhow::bail!("the config's problem has no MJCF model");
    };
    let spec = host.spec();
    let step = PolicyStep::new(&host.widths(), config.es.n, spec.episodes())
        .map_err(crate::config::es_error)?
        .with_fitness(spec.fitness());
    let findings = check_model(&StepTrace(&step), &shapes.leaves).context("tracing the policy")?;
    Ok(MjcfPlan {
        es,
        step,
        leaves: shapes.leaves,
        summary: shapes.summary,
        episode_length: spec.episode_length(),
        mjcf: spec.mjcf().to_path_buf(),
        findings,
    })
}

/// The programs a run of `p` compiles: the policy step and the tell.
pub fn programs(p: &MjcfPlan) -> Result<Vec<BuiltProgram>> {
    Ok(vec![
        timed("policy step", || p.es.outputs_program(&p.step, &p.leaves))?,
        timed("tell", || {
            p.es.tell_program(&p.step as &dyn Model, &p.leaves)
        })?,
    ])
}

/// Runs `shardes check` on an MJCF control config; returns the number of findings.
pub fn check(config: &Config, json: bool) -> Result<usize> {
    let p = plan(config)?;
    let chunk =
        p.es.member_chunk_for(&p.step as &dyn Model)
            .map_err(crate::config::es_error)?;
    let mut out = Stdout::new();
    if json {
        let list = super::findings::to_json(&p.findings);
        let doc = serde_json::json!({
            "problem": config.problem.name(),
            "mjcf": p.mjcf.display().to_string(),
            "leaves": p.leaves.len(),
            "findings": list,
            "n": p.es.n(),
            "devices": p.es.devices(),
            "member_chunk": chunk,
            "episodes": p.step.episodes(),
            "episode_length": p.episode_length,
            "widths": p.step.widths(),
        });
        outln!(out, "{doc}");
        out.finish()?;
        return Ok(p.findings.len());
    }
    let ok = format!(
        "ok: {}; its policy step reads all {} leaves, every 2-D leaf through a seam",
        p.summary,
        p.leaves.len()
    );
    super::findings::print(&mut out, &p.findings, &ok, &format!(" in {}", p.summary));
    let devices = p.es.devices();
    outln!(
        out,
        "population: {} n = {} on {devices} device(s) ({} per device, member chunk {chunk}), \
         sigma {}, lr {}, shaping {}",
        p.es.strategy().name(),
        p.es.n(),
        p.es.n() / devices.max(1),
        p.es.sigma(),
        p.es.lr(),
        p.es.shaping().name()
    );
    let fitness = match p.step.tasks() {
        1 => "the negated mean return per member".to_string(),
        e => format!("the negated return of each of the {e} episodes per member"),
    };
    outln!(
        out,
        "episodes: {} members x {} episodes of at most {} steps per generation, simulated by \
         MuJoCo on the host ({}); fitness {fitness}",
        p.es.n(),
        p.step.episodes(),
        p.episode_length,
        p.mjcf.display()
    );
    outln!(
        out,
        "policy: widths {:?} (observation, hidden, action)",
        p.step.widths()
    );
    outln!(
        out,
        "programs: policy step and tell (no loss program: the episodes run on the host; \
         `shardes diag` compiles them)"
    );
    out.finish()?;
    Ok(p.findings.len())
}
