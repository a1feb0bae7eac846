//! MuJoCo models as control environments: an MJCF file plus shardes' conventions for the
//! observation, the action, the reward, termination and the reset distribution.
//!
//! Any model MuJoCo loads is an environment; what the model does not say takes a default.
//! The conventions are read from the model's `<custom><numeric>` elements and sensor names:
//!
//! | element | meaning | default |
//! |---|---|---|
//! | observation | `qpos ‖ qvel` after the step, as f32 (`nq + nv` values) | — |
//! | action | `nu` values in `[−1, 1]` (clipped); actuator `i` gets `lo + (a + 1)/2 · (hi − lo)` when its `ctrlrange` is limited, else `a` | — |
//! | `shardes_frame_skip` | MuJoCo steps per control step (the controls held) | 1 |
//! | `shardes_alive` | reward per step, the terminating one included | 0 |
//! | `shardes_ctrl_cost` | the reward subtracts `w · Σ aᵢ²` (on the clipped action) | 0 |
//! | sensors named `cost…` | the reward subtracts each one's Euclidean norm, as `mj_step` left it (evaluated at the state its last MuJoCo step started from, as Gym's Reacher measures its distance) | none |
//! | `shardes_bound_<joint>` `lo hi` | the episode ends after a step that leaves the joint's first coordinate outside `[lo, hi]` | none |
//! | `shardes_reset_qpos`, `shardes_reset_qvel` | half-widths `w` (one for all, or `nq` / `nv` values): a reset is `qpos = qpos0 + w·u`, `qvel = w·u`, `u ~ U[−1, 1)` | 0 |
//!
//! An episode also ends when MuJoCo reports an unstable simulation (a NaN or huge
//! acceleration, after which MuJoCo resets the state itself); that step's reward is 0, so
//! a policy cannot gain from blowing the simulation up. After the end an episode is no
//! longer stepped and collects no reward, as the in-program environments mask it.
//!
//! Reset states are drawn from a key with the host PRNG (`prng::uniform`, JAX-exact): the
//! uniforms `u` of all episodes are one `[E, nq + nv]` draw, so episode `e`'s start depends
//! only on the key and `e`.
//!
//! The shipped models, `examples/mujoco/cartpole.xml` (Gym CartPole-v1's cart-pole: reward
//! 1 per step, bounds ±2.4 m and ±12°) and `examples/mujoco/reacher.xml` (a two-link reacher
//! with its target on two slide joints), show every convention.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use shardes_hlo::prng::{uniform, Key, PrngError};
use shardes_mujoco::{Data, Model, Mujoco, MujocoError};

/// The `<custom><numeric>` names shardes reads (besides `shardes_bound_<joint>`).
pub const NUMERICS: [&str; 5] = [
    "shardes_frame_skip",
    "shardes_alive",
    "shardes_ctrl_cost",
    "shardes_reset_qpos",
    "shardes_reset_qvel",
];

/// The prefix of per-joint bounds, `shardes_bound_<joint name>`.
pub const BOUND_PREFIX: &str = "shardes_bound_";

/// The prefix of cost sensors' names.
pub const COST_PREFIX: &str = "cost";

