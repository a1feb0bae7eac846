//! Optimizers on the ES gradient: how `tell` turns the contraction `u` into a step.
//!
//! The ES gradient estimate of leaf `j` is `g_j = u_j / (n σ)` (semantics.md, "Update"); `lr`
//! is `es.lr`. With `c = 1/(nσ)`, `lr·wd` and the `(1 − β)` factors f32 scalars computed once
//! on the host, every rule is elementwise per leaf except ClipUp's two global norms:
//!
//! | optimizer | state (per leaf unless noted) | step |
//! |---|---|---|
//! | `sgd` (default) | none | `θ ← θ − lr/(nσ) · u`, today's update op for op |
//! | `momentum` | `velocity` | `v ← g + μ v`; `θ ← θ − lr v` (optax `sgd(momentum=μ)`) |
//! | `adam` | `m`, `v`, `count` (one scalar) | `m ← (1−β₁) g + β₁ m`; `v ← (1−β₂) g² + β₂ v`; `t ← t + 1`; `θ ← θ − lr · m̂ / (√v̂ + ε)` with `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)` (optax `adam`) |
//! | `clipup` | `velocity` | `ĝ = g / (‖g‖ + ε)`; `V ← μ V + lr ĝ`; `V ← V · s/‖V‖` where `‖V‖ > s`; `θ ← θ − V` (Toklu et al. 2020) |
//!
//! Norms are global: `‖x‖² = Σ_j Σ x_j²` over every leaf, accumulated in f32. ClipUp's
//! velocity is kept in parameter units, as the paper writes it; evosax's `clipup` keeps it
//! divided by `lr` and clips at `max_speed / lr`, which is the same step.
//!
//! **Weight decay** (`weight_decay = wd`, default 0) is *decoupled*, as optax's
//! `add_decayed_weights` before `scale_by_learning_rate` (AdamW): after its own step, every
//! optimizer subtracts `lr · wd · θ`, with `θ` the parameters before the step. Coupled decay
//! (adding `wd θ` to `g`) would have Adam and ClipUp normalize the decay away with the
//! gradient, and the ES gradient's scale depends on the shaping, not on the loss. ClipUp's
//! speed limit applies to its velocity, not to the decay.
//!
//! Defaults follow optax (which evosax's distribution-based strategies take their optimizer
//! from): `momentum = 0.9`; Adam `b1 = 0.9`, `b2 = 0.999`, `eps = 1e-8`; ClipUp
//! `momentum = 0.9`, `eps = 1e-8` and no default `max_speed` (its authors suggest
//! `lr = max_speed / 2`).
//!
//! The state is zero at the start, f32 like the parameters (Adam's `count` too: it counts
//! exactly to 2²⁴, and by then `β₂ᵗ` is 0 in f32, so a count that stops there changes
//! nothing), replicated, and donated from one generation to the next.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::builder::{TensorType, Value};

use super::error::{invalid, EsError};
use super::strategy::LeafInfo;

/// The optimizer names a config accepts, in [`OptimizerName`]'s order.
pub const OPTIMIZER_NAMES: [&str; 4] = ["sgd", "momentum", "adam", "clipup"];

/// The keys of an `[es.optimizer]` table: `name` and every hyper-parameter of any optimizer.
pub const OPTIMIZER_KEYS: [&str; 7] = [
    "name",
    "momentum",
    "b1",
    "b2",
    "eps",
    "max_speed",
    "weight_decay",
];

/// Default momentum of `momentum` and `clipup`.
pub const DEFAULT_MOMENTUM: f32 = 0.9;
/// Default Adam `b1`.
pub const DEFAULT_B1: f32 = 0.9;
/// Default Adam `b2`.
pub const DEFAULT_B2: f32 = 0.999;
/// Default `eps` of Adam's denominator and ClipUp's gradient normalization.
pub const DEFAULT_EPS: f32 = 1e-8;

