//! `tell` after the contraction: the per-device partial sums a run across processes
//! exchanges ([`Emitter::partials`]) and the update from the summed contraction
//! ([`Emitter::update`]: per-leaf sgd steps, or the optimizer's step with its state).

use crate::builder::{Func, Sharding, Value};

use super::super::error::{invalid, EsError};
use super::super::layout::Slot;
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

    /// The update from the sum `u` of every leaf that gets noise: the new parameter
    /// arguments from `slots` (the layout's, [`super::super::Layout::slots`]) and the
    /// optimizer's new state from `opt` (`θ − lr/(nσ) · u` under sgd, each leaf with its
    /// own σ; frozen leaves unchanged). Under plain sgd a layer stack whose layers share
    /// one σ steps as one value (`θ_stack − lr/(nσ) · [u_0; …; u_{L−1}]`, the same
    /// elementwise ops as leaf by leaf); otherwise each leaf steps on its own, read from
    /// and written back into its stack.
    pub(in crate::es) fn update(
        &self,
        f: &Func,
        slots: &[Value],
        u: Vec<Value>,
        opt: &[Value],
    ) -> Result<(Vec<Value>, Vec<Value>), EsError> {
        if self.layout.stacks.is_empty() || !self.plain_sgd() {
            let params = self.layout.views(slots)?;
            let (params, opt) = self.update_leaves(f, &params, u, opt)?;
            return Ok((self.layout.restack(params)?, opt));
        }
        self.check_sums(&u)?;
        let steps = Emission::new(&self.scales).steps(f, self.es.lr, self.es.n)?;
        // Each leaf's sum, by leaf position (frozen leaves have none).
        let mut u = u.into_iter();
        let sums: Vec<Option<Value>> = steps
            .iter()
            .map(|step| match step {
                Step::Frozen => None,
                _ => u.next(),
            })
            .collect();
        let missing = || {
            invalid(
                "one contraction per unfrozen leaf".into(),
                "contract every unfrozen leaf".into(),
            )
        };
        let layout = self.layout;
        let mut out = Vec::with_capacity(slots.len());
        for (slot, theta) in layout.slots().iter().zip(slots) {
            let next = match *slot {
                Slot::Leaf(p) => step(theta, &steps[p], sums[p].as_ref())?,
                Slot::Stack(s) => {
                    let st = &layout.stacks[s];
                    let p0 = st.positions[0];
                    let shared = st
                        .positions
                        .iter()
                        .all(|&p| self.scales[p] == self.scales[p0]);
                    match (&steps[p0], shared) {
                        (Step::Frozen, true) => theta.clone(),
                        (Step::Scalar(scale), true) => {
                            let rows = st
                                .positions
                                .iter()
                                .map(|&p| sums[p].clone().ok_or_else(missing))
                                .collect::<Result<Vec<Value>, EsError>>()?;
                            theta.sub(&st.join(&rows)?.mul(scale)?)?
                        }
                        _ => {
                            let rows = st
                                .positions
                                .iter()
                                .enumerate()
                                .map(|(l, &p)| {
                                    step(&st.row(theta, l)?, &steps[p], sums[p].as_ref())
                                })
                                .collect::<Result<Vec<Value>, EsError>>()?;
                            st.join(&rows)?
                        }
                    }
                }
            };
            out.push(next);
        }
        Ok((out, opt.to_vec()))
    }

    /// Whether the update is plain sgd (each leaf's own σ), not the optimizer's step.
    fn plain_sgd(&self) -> bool {
        matches!(self.es.optimizer.kind, OptimizerKind::Sgd)
            && self.es.optimizer.weight_decay == 0.0
    }

    /// Refuses a number of sums other than one per leaf that gets noise.
    fn check_sums(&self, u: &[Value]) -> Result<(), EsError> {
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
        Ok(())
    }

    /// [`Emitter::update`] on every leaf's value `params`.
    fn update_leaves(
        &self,
        f: &Func,
        params: &[Value],
        u: Vec<Value>,
        opt: &[Value],
    ) -> Result<(Vec<Value>, Vec<Value>), EsError> {
        self.check_sums(&u)?;
        // Plain sgd is the per-leaf σ update below; anything else (weight decay included)
        // is the optimizer's step, which takes one scalar σ.
        if !self.plain_sgd() {
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
            .zip(&steps)
            .map(|(theta, st)| {
                let sum = match st {
                    Step::Frozen => None,
                    _ => u.next(),
                };
                step(theta, st, sum.as_ref())
            })
            .collect::<Result<Vec<Value>, EsError>>()?;
        Ok((params, opt.to_vec()))
    }
}

/// One leaf's (or one stack's) sgd step from its sum `u` (`None` only when frozen).
fn step(theta: &Value, step: &Step, u: Option<&Value>) -> Result<Value, EsError> {
    let u = || {
        u.ok_or_else(|| {
            invalid(
                "one contraction per unfrozen leaf".into(),
                "contract every unfrozen leaf".into(),
            )
        })
    };
    Ok(match step {
        Step::Frozen => theta.clone(),
        Step::Scalar(scale) => theta.sub(&u()?.mul(scale)?)?,
        Step::Separable { s, scale } => theta.sub(&u()?.div(s)?.mul(scale)?)?,
    })
}