/// Errors loading or using an MJCF environment.
#[derive(Debug, thiserror::Error)]
pub enum MjcfError {
    /// The MuJoCo library or the model file (MuJoCo's own message).
    #[error(transparent)]
    Mujoco(#[from] MujocoError),
    /// The model breaks one of the conventions.
    #[error("{path}: {message}; {fix}")]
    Convention {
        /// The model file.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// How to fix it.
        fix: String,
    },
    /// An action or state of the wrong size.
    #[error("{what}: got {got} values, but {path} needs {expected}; {fix}")]
    Size {
        /// The model file.
        path: PathBuf,
        /// What was passed.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the model needs.
        expected: usize,
        /// How to fix it.
        fix: String,
    },
    /// Drawing reset states failed.
    #[error("drawing the reset states: {0}")]
    Prng(#[from] PrngError),
}

/// A joint bound that ends the episode.
#[derive(Debug, Clone, PartialEq)]
struct Bound {
    qpos: usize,
    lo: f64,
    hi: f64,
}

/// A MuJoCo model with shardes' conventions (see the module documentation).
#[derive(Debug)]
pub struct MjcfEnv {
    model: Arc<Model>,
    frame_skip: usize,
    alive: f64,
    ctrl_cost: f64,
    costs: Vec<(usize, usize)>,
    bounds: Vec<Bound>,
    reset_qpos: Vec<f64>,
    reset_qvel: Vec<f64>,
    ctrl_ranges: Vec<Option<(f64, f64)>>,
}

impl MjcfEnv {
    /// Opens the MuJoCo library ([`Mujoco::open`], `library` first) and loads the model
    /// file `mjcf` with its conventions.
    pub fn load(library: Option<&Path>, mjcf: &Path) -> Result<MjcfEnv, MjcfError> {
        let lib = Mujoco::open(library)?;
        MjcfEnv::new(Arc::new(Model::load(&lib, mjcf)?))
    }

    /// The environment of a loaded model: its conventions read and checked.
    pub fn new(model: Arc<Model>) -> Result<MjcfEnv, MjcfError> {
        let path = model.path().to_path_buf();
        let bad = |message: String, fix: &str| MjcfError::Convention {
            path: path.clone(),
            message,
            fix: fix.into(),
        };
        if model.nu() == 0 {
            return Err(bad(
                "the model has no actuators (nu = 0), so a policy cannot act on it".into(),
                "add an <actuator> (e.g. <motor joint=\"...\" ctrlrange=\"-1 1\" gear=\"...\"/>)",
            ));
        }
        let joints = model.joints();
        let mut env = MjcfEnv {
            frame_skip: 1,
            alive: 0.0,
            ctrl_cost: 0.0,
            costs: model
                .sensors()
                .into_iter()
                .filter(|s| s.name.starts_with(COST_PREFIX))
                .map(|s| (s.adr, s.dim))
                .collect(),
            bounds: Vec::new(),
            reset_qpos: vec![0.0; model.nq()],
            reset_qvel: vec![0.0; model.nv()],
            ctrl_ranges: (0..model.nu()).map(|i| model.ctrl_range(i)).collect(),
            model: Arc::clone(&model),
        };
        for n in model.numerics() {
            let one = || -> Result<f64, MjcfError> {
                match n.data[..] {
                    [v] if v.is_finite() => Ok(v),
                    _ => Err(bad(
                        format!("{} = {:?} must be one finite number", n.name, n.data),
                        "give it a single value: <numeric name=\"...\" data=\"1\"/>",
                    )),
                }
            };
            let widths = |len: usize, what: &str| -> Result<Vec<f64>, MjcfError> {
                let ok = n.data.iter().all(|w| w.is_finite() && *w >= 0.0);
                match n.data.len() {
                    1 if ok => Ok(vec![n.data[0]; len]),
                    l if l == len && ok => Ok(n.data.clone()),
                    l => Err(bad(
                        format!(
                            "{} has {l} values {:?}, but the model has {what} = {len}",
                            n.name, n.data
                        ),
                        &format!("give one half-width for all, or {len}, each finite and ≥ 0"),
                    )),
                }
            };
            match n.name.as_str() {
                "shardes_frame_skip" => {
                    let v = one()?;
                    if !(1.0..=10_000.0).contains(&v) || v.fract() != 0.0 {
                        return Err(bad(
                            format!("shardes_frame_skip = {v} is not a whole number ≥ 1"),
                            "give the MuJoCo steps per control step, e.g. data=\"2\"",
                        ));
                    }
                    env.frame_skip = v as usize;
                }
                "shardes_alive" => env.alive = one()?,
                "shardes_ctrl_cost" => env.ctrl_cost = one()?,
                "shardes_reset_qpos" => env.reset_qpos = widths(model.nq(), "nq")?,
                "shardes_reset_qvel" => env.reset_qvel = widths(model.nv(), "nv")?,
                name if name.starts_with(BOUND_PREFIX) => {
                    let joint = &name[BOUND_PREFIX.len()..];
                    let Some(j) = joints.iter().find(|j| j.name == joint) else {
                        let names: Vec<&str> = joints.iter().map(|j| j.name.as_str()).collect();
                        return Err(bad(
                            format!("{name} names no joint of the model (\"{joint}\")"),
                            &format!(
                                "use shardes_bound_<joint> with one of: {}",
                                names.join(", ")
                            ),
                        ));
                    };
                    match n.data[..] {
                        [lo, hi] if lo < hi => env.bounds.push(Bound {
                            qpos: j.qpos_adr,
                            lo,
                            hi,
                        }),
                        _ => {
                            return Err(bad(
                                format!("{name} = {:?} is not a range lo < hi", n.data),
                                "give two numbers, e.g. data=\"-2.4 2.4\"",
                            ))
                        }
                    }
                }
                name if name.starts_with("shardes_") => {
                    return Err(bad(
                        format!("unknown shardes numeric \"{name}\""),
                        &format!(
                            "shardes reads {} and {BOUND_PREFIX}<joint>",
                            NUMERICS.join(", ")
                        ),
                    ))
                }
                _ => {}
            }
        }
        Ok(env)
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        self.model.path()
    }

    /// Observation size, `nq + nv`.
    pub fn obs_dim(&self) -> usize {
        self.model.nq() + self.model.nv()
    }

    /// Action size, `nu`.
    pub fn action_dim(&self) -> usize {
        self.model.nu()
    }

    /// A reset state's size, `nq + nv` (`qpos ‖ qvel`).
    pub fn state_dim(&self) -> usize {
        self.model.nq() + self.model.nv()
    }

    /// MuJoCo steps per control step.
    pub fn frame_skip(&self) -> usize {
        self.frame_skip
    }

    /// `episodes` reset states `[episodes, nq + nv]` (row-major `qpos ‖ qvel`) drawn from
    /// `key` (see the module documentation).
    pub fn reset_states(&self, key: Key, episodes: usize) -> Result<Vec<f64>, MjcfError> {
        let s = self.state_dim();
        let u = uniform(key, &[episodes, s], -1.0, 1.0)?;
        let qpos0 = self.model.qpos0();
        let mut out = Vec::with_capacity(episodes * s);
        for row in u.chunks(s.max(1)).take(episodes) {
            let (uq, uv) = row.split_at(self.model.nq());
            out.extend(
                qpos0
                    .iter()
                    .zip(&self.reset_qpos)
                    .zip(uq)
                    .map(|((q, w), u)| q + w * f64::from(*u)),
            );
            out.extend(
                self.reset_qvel
                    .iter()
                    .zip(uv)
                    .map(|(w, u)| w * f64::from(*u)),
            );
        }
        Ok(out)
    }

    /// An episode started from `state` (`qpos ‖ qvel`, [`MjcfEnv::state_dim`] values).
    pub fn episode(&self, state: &[f64]) -> Result<Episode, MjcfError> {
        let mut e = Episode {
            data: Data::new(&self.model)?,
            alive: true,
            ret: 0.0,
            steps: 0,
        };
        e.restart(self, state)?;
        Ok(e)
    }

    fn size_error(&self, what: &'static str, got: usize, expected: usize, fix: &str) -> MjcfError {
        MjcfError::Size {
            path: self.path().to_path_buf(),
            what,
            got,
            expected,
            fix: fix.into(),
        }
    }
}

/// One episode of an [`MjcfEnv`]: a simulation, whether it still runs, and its return.
#[derive(Debug)]
pub struct Episode {
    data: Data,
    alive: bool,
    ret: f64,
    steps: usize,
}

impl Episode {
    /// Starts over from `state` (`qpos ‖ qvel`): MuJoCo's reset, then the state, then
    /// `mj_forward` (so sensors describe it), the return 0.
    pub fn restart(&mut self, env: &MjcfEnv, state: &[f64]) -> Result<(), MjcfError> {
        let (nq, s) = (env.model.nq(), env.state_dim());
        if state.len() != s {
            return Err(env.size_error(
                "reset state",
                state.len(),
                s,
                "pass qpos ‖ qvel (MjcfEnv::reset_states gives rows of that size)",
            ));
        }
        self.data.reset();
        self.data.qpos_mut().copy_from_slice(&state[..nq]);
        self.data.qvel_mut().copy_from_slice(&state[nq..]);
        self.data.forward();
        self.alive = true;
        self.ret = 0.0;
        self.steps = 0;
        Ok(())
    }

    /// Whether the episode still runs (not terminated).
    pub fn alive(&self) -> bool {
        self.alive
    }

    /// The return so far.
    pub fn ret(&self) -> f64 {
        self.ret
    }

    /// Control steps taken (while alive).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The simulation.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Writes the observation `qpos ‖ qvel` (as f32) into `out` (`obs_dim` values).
    pub fn observe(&self, out: &mut [f32]) {
        let qpos = self.data.qpos();
        let values = qpos.iter().chain(self.data.qvel());
        for (o, v) in out.iter_mut().zip(values) {
            *o = *v as f32;
        }
    }

    /// One control step under `action` (`nu` values, clipped to `[−1, 1]`): returns the
    /// reward and whether the episode ended. A step of an ended episode does nothing and
    /// returns `(0, true)`.
    pub fn step(&mut self, env: &MjcfEnv, action: &[f32]) -> Result<(f64, bool), MjcfError> {
        if action.len() != env.action_dim() {
            return Err(env.size_error(
                "action",
                action.len(),
                env.action_dim(),
                "give one value per actuator (the model's nu)",
            ));
        }
        if !self.alive {
            return Ok((0.0, true));
        }
        let mut ctrl_sq = 0.0;
        for ((c, a), range) in self
            .data
            .ctrl_mut()
            .iter_mut()
            .zip(action)
            .zip(&env.ctrl_ranges)
        {
            // NaN becomes 0: a diverged policy pushes nothing.
            let a = if a.is_nan() {
                0.0
            } else {
                f64::from(a.clamp(-1.0, 1.0))
            };
            ctrl_sq += a * a;
            *c = match range {
                Some((lo, hi)) => lo + (a + 1.0) * 0.5 * (hi - lo),
                None => a,
            };
        }
        let before = self.data.unstable_count();
        for _ in 0..env.frame_skip {
            self.data.step();
        }
        self.steps += 1;
        let (reward, done) = if self.data.unstable_count() > before {
            (0.0, true)
        } else {
            let sensors = self.data.sensordata();
            let cost: f64 = env
                .costs
                .iter()
                .map(|&(adr, dim)| {
                    let v = sensors.get(adr..adr + dim).unwrap_or(&[]);
                    v.iter().map(|x| x * x).sum::<f64>().sqrt()
                })
                .sum();
            let qpos = self.data.qpos();
            let out = env.bounds.iter().any(|b| {
                qpos.get(b.qpos)
                    .is_some_and(|&q| !(b.lo..=b.hi).contains(&q))
            });
            (env.alive - env.ctrl_cost * ctrl_sq - cost, out)
        };
        self.ret += reward;
        self.alive = !done;
        Ok((reward, done))
    }
}