/// An optimizer's update rule and its hyper-parameters (validated by the ES that uses it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    /// Plain gradient descent: today's update.
    Sgd,
    /// Heavy-ball momentum.
    Momentum {
        /// The velocity's decay μ, in `[0, 1)`.
        momentum: f32,
    },
    /// Adam with bias correction.
    Adam {
        /// First-moment decay, in `[0, 1)`.
        b1: f32,
        /// Second-moment decay, in `[0, 1)`.
        b2: f32,
        /// Added to `√v̂`, > 0.
        eps: f32,
    },
    /// ClipUp: normalized gradient, momentum, velocity clipped to a maximum speed.
    ClipUp {
        /// The velocity's decay, in `[0, 1)`.
        momentum: f32,
        /// The largest `‖V‖`, i.e. the largest step (before weight decay), > 0.
        max_speed: f32,
        /// Added to `‖g‖` before dividing, > 0.
        eps: f32,
    },
}

/// How `tell` steps on the ES gradient: a rule and decoupled weight decay (module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Optimizer {
    /// The update rule.
    pub kind: OptimizerKind,
    /// Decoupled weight decay `wd` (the step subtracts `lr · wd · θ`), ≥ 0.
    pub weight_decay: f32,
}

impl Default for Optimizer {
    fn default() -> Self {
        Optimizer::sgd()
    }
}

impl Optimizer {
    /// `sgd`, today's update (the default).
    pub fn sgd() -> Optimizer {
        Optimizer {
            kind: OptimizerKind::Sgd,
            weight_decay: 0.0,
        }
    }

    /// `momentum` with decay `momentum`.
    pub fn momentum(momentum: f32) -> Optimizer {
        Optimizer {
            kind: OptimizerKind::Momentum { momentum },
            weight_decay: 0.0,
        }
    }

    /// `adam` with optax's defaults (`b1 = 0.9`, `b2 = 0.999`, `eps = 1e-8`).
    pub fn adam() -> Optimizer {
        Optimizer {
            kind: OptimizerKind::Adam {
                b1: DEFAULT_B1,
                b2: DEFAULT_B2,
                eps: DEFAULT_EPS,
            },
            weight_decay: 0.0,
        }
    }

    /// `clipup` with the maximum speed `max_speed`, `momentum = 0.9`, `eps = 1e-8`.
    pub fn clipup(max_speed: f32) -> Optimizer {
        Optimizer {
            kind: OptimizerKind::ClipUp {
                momentum: DEFAULT_MOMENTUM,
                max_speed,
                eps: DEFAULT_EPS,
            },
            weight_decay: 0.0,
        }
    }

    /// The same rule with decoupled weight decay `wd`.
    pub fn with_weight_decay(mut self, wd: f32) -> Optimizer {
        self.weight_decay = wd;
        self
    }

    /// The name a config writes: `sgd`, `momentum`, `adam`, `clipup`.
    pub fn name(&self) -> OptimizerName {
        match self.kind {
            OptimizerKind::Sgd => OptimizerName::Sgd,
            OptimizerKind::Momentum { .. } => OptimizerName::Momentum,
            OptimizerKind::Adam { .. } => OptimizerName::Adam,
            OptimizerKind::ClipUp { .. } => OptimizerName::ClipUp,
        }
    }

    /// The state tensors on the devices, in program order: names and types. `sgd`: none;
    /// `momentum` and `clipup`: `velocity.PATH` per leaf; `adam`: `m.PATH` per leaf, then
    /// `v.PATH` per leaf, then the scalar `count`. These are also the tensor names of a
    /// checkpoint's optimizer file.
    pub fn state_types(&self, leaves: &[LeafInfo]) -> Vec<(String, TensorType)> {
        let per_leaf = |prefix: &str| {
            leaves
                .iter()
                .map(|l| (format!("{prefix}.{}", l.path), TensorType::f32(&l.shape)))
                .collect::<Vec<_>>()
        };
        match self.kind {
            OptimizerKind::Sgd => Vec::new(),
            OptimizerKind::Momentum { .. } | OptimizerKind::ClipUp { .. } => per_leaf("velocity"),
            OptimizerKind::Adam { .. } => {
                let mut out = per_leaf("m");
                out.extend(per_leaf("v"));
                out.push(("count".into(), TensorType::f32(&[])));
                out
            }
        }
    }

