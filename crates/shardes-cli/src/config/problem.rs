//! Building each problem's library description from its `[problem]` table, with the
//! defaults for unset keys and errors naming the key.

use shardes::hlo::es::ShapingSpec;
use shardes::hlo::problems::control::{self, Control, Env, Fitness, ENV_NAMES};
use shardes::hlo::problems::quadratic::Quadratic;
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::host_control::MjcfControl;
use std::path::PathBuf;

use super::{nearest, ConfigError, ProblemConfig};

/// The transformer block of a `transformer_block` `[problem]`, with the defaults for unset
/// keys: `d_model` 64, `batch` 8, `seq` 32.
pub fn transformer_block(
    d_model: Option<usize>,
    batch: Option<usize>,
    seq: Option<usize>,
) -> TransformerBlock {
    TransformerBlock {
        d_model: d_model.unwrap_or(64),
        batch: batch.unwrap_or(8),
        seq: seq.unwrap_or(32),
    }
}

/// The control problem of a `control` `[problem]` for shaping `shaping`, with the defaults
/// for unset keys (`episodes` 4, `episode_length` 200, `hidden` `[32, 32]`): the fitness is
/// per episode for `group_relative`, the mean over episodes otherwise.
pub fn control(problem: &ProblemConfig, shaping: ShapingSpec) -> Result<Control, ConfigError> {
    let ProblemConfig::Control {
        env,
        episodes,
        episode_length,
        hidden,
        mjcf,
    } = problem
    else {
        return Err(ConfigError::new(
            format!("problem \"{}\" is not control", problem.name()),
            "set problem.name = \"control\"",
        ));
    };
    if let Some(m) = mjcf {
        return Err(ConfigError::new(
            format!(
                "problem.mjcf = \"{}\" is a MuJoCo model, simulated on the host, not an \
                 in-program environment",
                m.display()
            ),
            "build it with config::control_mjcf",
        ));
    }
    let env = control_env(env.as_deref())?;
    let (episodes, episode_length, hidden) = policy(*episodes, *episode_length, hidden);
    let c = Control::new(env, episodes, episode_length, &hidden).map_err(policy_error)?;
    Ok(c.with_fitness(fitness(shaping)))
}

/// `episodes`, `episode_length` and `hidden` of either control problem, with the defaults
/// for unset keys.
fn policy(
    episodes: Option<usize>,
    episode_length: Option<usize>,
    hidden: &Option<Vec<usize>>,
) -> (usize, usize, Vec<usize>) {
    (
        episodes.unwrap_or(4),
        episode_length.unwrap_or(200),
        hidden.clone().unwrap_or_else(|| vec![32, 32]),
    )
}

/// Either control problem's refusal of its settings, as a config error naming the key.
fn policy_error(e: impl std::fmt::Display) -> ConfigError {
    ConfigError::new(
        format!("problem.{e}"),
        "episodes and episode_length must be at least 1, every hidden size at least 1 \
         (hidden = [] is a linear policy)",
    )
}

/// The fitness `shaping` ranks: per episode for `group_relative`, else the mean over the
/// episodes.
fn fitness(shaping: ShapingSpec) -> Fitness {
    if shaping == ShapingSpec::GroupRelative {
        Fitness::PerEpisode
    } else {
        Fitness::Mean
    }
}

/// The quadratic of a `quadratic` `[problem]`, with the defaults for unset keys (`rows`
/// 32, `cols` 16, `condition` 100).
pub fn quadratic(problem: &ProblemConfig) -> Result<Quadratic, ConfigError> {
    let ProblemConfig::Quadratic {
        rows,
        cols,
        condition,
    } = problem
    else {
        return Err(ConfigError::new(
            format!("problem \"{}\" is not quadratic", problem.name()),
            "set problem.name = \"quadratic\"",
        ));
    };
    Quadratic::new(
        rows.unwrap_or(32),
        cols.unwrap_or(16),
        condition.unwrap_or(100.0),
    )
    .map_err(|e| {
        ConfigError::new(
            format!("problem.{e}"),
            "rows and cols between 1 and 4096, condition a finite number of at least 1",
        )
    })
}

