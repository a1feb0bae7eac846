//! Choosing the next token from a row's logits: greedy, or temperature / top-p sampling by
//! inverse CDF with one uniform number per row.

use serde::{Deserialize, Serialize};

use crate::builder::{DType, TensorType, Value};
use crate::es::EsError;

/// How each row's next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Sampling {
    /// The most likely token (ties: the lowest id, as `argmax`).
    Greedy,
    /// A draw from `softmax(logits / temperature)` restricted to the nucleus: the tokens
    /// whose probability is at least `τ`, for the largest `τ` whose tokens hold at least
    /// `top_p` of the probability (found by 24 bisection steps on `τ`; `top_p = 1` keeps
    /// every token). The draw takes the smallest id whose cumulative (unnormalised) mass
    /// in id order exceeds `u · total`, `u` the row's uniform number.
    Sample {
        /// Divides the logits (finite, > 0).
        temperature: f32,
        /// The nucleus mass, in `(0, 1]`.
        top_p: f32,
    },
}

impl Sampling {
    /// Refuses a temperature that is not finite and positive, or a `top_p` outside
    /// `(0, 1]`.
    pub fn check(&self) -> Result<(), EsError> {
        if let Sampling::Sample { temperature, top_p } = *self {
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(EsError::Invalid {
                    message: format!("sampling temperature {temperature}"),
                    fix: "use a finite temperature above 0 (or greedy decoding)".into(),
                });
            }
            if !(top_p > 0.0 && top_p <= 1.0) {
                return Err(EsError::Invalid {
                    message: format!("sampling top_p {top_p}"),
                    fix: "use a top_p in (0, 1]; 1 keeps every token".into(),
                });
            }
        }
        Ok(())
    }

    /// Whether the choice draws random numbers.
    pub fn is_random(&self) -> bool {
        matches!(self, Sampling::Sample { .. })
    }
}

/// Bisection steps on the nucleus threshold `τ ∈ [0, 1]`.
const TOP_P_STEPS: i32 = 24;

/// `x [lead..]` broadcast along a new last axis of size `v`.
fn widen(x: &Value, shape: &[i64]) -> Result<Value, EsError> {
    let dims: Vec<usize> = (0..x.rank()).collect();
    Ok(x.broadcast_in_dim(shape, &dims)?)
}

/// The token (i32, the logits' shape without the last axis) each row picks from `logits`
/// (f32 `[.., V]`), `u` (f32, one uniform number in `[0, 1)` per row) for a random choice.
pub(crate) fn choose(
    logits: &Value,
    u: Option<&Value>,
    sampling: &Sampling,
) -> Result<Value, EsError> {
    let last = logits.rank() - 1;
    let (temperature, top_p, u) = match (sampling, u) {
        (Sampling::Greedy, _) => return Ok(logits.argmax(last)?),
        (Sampling::Sample { temperature, top_p }, Some(u)) => (*temperature, *top_p, u),
        (Sampling::Sample { .. }, None) => {
            return Err(EsError::Invalid {
                message: "random sampling without uniform numbers".into(),
                fix: "pass one uniform number per row".into(),
            })
        }
    };
    let f = logits.func();
    let shape = logits.shape().to_vec();
    let lead = &shape[..last];
    let v = shape[last];
    let z = logits.mul(&f.scalar(1.0f32 / temperature)?)?;
    let m = widen(&z.reduce_max(&[last])?, &shape)?;
    let mut e = z.sub(&m)?.exp()?;
    let zero = f.full(0.0f32, &shape)?;
    if top_p < 1.0 {
        let total = widen(&e.reduce_sum(&[last])?, &shape)?;
        let probs = e.div(&total)?;
        let lo0 = f.full(0.0f32, lead)?;
        let hi0 = f.full(1.0f32, lead)?;
        let p = f.full(top_p, lead)?;
        let out = f.fori_loop(0, TOP_P_STEPS, &[&lo0, &hi0], |_, c| {
            let mid = c[0].add(&c[1])?.mul(&f.scalar(0.5f32)?)?;
            let keep = probs.ge(&widen(&mid, &shape)?)?;
            let mass = keep.select(&probs, &zero)?.reduce_sum(&[last])?;
            let ok = mass.ge(&p)?;
            Ok::<_, EsError>(vec![ok.select(&mid, &c[0])?, ok.select(&c[1], &mid)?])
        })?;
        let keep = probs.ge(&widen(&out[0], &shape)?)?;
        e = keep.select(&e, &zero)?;
    }
    let total = e.reduce_sum(&[last])?;
    let target = u.mul(&total)?;
    let ids = f.iota(TensorType::i32(&shape), last)?;
    // The smallest id whose cumulative mass exceeds the target: bisection on [lo, hi].
    let lo0 = f.full(0i32, lead)?;
    let hi0 = f.full((v - 1) as i32, lead)?;
    let steps = (64 - (v as u64).leading_zeros()) as i32 + 1;
    let out = f.fori_loop(0, steps, &[&lo0, &hi0], |_, c| {
        let mid = c[0].add(&c[1])?.shift_right_arithmetic(&f.scalar(1i32)?)?;
        let upto = ids.le(&widen(&mid, &shape)?)?;
        let cum = upto.select(&e, &zero)?.reduce_sum(&[last])?;
        let over = cum.gt(&target)?;
        let next_lo = mid.add(&f.scalar(1i32)?)?;
        Ok::<_, EsError>(vec![
            over.select(&c[0], &next_lo)?,
            over.select(&mid, &c[1])?,
        ])
    })?;
    let tok = out[0].clone();
    // A token of zero mass can only come from rounding at the top of the range (u · total
    // rounding up to total): take the most likely token then.
    let picked = ids
        .eq(&widen(&tok, &shape)?)?
        .select(&e, &zero)?
        .reduce_sum(&[last])?;
    let fallback = z.argmax(last)?;
    let has_mass = picked.gt(&f.full(0.0f32, lead)?)?;
    let tok = has_mass.select(&tok, &fallback)?;
    debug_assert_eq!(tok.dtype(), DType::I32);
    Ok(tok)
}
