//! `tell` after the contraction: the per-device partial sums a run across processes
//! exchanges ([`Emitter::partials`]) and the update from the summed contraction
//! ([`Emitter::update`]: per-leaf sgd steps, or the optimizer's step with its state).

use crate::builder::{Func, Sharding, Value};

use super::super::error::{invalid, EsError};
use super::super::optimizer::{OptimizerKind, Scales};
use super::super::sigma::{Emission, LeafScale, LeafSigma, Step};
use super::Emitter;

impl Emitter<'_> {
    /// The sum of [`Emitter::contraction`] before any sum across devices: per leaf that
    /// gets noise `[D · blocks, ..leaf shape]`, split over "pop", row `d · blocks + b` the
    /// sum over block `b` of device `d`'s members (each device's members cut in `blocks`
    /// equal blocks, in order, each summed from zero in the chunks `tell` uses for that
    /// many members). With the blocks of one process's devices standing for the devices of
    /// a larger run, adding the rows in order gives the bits of that run's all-reduce,
    /// which adds every device's sum in device order. Under `how = A` every device
    /// contracts every member, so all devices' rows are the same.
    pub(in crate::es) fn partials(
        &self,
        base_key: &Value,
        weights: &Value,
        blocks: usize,
    ) -> Result<Vec<Value>, EsError> {
        let f = base_key.func();
        let (member_sh, weights) = self.place_members(weights)?;
        let ids = self.member_ids(&f, &member_sh)?;
        let inputs: Vec<&Value> = vec![&ids, &weights, base_key];
        let in_sh = vec![member_sh.clone(), member_sh, Sharding::replicated(1)];
        let leaves = &self.active;
        let out_sh = leaves
            .iter()
            .map(|l| Sharding::split(l.shape.len() + 1, 0))
            .collect::<Result<Vec<_>, _>>()?;
        let blocks = blocks.max(1) as i64;
        f.manual_computation(
            &inputs,
            &in_sh,
            &out_sh,
            |loc| -> Result<Vec<Value>, EsError> {
                let (ids, w, key) = (&loc[0], &loc[1], &loc[2]);
                let per = ids.shape()[0] / blocks;
                let mut rows: Vec<Vec<Value>> = vec![Vec::new(); leaves.len()];
                for b in 0..blocks {
                    let (lo, hi) = (b * per, (b + 1) * per);
                    let u = self.contract_local(
                        &ids.slice_in_dim(lo, hi, 0)?,
                        &w.slice_in_dim(lo, hi, 0)?,
                        key,
                        leaves,
                        None,
                        false,
                    )?;
                    for ((row, v), l) in rows.iter_mut().zip(u).zip(leaves) {
                        let mut shape = vec![1];
                        shape.extend_from_slice(&l.shape);
                        row.push(v.reshape(&shape)?);
                    }
                }
                rows.iter()
                    .map(|r| {
                        let r: Vec<&Value> = r.iter().collect();
                        Ok(loc[0].func().concatenate(&r, 0)?)
                    })
                    .collect()
            },
        )
    }

    /// The update from the sum `u` of every leaf that gets noise: new parameters and the
    /// optimizer's new state from `opt` (`θ − lr/(nσ) · u` under sgd, each leaf with its
    /// own σ; frozen leaves unchanged).
    pub(in crate::es) fn update(
        &self,
        f: &Func,
        params: &[Value],
        u: Vec<Value>,
        opt: &[Value],
    ) -> Result<(Vec<Value>, Vec<Value>), EsError> {
        if u.len() != self.active.len() {
            return Err(invalid(
                format!(
                    "{} sums for {} leaves that get noise",
                    u.len(),
                    self.active.len()
                ),
                "pass one sum per unfrozen leaf, in leaf order".into(),
            ));
        }
        // Plain sgd is the per-leaf σ update below; anything else (weight decay included)
        // is the optimizer's step, which takes one scalar σ.
        let plain_sgd = matches!(self.es.optimizer.kind, OptimizerKind::Sgd)
            && self.es.optimizer.weight_decay == 0.0;
        if !plain_sgd {
            let uniform = self.scales.iter().all(
                |s| matches!(s, LeafScale::Sigma(LeafSigma::Scalar(x)) if *x == self.es.sigma),
            );
            if !uniform {
                return Err(invalid(
                    format!(
                        "es.optimizer = {} with per-leaf or separable σ or frozen leaves",
                        self.es.optimizer.name()
                    ),
                    "use sgd with es.sigma_leaves, es.sigma_separable or es.freeze, or one \
                     scalar es.sigma with this optimizer"
                        .into(),
                ));
            }
            // The f32 factors, computed once: `lr`, `lr/(nσ)` and `1/(nσ)`.
            let scales = Scales {
                lr: self.es.lr,
                update: self.es.update_scale(),
                grad: 1.0 / (self.es.n as f32 * self.es.sigma),
            };
            return self.es.optimizer.step(scales, params, &u, opt);
        }
        // sgd: each leaf's own `lr/(nσ_j)` (separable: `u ⊘ p qᵀ` then `lr/n`); with one σ
        // everywhere this is today's `θ − lr/(nσ) · u`, the same ops.
        let mut u = u.into_iter();
        let steps = Emission::new(&self.scales).steps(f, self.es.lr, self.es.n)?;
        let params = params
            .iter()
            .zip(steps)
            .map(|(theta, step)| {
                let mut next = || {
                    u.next().ok_or_else(|| {
                        invalid(
                            "one contraction per unfrozen leaf".into(),
                            "contract every unfrozen leaf".into(),
                        )
                    })
                };
                Ok(match step {
                    Step::Frozen => theta.clone(),
                    Step::Scalar(scale) => theta.sub(&next()?.mul(&scale)?)?,
                    Step::Separable { s, scale } => theta.sub(&next()?.div(&s)?.mul(&scale)?)?,
                })
            })
            .collect::<Result<Vec<Value>, EsError>>()?;
        Ok((params, opt.to_vec()))
    }
}