    /// The step of `tell`: new parameters and state from the parameters, the contraction
    /// `u` (one per leaf) and the state ([`Optimizer::state_types`]' order). `s` holds the
    /// host-computed factors. Under `sgd` without decay these are exactly the ops of the
    /// update before optimizers existed.
    pub(super) fn step(
        &self,
        s: Scales,
        params: &[Value],
        u: &[Value],
        state: &[Value],
    ) -> Result<(Vec<Value>, Vec<Value>), EsError> {
        let Some(first) = params.first() else {
            return Ok((Vec::new(), state.to_vec()));
        };
        let f = first.func();
        let nl = params.len();
        let want = self.state_len(nl);
        if u.len() != nl || state.len() != want {
            return Err(invalid(
                format!(
                    "the {} step got {} contractions and {} state values for {nl} leaves",
                    self.name(),
                    u.len(),
                    state.len()
                ),
                format!("pass one contraction per leaf and {want} state values"),
            ));
        }
        let decay = if self.weight_decay != 0.0 {
            Some(f.scalar(s.lr * self.weight_decay)?)
        } else {
            None
        };
        // θ' = θ − step, then the decay from the θ before the step. Called leaf by leaf as
        // each step is ready, so sgd emits its ops in the order it always has.
        let finish = |theta: &Value, step: &Value| -> Result<Value, EsError> {
            let out = theta.sub(step)?;
            Ok(match &decay {
                Some(d) => out.sub(&theta.mul(d)?)?,
                None => out,
            })
        };
        let grads = || -> Result<Vec<Value>, EsError> {
            let c = f.scalar(s.grad)?;
            u.iter().map(|u| Ok(u.mul(&c)?)).collect()
        };
        let mut out = Vec::with_capacity(nl);
        let next = match self.kind {
            OptimizerKind::Sgd => {
                let scale = f.scalar(s.update)?;
                for (theta, u) in params.iter().zip(u) {
                    out.push(finish(theta, &u.mul(&scale)?)?);
                }
                Vec::new()
            }
            OptimizerKind::Momentum { momentum } => {
                let g = grads()?;
                let (mu, lr) = (f.scalar(momentum)?, f.scalar(s.lr)?);
                let mut velocity = Vec::with_capacity(nl);
                for ((theta, g), v) in params.iter().zip(&g).zip(state) {
                    let v = g.add(&v.mul(&mu)?)?;
                    out.push(finish(theta, &v.mul(&lr)?)?);
                    velocity.push(v);
                }
                velocity
            }
            OptimizerKind::Adam { b1, b2, eps } => {
                let g = grads()?;
                let (m, rest) = state.split_at(nl);
                let (v, count) = rest.split_at(nl);
                let one = f.scalar(1.0f32)?;
                let t = count[0].add(&one)?;
                let (b1v, b2v) = (f.scalar(b1)?, f.scalar(b2)?);
                let (c1, c2) = (f.scalar(1.0f32 - b1)?, f.scalar(1.0f32 - b2)?);
                let bc1 = one.sub(&b1v.pow(&t)?)?;
                let bc2 = one.sub(&b2v.pow(&t)?)?;
                let (eps, lr) = (f.scalar(eps)?, f.scalar(s.lr)?);
                let mut m_next = Vec::with_capacity(2 * nl + 1);
                let mut v_next = Vec::with_capacity(nl);
                for (((theta, g), m), v) in params.iter().zip(&g).zip(m).zip(v) {
                    let m2 = g.mul(&c1)?.add(&m.mul(&b1v)?)?;
                    let v2 = g.mul(g)?.mul(&c2)?.add(&v.mul(&b2v)?)?;
                    let mhat = m2.div(&bc1)?;
                    let vhat = v2.div(&bc2)?;
                    let step = mhat.div(&vhat.sqrt()?.add(&eps)?)?.mul(&lr)?;
                    out.push(finish(theta, &step)?);
                    m_next.push(m2);
                    v_next.push(v2);
                }
                m_next.extend(v_next);
                m_next.push(t);
                m_next
            }
            OptimizerKind::ClipUp {
                momentum,
                max_speed,
                eps,
            } => {
                let g = grads()?;
                let denom = global_norm(&g)?.add(&f.scalar(eps)?)?;
                let (mu, lr) = (f.scalar(momentum)?, f.scalar(s.lr)?);
                let v: Vec<Value> = g
                    .iter()
                    .zip(state)
                    .map(|(g, v)| Ok(v.mul(&mu)?.add(&g.div(&denom)?.mul(&lr)?)?))
                    .collect::<Result<_, EsError>>()?;
                let speed = global_norm(&v)?;
                let max = f.scalar(max_speed)?;
                let factor = speed
                    .gt(&max)?
                    .select(&max.div(&speed)?, &f.scalar(1.0f32)?)?;
                let mut velocity = Vec::with_capacity(nl);
                for (theta, v) in params.iter().zip(&v) {
                    let v = v.mul(&factor)?;
                    out.push(finish(theta, &v)?);
                    velocity.push(v);
                }
                velocity
            }
        };
        Ok((out, next))
    }