/// The MJCF control problem of a `control` `[problem]` with `mjcf` set (the defaults as
/// [`control`]'s), or `None` when it names an in-program `env`. The model file is loaded
/// later, with the MuJoCo library ([`shardes::host_control::MjcfControl::load`]).
pub fn control_mjcf(
    problem: &ProblemConfig,
    shaping: ShapingSpec,
) -> Result<Option<MjcfControl>, ConfigError> {
    let ProblemConfig::Control {
        env,
        episodes,
        episode_length,
        hidden,
        mjcf: Some(mjcf),
    } = problem
    else {
        return Ok(None);
    };
    if let Some(env) = env {
        return Err(ConfigError::new(
            format!(
                "problem.env = \"{env}\" and problem.mjcf = \"{}\" are both set",
                mjcf.display()
            ),
            "keep one: env names an environment inside the program, mjcf a MuJoCo model \
             simulated on the host",
        ));
    }
    let (episodes, episode_length, hidden) = policy(*episodes, *episode_length, hidden);
    let c =
        MjcfControl::new(mjcf.clone(), episodes, episode_length, &hidden).map_err(policy_error)?;
    Ok(Some(c.with_fitness(fitness(shaping))))
}

/// The environment `problem.env` names, or the error listing the valid ones.
fn control_env(env: Option<&str>) -> Result<Env, ConfigError> {
    let Some(name) = env else {
        return Err(ConfigError::new(
            "problem \"control\" needs problem.env (or problem.mjcf)",
            format!(
                "add env = \"NAME\", one of: {}; or mjcf = \"model.xml\" for a MuJoCo model",
                ENV_NAMES.join(", ")
            ),
        ));
    };
    name.parse().map_err(|_: control::UnknownEnv| {
        let hint = match nearest(name, &ENV_NAMES) {
            Some(n) => format!("did you mean \"{n}\"? valid: {}", ENV_NAMES.join(", ")),
            None => format!("valid environments: {}", ENV_NAMES.join(", ")),
        };
        ConfigError::new(format!("problem.env: unknown environment \"{name}\""), hint)
    })
}

/// Where a language model's weights come from, as a `[problem]` names them (exactly one
/// of `model`, `checkpoint` and `size`), before a named model is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightsKey {
    /// `model = "NAME"` or a path.
    Model(String),
    /// `checkpoint = "PATH"`: a Hugging Face directory or a `.gguf` file.
    Checkpoint(PathBuf),
    /// `size = "…"`: random parameters.
    Size(String),
}

impl ProblemConfig {
    /// The one key of a qwen2 problem that names its weights, checked to be the only one.
    pub fn weights_key(&self) -> Result<WeightsKey, ConfigError> {
        let ProblemConfig::Qwen2 {
            checkpoint,
            size,
            model,
            ..
        } = self
        else {
            return Err(ConfigError::new(
                format!("problem \"{}\" has no model weights", self.name()),
                "use [problem] name = \"qwen2\" with model, checkpoint or size",
            ));
        };
        let set: Vec<&str> = [
            ("model", model.is_some()),
            ("checkpoint", checkpoint.is_some()),
            ("size", size.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, on)| on.then_some(k))
        .collect();
        if set.len() > 1 {
            return Err(ConfigError::new(
                format!(
                    "problem.{} are {} set",
                    set.join(" and problem."),
                    if set.len() == 2 { "both" } else { "all" }
                ),
                "keep one: model = \"smollm2-135m-instruct\" (or a .gguf path) or checkpoint = \
                 \"DIR\" loads a model, size = \"tiny\" draws one at random",
            ));
        }
        match (model, checkpoint, size) {
            (Some(m), _, _) => Ok(WeightsKey::Model(m.clone())),
            (_, Some(c), _) => Ok(WeightsKey::Checkpoint(c.clone())),
            (_, _, Some(s)) => Ok(WeightsKey::Size(s.clone())),
            _ => Err(ConfigError::new(
                "problem \"qwen2\" needs problem.model, problem.checkpoint or problem.size",
                "add model = \"smollm2-135m-instruct\" (a pretrained model, fetched once), \
                 checkpoint = \"DIR\" (a Hugging Face directory or a .gguf file) or size = \
                 \"tiny\", \"0.5b\" or \"1.5b\"",
            )),
        }
    }
}
