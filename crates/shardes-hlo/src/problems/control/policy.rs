//! The policy: a deterministic tanh MLP `obs → a ∈ [−1, 1]^act`, every matmul through
//! [`nn::dense`].
//!
//! Layer `i` maps width `w_i` to `w_{i+1}` (`w_0` the observation size, the last width the
//! action size): `h_{i+1} = tanh(dense(h_i, W_i) + b_i)`, the output layer included (so
//! actions are bounded). Leaves are `layers.{i}.w` `(w_{i+1}, w_i)` and `layers.{i}.b`
//! `(w_{i+1},)`; `W_i = normal(fold_in(key, i), (w_{i+1}, w_i)) · w_i^-0.5`, `b_i = 0`.
//! With no hidden layer the policy is linear before its tanh.

use crate::builder::{HloError, Value};
use crate::es::{EsError, ModelParams};
use crate::nn::{self, Act, Weight};
use crate::params::{Array, ParamTree};
use crate::prng::{fold_in, normal, Key};
use crate::problems::transformer_block::inv_sqrt_d;
use crate::problems::ProblemError;

/// The widths of a policy: observation size, hidden sizes, action size.
pub fn widths(obs: usize, hidden: &[usize], act: usize) -> Vec<usize> {
    let mut w = Vec::with_capacity(hidden.len() + 2);
    w.push(obs);
    w.extend_from_slice(hidden);
    w.push(act);
    w
}

/// The path of layer `i`'s weight.
pub fn weight_path(i: usize) -> String {
    format!("layers.{i}.w")
}

/// The path of layer `i`'s bias.
pub fn bias_path(i: usize) -> String {
    format!("layers.{i}.b")
}

/// Initial parameters for `widths` (see the module docs).
pub fn init(key: Key, widths: &[usize]) -> Result<ParamTree, ProblemError> {
    let mut layers = Vec::with_capacity(widths.len().saturating_sub(1));
    for (i, pair) in (0u32..).zip(widths.windows(2)) {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let scale = inv_sqrt_d(fan_in);
        let w: Vec<f32> = normal(fold_in(key, i), &[fan_out, fan_in])?
            .into_iter()
            .map(|z| z * scale)
            .collect();
        layers.push(ParamTree::map([
            ("b", ParamTree::Leaf(Array::zeros(vec![fan_out])?)),
            ("w", ParamTree::Leaf(Array::new(vec![fan_out, fan_in], w)?)),
        ]));
    }
    Ok(ParamTree::map([("layers", ParamTree::List(layers))]))
}

/// A policy's parameters as one member chunk sees them, read once outside the rollout loop.
pub struct Policy {
    layers: Vec<(Weight, Act)>,
}

impl Policy {
    /// Reads the `layers` layers' weights (through the seam) and biases.
    pub fn read(p: &ModelParams, layers: usize) -> Result<Policy, EsError> {
        let layers = (0..layers)
            .map(|i| Ok((p.weight(&weight_path(i))?, p.tensor(&bias_path(i))?)))
            .collect::<Result<_, EsError>>()?;
        Ok(Policy { layers })
    }

    /// Members per chunk, if any parameter differs between members.
    pub fn members(&self) -> Option<i64> {
        self.layers
            .iter()
            .find_map(|(w, b)| w.members().or(b.members()))
    }

    /// The actions `[C?, E, act]` for observations `[C?, E, obs]` (with the member
    /// dimension exactly when [`Policy::members`] is `Some`).
    pub fn act(&self, obs: &Value) -> Result<Value, HloError> {
        let mut h = match self.members() {
            Some(_) => Act::per_member(obs.clone())?,
            None => Act::shared(obs.clone()),
        };
        for (w, b) in &self.layers {
            h = nn::dense(&h, w)?.add(b)?.map(|v| v.tanh())?;
        }
        // Under a bf16 compute dtype the layers run in bf16; the environment steps in the
        // observations' dtype.
        Ok(h.convert(obs.dtype())?.value().clone())
    }
}