    fn state_len(&self, leaves: usize) -> usize {
        match self.kind {
            OptimizerKind::Sgd => 0,
            OptimizerKind::Momentum { .. } | OptimizerKind::ClipUp { .. } => leaves,
            OptimizerKind::Adam { .. } => 2 * leaves + 1,
        }
    }
}

/// `‖x‖₂` over every element of every value (f32 scalar), leaf sums added in order.
fn global_norm(xs: &[Value]) -> Result<Value, EsError> {
    let mut total: Option<Value> = None;
    for x in xs {
        let dims: Vec<usize> = (0..x.rank()).collect();
        let sq = x.mul(x)?.reduce_sum(&dims)?;
        total = Some(match total {
            Some(t) => t.add(&sq)?,
            None => sq,
        });
    }
    match total {
        Some(t) => Ok(t.sqrt()?),
        None => Err(invalid(
            "a global norm over no values".into(),
            "give the optimizer at least one leaf".into(),
        )),
    }
}

/// The f32 factors of a step, computed once on the host from the ES's settings.
#[derive(Clone, Copy, Debug)]
pub(super) struct Scales {
    /// `lr`.
    pub(super) lr: f32,
    /// `lr / (nσ)`, sgd's factor on `u` ([`super::ShardedES::update_scale`]).
    pub(super) update: f32,
    /// `1 / (nσ)`, the factor from `u` to the gradient estimate.
    pub(super) grad: f32,
}

/// Refuses hyper-parameters out of range. `config` names them as the config's keys
/// (`es.optimizer.b1`), otherwise by their own names (`b1`).
pub(super) fn check(opt: &Optimizer, config: bool) -> Result<(), EsError> {
    let key = |name: &str| {
        if config {
            format!("es.optimizer.{name}")
        } else {
            format!("optimizer {name}")
        }
    };
    let decay = |name: &str, v: f32| {
        if (0.0..1.0).contains(&v) {
            Ok(())
        } else {
            Err(invalid(
                format!("{} = {v} is not in [0, 1)", key(name)),
                format!("set {} to a decay such as 0.9", key(name)),
            ))
        }
    };
    let positive = |name: &str, v: f32, example: &str| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(invalid(
                format!("{} = {v} is not a finite number > 0", key(name)),
                format!("set {} to a positive number, e.g. {example}", key(name)),
            ))
        }
    };
    match opt.kind {
        OptimizerKind::Sgd => {}
        OptimizerKind::Momentum { momentum } => decay("momentum", momentum)?,
        OptimizerKind::Adam { b1, b2, eps } => {
            decay("b1", b1)?;
            decay("b2", b2)?;
            positive("eps", eps, "1e-8")?;
        }
        OptimizerKind::ClipUp {
            momentum,
            max_speed,
            eps,
        } => {
            decay("momentum", momentum)?;
            positive("max_speed", max_speed, "0.3")?;
            positive("eps", eps, "1e-8")?;
        }
    }
    let wd = opt.weight_decay;
    if !(wd.is_finite() && wd >= 0.0) {
        return Err(invalid(
            format!("{} = {wd} is not a finite number ≥ 0", key("weight_decay")),
            format!(
                "set {} to 0 (none) or a small number such as 1e-4",
                key("weight_decay")
            ),
        ));
    }
    Ok(())
}

/// An optimizer by name, as a config writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OptimizerName {
    /// `sgd` (default).
    #[default]
    Sgd,
    /// `momentum`.
    Momentum,
    /// `adam`.
    Adam,
    /// `clipup`.
    ClipUp,
}

