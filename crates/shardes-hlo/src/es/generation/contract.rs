//! `tell`'s contraction `u_j = Σ_i w_i s_i ε_j(i)`: the members' placement, the noise it
//! regenerates (or reads from what `apply` kept), leaf by leaf or, with a layer group, the
//! layers' leaves in a loop over the layer index ([`super::super::layers`]).

use crate::builder::{DotDims, Sharding, Value};
use crate::prng::emit::Keys;

use super::super::error::{invalid, EsError};
use super::super::layers::LayerGroup;
use super::super::sigma;
use super::super::spec::How;
use super::super::strategy::{LeafInfo, Noise};
use super::{directions, materialize, noise_from_values, scale_rows, Emitter};

/// `values` summed over the devices (one all-reduce each) when `reduce`, else as they are.
fn all_reduce_if(values: Vec<Value>, reduce: bool) -> Result<Vec<Value>, EsError> {
    if !reduce {
        return Ok(values);
    }
    values.iter().map(|v| Ok(v.all_reduce_sum()?)).collect()
}

impl Emitter<'_> {
    /// The noise `tell` regenerates under `how = A`
    /// ([`crate::es::Strategy::noise_contracted`]): every
    /// device draws the whole population's, so the draw is most of `tell` and nothing shares
    /// it with `apply` (whose directions are the device's own). Dense noise is read once, by
    /// the contraction, so it is not passed through [`materialize`]: XLA fuses the draw,
    /// `erf_inv` and the contraction into one kernel per leaf, and skips `remainder`'s
    /// per-element `fmodf` (7 % of a qiu_d256 generation under `how = A`). The values are
    /// the same bits: `remainder(z, +inf)` is the identity. Factors are read `k` (or `m`)
    /// times by their product, so they still go through [`materialize`].
    fn contracted_noise(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs: &Value,
    ) -> Result<Vec<Noise>, EsError> {
        let noise = self.es.strategy.noise_contracted(streams, leaves, dirs)?;
        noise
            .into_iter()
            .map(|n| match n {
                Noise::Dense(_) => Ok(n),
                factors => Ok(materialize(vec![factors])?.remove(0)),
            })
            .collect()
    }

    /// `tell`'s contraction `u_j = Σ_i w_i s_i ε_j(i)` over the given members (local ids
    /// for `B`, all ids for `A`), with `reduce` summed over the devices (an all-reduce).
    /// Runs inside the manual computation.
    pub(super) fn contract_local(
        &self,
        ids: &Value,
        weights: &Value,
        base_key: &Value,
        leaves: &[LeafInfo],
        kept: Option<Vec<Noise>>,
        reduce: bool,
    ) -> Result<Vec<Value>, EsError> {
        let count = ids.shape()[0];
        let p = self.es.strategy.pairing() as i64;
        let (dirs_all, signs) = directions(ids, p)?;
        let mut coef = weights.mul(&signs)?;
        if p > 1 {
            coef = coef.reshape(&[count / p, p])?.reduce_sum(&[1])?;
        }
        let cd = self
            .es
            .tell_chunk_after(leaves, (count / p) as usize, Some(self.chunk))
            as i64;
        let base = Keys::from_data(base_key)?;
        // `with_layers` made no group for a strategy that materializes its noise.
        if let (Some(group), None) = (&self.layers, &kept) {
            if leaves.len() == self.active.len() {
                return self.contract_layered(group, &base, &dirs_all, &coef, cd, reduce);
            }
        }
        let streams = self.streams(&base)?;
        let all = if kept.is_some() {
            kept
        } else if self.es.strategy.materialized() {
            Some(self.chunk_noise(&streams, leaves, &dirs_all, None)?)
        } else {
            None
        };
        let u = self.contract_chunks(&streams, leaves, &dirs_all, &coef, cd, all.as_deref())?;
        all_reduce_if(u, reduce)
    }

    /// `Σ_i k_i ε_j(dirs_i)` per leaf `j` of `leaves` (keys `streams`), `cd` directions at a
    /// time in a loop; the noise regenerated or, from `all`, sliced.
    fn contract_chunks(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs_all: &Value,
        coef: &Value,
        cd: i64,
        all: Option<&[Noise]>,
    ) -> Result<Vec<Value>, EsError> {
        let f = dirs_all.func();
        // Σ_d k_d ε_d for a block of directions, per leaf.
        let contract = |noise: &[Noise], k: &Value| -> Result<Vec<Value>, EsError> {
            noise
                .iter()
                .map(|noise| {
                    Ok(match noise {
                        Noise::Dense(e) => {
                            let ed: Vec<usize> = vec![0];
                            k.dot_general(e, &DotDims::new(&[], &[], &[0], &ed))?
                        }
                        Noise::Factors { a, b } => {
                            let r = a.shape()[1];
                            let ks = k.mul(&f.scalar(1.0f32 / (r as f32).sqrt())?)?;
                            scale_rows(a, &ks)?
                                .dot_general(b, &DotDims::new(&[], &[], &[0, 1], &[0, 1]))?
                        }
                    })
                })
                .collect()
        };
        let inits: Vec<Value> = leaves
            .iter()
            .map(|l| f.full(0.0f32, &l.shape))
            .collect::<Result<_, _>>()?;
        let init_refs: Vec<&Value> = inits.iter().collect();
        let steps = (dirs_all.shape()[0] / cd) as i32;
        f.fori_loop(
            0,
            steps,
            &init_refs,
            |i, acc| -> Result<Vec<Value>, EsError> {
                let start = i.mul(&f.scalar(cd as i32)?)?;
                let dirs = dirs_all.dynamic_slice(&[&start], &[cd])?;
                let k = coef.dynamic_slice(&[&start], &[cd])?;
                let noise = match (all, self.es.how) {
                    (None, How::A) => self.contracted_noise(streams, leaves, &dirs)?,
                    _ => self.chunk_noise(streams, leaves, &dirs, all.map(|n| (n, &start)))?,
                };
                contract(&noise, &k)?
                    .iter()
                    .zip(acc)
                    .map(|(term, u)| Ok(u.add(term)?))
                    .collect()
            },
        )
    }

    /// [`Emitter::contract_chunks`] of every active leaf with a layer group: the leaves
    /// outside the layers as one contraction, the layers' in a loop over the layer index
    /// (each layer's sums written into `[L, …]` stacks, with `reduce` summed over the
    /// devices as stacks, then cut per leaf). Each leaf's sum adds the same terms in the
    /// same order as on its own, and an all-reduce sums elementwise, so a stack's gives
    /// each leaf's bits.
    fn contract_layered(
        &self,
        group: &LayerGroup,
        base: &Keys,
        dirs_all: &Value,
        coef: &Value,
        cd: i64,
        reduce: bool,
    ) -> Result<Vec<Value>, EsError> {
        let f = dirs_all.func();
        let active = &self.active;
        let mut out: Vec<Option<Value>> = vec![None; active.len()];
        let in_layers: Vec<usize> = group.active_positions().iter().flatten().copied().collect();
        let rest_pos: Vec<usize> = (0..active.len())
            .filter(|p| !in_layers.contains(p))
            .collect();
        if !rest_pos.is_empty() {
            let rest: Vec<LeafInfo> = rest_pos.iter().map(|&p| active[p].clone()).collect();
            let keys = base.fold_in(&sigma::leaf_ids(&f, &rest)?)?;
            let u = self.contract_chunks(&keys, &rest, dirs_all, coef, cd, None)?;
            for (&p, u) in rest_pos.iter().zip(all_reduce_if(u, reduce)?) {
                out[p] = Some(u);
            }
        }
        let a0 = group.active0();
        let layers = group.count() as i64;
        let inits: Vec<Value> = a0
            .iter()
            .map(|l| {
                let mut shape = vec![layers];
                shape.extend_from_slice(&l.shape);
                f.full(0.0f32, &shape)
            })
            .collect::<Result<_, _>>()?;
        let init_refs: Vec<&Value> = inits.iter().collect();
        let hi = i32::try_from(layers).map_err(|_| {
            invalid(
                format!("{layers} layers do not fit an i32 loop index"),
                "use fewer layers".into(),
            )
        })?;
        let stacks = f.fori_loop(0, hi, &init_refs, |l, acc| -> Result<Vec<Value>, EsError> {
            let keys = group.streams(base, l)?;
            let u = self.contract_chunks(&keys, a0, dirs_all, coef, cd, None)?;
            let zero = f.scalar(0i32)?;
            acc.iter()
                .zip(u)
                .map(|(stack, u)| {
                    let mut shape = vec![1];
                    shape.extend_from_slice(u.shape());
                    let mut at = vec![l.clone()];
                    at.resize(shape.len(), zero.clone());
                    let at: Vec<&Value> = at.iter().collect();
                    Ok(stack.dynamic_update_slice(&u.reshape(&shape)?, &at)?)
                })
                .collect()
        })?;
        let stacks = all_reduce_if(stacks, reduce)?;
        for (l, row) in group.active_positions().iter().enumerate() {
            let l = l as i64;
            for ((&p, stack), leaf) in row.iter().zip(&stacks).zip(a0) {
                out[p] = Some(stack.slice_in_dim(l, l + 1, 0)?.reshape(&leaf.shape)?);
            }
        }
        out.into_iter()
            .collect::<Option<Vec<Value>>>()
            .ok_or_else(|| {
                invalid(
                    "a leaf that gets noise was left out of tell's contraction".into(),
                    "report this: the layer group lost track of a leaf".into(),
                )
            })
    }

    /// The contraction's placement of the members: split over "pop" under `how = B` (each
    /// device its own), replicated under `A` (every device all of them); with `weights`
    /// placed alike.
    pub(super) fn place_members(&self, weights: &Value) -> Result<(Sharding, Value), EsError> {
        Ok(match self.es.how {
            How::B => (
                Sharding::split(1, 0)?,
                weights.shard(&Sharding::split(1, 0)?)?,
            ),
            How::A => (Sharding::replicated(1), weights.clone()),
        })
    }

    /// `tell`'s sum `u_j = Σ_i w_i s_i ε_j(i)` over the emitter's members, replicated, one
    /// per leaf that gets noise ([`Emitter::active`]), from their weights (`count` values).
    pub(super) fn contraction(
        &self,
        base_key: &Value,
        weights: &Value,
        kept: Option<Vec<Noise>>,
    ) -> Result<Vec<Value>, EsError> {
        let f = base_key.func();
        let (member_sh, weights) = self.place_members(weights)?;
        let ids = self.member_ids(&f, &member_sh)?;
        let kept_values: Vec<Value> = kept.iter().flatten().flat_map(Noise::values).collect();
        if !kept_values.is_empty() && self.es.how != How::B {
            return Err(invalid(
                "tell was handed apply's noise under how = A".into(),
                "keep noise only for how = B (ShardedES::keeps_noise)".into(),
            ));
        }
        let ranks: Vec<Vec<usize>> = kept
            .iter()
            .flatten()
            .map(|n| n.values().iter().map(|v| v.rank()).collect())
            .collect();
        let mut inputs: Vec<&Value> = vec![&ids, &weights, base_key];
        inputs.extend(kept_values.iter());
        let mut in_sh = vec![member_sh.clone(), member_sh, Sharding::replicated(1)];
        for v in &kept_values {
            in_sh.push(Sharding::split(v.rank(), 0)?);
        }
        let out_sh: Vec<Sharding> = self
            .active
            .iter()
            .map(|l| Sharding::replicated(l.shape.len()))
            .collect();
        let how = self.es.how;
        f.manual_computation(
            &inputs,
            &in_sh,
            &out_sh,
            |loc| -> Result<Vec<Value>, EsError> {
                let kept = (!ranks.is_empty()).then(|| noise_from_values(&loc[3..], &ranks));
                self.contract_local(&loc[0], &loc[1], &loc[2], &self.active, kept, how == How::B)
            },
        )
    }
}