impl OptimizerName {
    /// Every name, in [`OPTIMIZER_NAMES`]' order.
    pub const ALL: [OptimizerName; 4] = [
        OptimizerName::Sgd,
        OptimizerName::Momentum,
        OptimizerName::Adam,
        OptimizerName::ClipUp,
    ];

    /// The keys of `[es.optimizer]` besides `name` that this optimizer reads.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            OptimizerName::Sgd => &["weight_decay"],
            OptimizerName::Momentum => &["momentum", "weight_decay"],
            OptimizerName::Adam => &["b1", "b2", "eps", "weight_decay"],
            OptimizerName::ClipUp => &["momentum", "max_speed", "eps", "weight_decay"],
        }
    }

    fn index(self) -> usize {
        OptimizerName::ALL
            .iter()
            .position(|&n| n == self)
            .unwrap_or(0)
    }
}

impl fmt::Display for OptimizerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(OPTIMIZER_NAMES[self.index()])
    }
}

/// An optimizer name that is not one of [`OPTIMIZER_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown optimizer \"{input}\" (valid: {})", OPTIMIZER_NAMES.join(", "))]
pub struct OptimizerNameError {
    /// The name given, as [`super::spec::excerpt`] quotes it.
    pub input: String,
}

impl OptimizerNameError {
    /// The valid names, for a front end that suggests the nearest.
    pub fn valid(&self) -> &'static [&'static str] {
        &OPTIMIZER_NAMES
    }
}

impl FromStr for OptimizerName {
    type Err = OptimizerNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OptimizerName::ALL
            .into_iter()
            .find(|n| n.to_string() == s)
            .ok_or_else(|| OptimizerNameError {
                input: super::spec::excerpt(s),
            })
    }
}

super::spec::serde_as_text!(OptimizerName);

/// `es.optimizer` as written: a name (`"adam"`) or a table with `name` and any of the
/// optimizer's keys (`{ name = "clipup", max_speed = 0.3 }`). Keys left out are `None` (the
/// resolved config records what was written); [`OptimizerSpec::resolve`] fills in the
/// defaults and refuses keys the optimizer does not read.
// `remote = "Self"` makes the derives inherent functions (the table form); the trait impls
// below add the bare name.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct OptimizerSpec {
    /// The optimizer (default `sgd`).
    pub name: OptimizerName,
    /// `momentum` and `clipup`: the velocity's decay (default 0.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f32>,
    /// `adam`: first-moment decay (default 0.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b1: Option<f32>,
    /// `adam`: second-moment decay (default 0.999).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b2: Option<f32>,
    /// `adam` and `clipup`: the denominator's epsilon (default 1e-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f32>,
    /// `clipup`: the largest step (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_speed: Option<f32>,
    /// Decoupled weight decay, any optimizer (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f32>,
}

impl<'de> Deserialize<'de> for OptimizerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameOrTable;
        impl<'de> Visitor<'de> for NameOrTable {
            type Value = OptimizerSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "an optimizer name ({}) or a table with `name` and its settings",
                    OPTIMIZER_NAMES.join(", ")
                )
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<OptimizerSpec, E> {
                s.parse::<OptimizerName>()
                    .map(OptimizerSpec::from)
                    .map_err(E::custom)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<OptimizerSpec, A::Error> {
                OptimizerSpec::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_any(NameOrTable)
    }
}

impl Serialize for OptimizerSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.written().is_empty() {
            s.collect_str(&self.name)
        } else {
            OptimizerSpec::serialize(self, s)
        }
    }
}

impl From<OptimizerName> for OptimizerSpec {
    fn from(name: OptimizerName) -> Self {
        OptimizerSpec {
            name,
            ..OptimizerSpec::default()
        }
    }
}

impl OptimizerSpec {
    /// Whether this is `sgd` with nothing else written: the default, which a config leaves
    /// out when it writes itself back (so configs from before optimizers hash the same).
    pub fn is_default(&self) -> bool {
        *self == OptimizerSpec::default()
    }

    /// The keys written besides `name`, with their values, in [`OPTIMIZER_KEYS`]' order.
    fn written(&self) -> Vec<(&'static str, f32)> {
        [
            ("momentum", self.momentum),
            ("b1", self.b1),
            ("b2", self.b2),
            ("eps", self.eps),
            ("max_speed", self.max_speed),
            ("weight_decay", self.weight_decay),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }

    /// The optimizer this describes, defaults filled in. Refuses a key the optimizer does
    /// not read and `clipup` without `max_speed`, naming `es.optimizer.KEY`. The numbers
    /// are checked when the ES is built.
    pub fn resolve(&self) -> Result<Optimizer, EsError> {
        let name = self.name;
        if let Some((key, _)) = self
            .written()
            .into_iter()
            .find(|(k, _)| !name.keys().contains(k))
        {
            return Err(invalid(
                format!("es.optimizer.{key} is not a setting of {name}"),
                format!(
                    "remove it; {name} reads: {} (see the README's optimizer table)",
                    name.keys().join(", ")
                ),
            ));
        }
        let momentum = self.momentum.unwrap_or(DEFAULT_MOMENTUM);
        let eps = self.eps.unwrap_or(DEFAULT_EPS);
        let kind = match name {
            OptimizerName::Sgd => OptimizerKind::Sgd,
            OptimizerName::Momentum => OptimizerKind::Momentum { momentum },
            OptimizerName::Adam => OptimizerKind::Adam {
                b1: self.b1.unwrap_or(DEFAULT_B1),
                b2: self.b2.unwrap_or(DEFAULT_B2),
                eps,
            },
            OptimizerName::ClipUp => OptimizerKind::ClipUp {
                momentum,
                max_speed: self.max_speed.ok_or_else(|| {
                    invalid(
                        "es.optimizer.max_speed: clipup needs its max speed (the largest \
                         step ‖Δθ‖ per generation); it has no default"
                            .into(),
                        "write es.optimizer = { name = \"clipup\", max_speed = 0.3 } (ClipUp's \
                         authors suggest es.lr = max_speed / 2)"
                            .into(),
                    )
                })?,
                eps,
            },
        };
        Ok(Optimizer {
            kind,
            weight_decay: self.weight_decay.unwrap_or(0.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<OptimizerSpec, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for (name, text) in OptimizerName::ALL.iter().zip(OPTIMIZER_NAMES) {
            assert_eq!(name.to_string(), text);
            assert_eq!(text.parse::<OptimizerName>().unwrap(), *name);
        }
        let e = "adamw".parse::<OptimizerName>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown optimizer \"adamw\" (valid: sgd, momentum, adam, clipup)"
        );
        assert_eq!(e.valid(), OPTIMIZER_NAMES);
    }

    #[test]
    fn a_name_alone_reads_and_writes_as_the_name() {
        let s = spec(r#""clipup""#).unwrap();
        assert_eq!(s, OptimizerSpec::from(OptimizerName::ClipUp));
        assert_eq!(serde_json::to_string(&s).unwrap(), r#""clipup""#);
        let e = spec(r#""Adam""#).unwrap_err();
        assert!(e.contains("unknown optimizer \"Adam\""), "{e}");
        let e = spec("3").unwrap_err();
        assert!(
            e.contains("an optimizer name (sgd, momentum, adam, clipup) or a table"),
            "{e}"
        );
        let e = spec(r#"{"b1": 0.5}"#).unwrap_err();
        assert!(e.contains("missing field `name`"), "{e}");
    }

    #[test]
    fn a_table_reads_its_keys_and_refuses_unknown_ones() {
        let s = spec(r#"{"name": "adam", "b1": 0.8, "weight_decay": 0.01}"#).unwrap();
        assert_eq!(
            (s.name, s.b1, s.weight_decay),
            (OptimizerName::Adam, Some(0.8), Some(0.01))
        );
        let opt = s.resolve().unwrap();
        assert_eq!(
            opt,
            Optimizer {
                kind: OptimizerKind::Adam {
                    b1: 0.8,
                    b2: DEFAULT_B2,
                    eps: DEFAULT_EPS
                },
                weight_decay: 0.01
            }
        );
        let e = spec(r#"{"name": "adam", "beta1": 0.8}"#).unwrap_err();
        assert!(e.contains("unknown field `beta1`"), "{e}");
        let e = spec(r#"{"name": "adm"}"#).unwrap_err();
        assert!(e.contains("unknown optimizer \"adm\""), "{e}");
        // Written back with only what was written.
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"name":"adam","b1":0.8,"weight_decay":0.01}"#
        );
    }

    #[test]
    fn resolve_fills_defaults_and_refuses_what_the_optimizer_does_not_read() {
        assert_eq!(
            OptimizerSpec::default().resolve().unwrap(),
            Optimizer::sgd()
        );
        assert!(OptimizerSpec::default().is_default());
        assert_eq!(
            OptimizerSpec::from(OptimizerName::Momentum)
                .resolve()
                .unwrap(),
            Optimizer::momentum(0.9)
        );
        assert_eq!(
            OptimizerSpec::from(OptimizerName::Adam).resolve().unwrap(),
            Optimizer::adam()
        );
        let e = OptimizerSpec::from(OptimizerName::ClipUp)
            .resolve()
            .unwrap_err();
        assert!(
            e.message()
                .starts_with("es.optimizer.max_speed: clipup needs its max speed"),
            "{e}"
        );
        assert!(e.fix().unwrap().contains("max_speed = 0.3"), "{e}");
        let mut s = OptimizerSpec::from(OptimizerName::ClipUp);
        s.max_speed = Some(0.2);
        assert_eq!(s.resolve().unwrap(), Optimizer::clipup(0.2));
        let mut s = OptimizerSpec::from(OptimizerName::Momentum);
        s.b1 = Some(0.5);
        let e = s.resolve().unwrap_err();
        assert_eq!(e.message(), "es.optimizer.b1 is not a setting of momentum");
        assert!(
            e.fix()
                .unwrap()
                .contains("momentum reads: momentum, weight_decay"),
            "{e}"
        );
    }

    #[test]
    fn numbers_out_of_range_name_the_key() {
        let msg = |o: Optimizer, config| check(&o, config).unwrap_err().message();
        assert_eq!(
            msg(Optimizer::momentum(1.0), true),
            "es.optimizer.momentum = 1 is not in [0, 1)"
        );
        assert_eq!(
            msg(Optimizer::momentum(-0.1), false),
            "optimizer momentum = -0.1 is not in [0, 1)"
        );
        let mut adam = Optimizer::adam();
        if let OptimizerKind::Adam { eps, .. } = &mut adam.kind {
            *eps = 0.0;
        }
        assert_eq!(
            msg(adam, true),
            "es.optimizer.eps = 0 is not a finite number > 0"
        );
        assert_eq!(
            msg(Optimizer::clipup(f32::NAN), true),
            "es.optimizer.max_speed = NaN is not a finite number > 0"
        );
        assert_eq!(
            msg(Optimizer::sgd().with_weight_decay(-1.0), true),
            "es.optimizer.weight_decay = -1 is not a finite number ≥ 0"
        );
        for ok in [
            Optimizer::sgd(),
            Optimizer::momentum(0.0),
            Optimizer::adam(),
            Optimizer::clipup(0.3).with_weight_decay(0.1),
        ] {
            check(&ok, true).unwrap();
        }
    }

    #[test]
    fn state_follows_the_rule() {
        let leaves = [
            LeafInfo {
                index: 0,
                path: "b".into(),
                shape: vec![3],
            },
            LeafInfo {
                index: 1,
                path: "w".into(),
                shape: vec![3, 2],
            },
        ];
        let names = |o: Optimizer| -> Vec<String> {
            o.state_types(&leaves).into_iter().map(|(n, _)| n).collect()
        };
        assert!(names(Optimizer::sgd()).is_empty());
        assert_eq!(
            names(Optimizer::momentum(0.9)),
            ["velocity.b", "velocity.w"]
        );
        assert_eq!(names(Optimizer::clipup(0.1)), ["velocity.b", "velocity.w"]);
        assert_eq!(
            names(Optimizer::adam()),
            ["m.b", "m.w", "v.b", "v.w", "count"]
        );
        let types = Optimizer::adam().state_types(&leaves);
        assert_eq!(types[1].1, TensorType::f32(&[3, 2]));
        assert_eq!(types[4].1, TensorType::f32(&[]));
        assert_eq!(Optimizer::adam().state_len(2), 5);
    }
}
