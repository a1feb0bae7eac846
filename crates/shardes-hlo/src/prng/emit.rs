//! The same threefry PRNG as [`super::host`], emitted as StableHLO ops over traced keys.
//!
//! A [`Keys`] value is a batch of keys of any shape (two u32 arrays, one per word), so one
//! program derives every member's key from a traced array of member ids. The round
//! constants and the key schedule come from [`super::host`]: there is one definition of
//! the PRNG, evaluated in two places.

use super::erf_inv::erf_inv_exact;
use super::host::{
    Key, NORMAL_UNIFORM_LO, THREEFRY_GROUPS, THREEFRY_INJECTIONS, THREEFRY_PARITY,
    THREEFRY_ROTATIONS, UNIFORM_EXPONENT_BITS, UNIFORM_MANTISSA_SHIFT,
};
use crate::builder::{DType, Func, HloError, Result, TensorType, Value};

/// A batch of threefry keys as program values: words `k0` and `k1`, u32 arrays of one shape.
#[derive(Clone, Debug)]
pub struct Keys {
    k0: Value,
    k1: Value,
}

fn prng_err(what: &str, reason: String) -> HloError {
    HloError::InvalidAttribute {
        op: format!("prng.{what}"),
        types: String::new(),
        reason,
    }
}

impl Keys {
    /// Keys from two u32 word arrays of the same shape.
    pub fn new(k0: Value, k1: Value) -> Result<Keys> {
        if k0.dtype() != DType::U32 || k1.dtype() != DType::U32 || k0.shape() != k1.shape() {
            return Err(prng_err(
                "keys",
                format!(
                    "key words must be two u32 arrays of one shape, got {} and {}",
                    k0.ty(),
                    k1.ty()
                ),
            ));
        }
        Ok(Keys { k0, k1 })
    }

    /// One key known when the program is built.
    pub fn constant(f: &Func, key: Key) -> Result<Keys> {
        let [a, b] = key.data();
        Keys::new(f.scalar(a)?, f.scalar(b)?)
    }

    /// Keys stored as a u32 array whose last dimension (size 2) holds the two words.
    pub fn from_data(data: &Value) -> Result<Keys> {
        let shape = data.shape().to_vec();
        if data.dtype() != DType::U32 || shape.last() != Some(&2) {
            return Err(prng_err(
                "from_data",
                format!("key data must be u32[..., 2], got {}", data.ty()),
            ));
        }
        let r = shape.len() - 1;
        let batch = &shape[..r];
        let word = |i: i64| -> Result<Value> { data.slice_in_dim(i, i + 1, r)?.reshape(batch) };
        Keys::new(word(0)?, word(1)?)
    }

    /// The keys as a u32 array with a trailing dimension of 2 (the inverse of [`Keys::from_data`]).
    pub fn data(&self) -> Result<Value> {
        let mut shape = self.shape().to_vec();
        shape.push(1);
        let f = self.k0.func();
        f.concatenate(
            &[&self.k0.reshape(&shape)?, &self.k1.reshape(&shape)?],
            shape.len() - 1,
        )
    }

    /// The batch shape.
    pub fn shape(&self) -> &[i64] {
        self.k0.shape()
    }

    /// Word 0 and word 1.
    pub fn words(&self) -> (&Value, &Value) {
        (&self.k0, &self.k1)
    }

    /// Broadcasts the keys to `shape`, mapping key dimension `i` to `dims[i]`.
    pub fn broadcast_in_dim(&self, shape: &[i64], dims: &[usize]) -> Result<Keys> {
        Keys::new(
            self.k0.broadcast_in_dim(shape, dims)?,
            self.k1.broadcast_in_dim(shape, dims)?,
        )
    }

    /// Key `j` of a one-dimensional batch, as a scalar batch.
    pub fn at(&self, j: i64) -> Result<Keys> {
        if self.shape().len() != 1 || j < 0 || j >= self.shape()[0] {
            return Err(prng_err(
                "at",
                format!("key {j} of a batch of shape {:?}", self.shape()),
            ));
        }
        let one = |w: &Value| w.slice_in_dim(j, j + 1, 0)?.reshape(&[]);
        Keys::new(one(&self.k0)?, one(&self.k1)?)
    }

    /// Reshapes the batch of keys.
    pub fn reshape(&self, shape: &[i64]) -> Result<Keys> {
        Keys::new(self.k0.reshape(shape)?, self.k1.reshape(shape)?)
    }

    /// `fold_in(key, d)` elementwise, with numpy broadcasting between the keys and `data`
    /// (u32). A scalar key folded with `data: u32[n]` gives `n` keys.
    pub fn fold_in(&self, data: &Value) -> Result<Keys> {
        let (y0, y1) = self.words_at("fold_in", "fold-in data", data)?;
        Keys::new(y0, y1)
    }

    /// `threefry2x32(key, (0, x))` elementwise for u32 `x`; `op` and `what` name the caller
    /// and its operand when `x` is not u32.
    fn words_at(&self, op: &str, what: &str, x: &Value) -> Result<(Value, Value)> {
        if x.dtype() != DType::U32 {
            return Err(prng_err(op, format!("{what} must be u32, got {}", x.ty())));
        }
        let zero = x.func().scalar(0u32)?;
        threefry2x32(&self.k0, &self.k1, &zero, x)
    }

    /// `fold_in(key, d)` with `d` known when the program is built.
    pub fn fold_in_const(&self, d: u32) -> Result<Keys> {
        self.fold_in(&self.k0.func().scalar(d)?)
    }

    /// The row-major flat index within `shape` of every element of a draw of `shape` per
    /// key, as u32 counters of shape `full = keys.shape() ++ shape`; with `full` and the
    /// key dimensions within it, to broadcast the keys against the counters. `op` names
    /// the draw in the error when `shape` holds more elements than u32 counters reach.
    fn counters(&self, op: &str, shape: &[i64]) -> Result<(Vec<i64>, Vec<usize>, Value)> {
        let f = self.k0.func();
        let size: i64 = shape.iter().product();
        if size >= 1 << 32 || shape.iter().any(|&d| d < 0) {
            return Err(prng_err(
                op,
                format!(
                    "shape {shape:?} holds {size} elements; counters above 2^32 are not supported"
                ),
            ));
        }
        let kr = self.shape().len();
        let mut full = self.shape().to_vec();
        full.extend_from_slice(shape);
        let key_dims: Vec<usize> = (0..kr).collect();
        let ctr_dims: Vec<usize> = (kr..full.len()).collect();
        let counter = f
            .iota(TensorType::u32(&[size]), 0)?
            .reshape(shape)?
            .broadcast_in_dim(&full, &ctr_dims)?;
        Ok((full, key_dims, counter))
    }

    /// `bits(key, shape)` for every key: result shape `keys.shape() ++ shape`, element at
    /// row-major flat index `c` within `shape` is `y0 ^ y1` of `threefry2x32(key, (0, c))`.
    pub fn bits(&self, shape: &[i64]) -> Result<Value> {
        let (_, key_dims, counter) = self.counters("bits", shape)?;
        // Keys as [batch.., 1, ..]: threefry2x32 broadcasts them against the counters
        // inside its loop, so the carried key schedule stays at the batch's size.
        let mut kshape = self.shape().to_vec();
        kshape.extend(std::iter::repeat_n(1, shape.len()));
        self.broadcast_in_dim(&kshape, &key_dims)?.bits_at(&counter)
    }

    /// `y0 ^ y1` of `threefry2x32(key, (0, counter))` elementwise, the keys broadcast
    /// against `counters` (u32) numpy-style: the bits [`Keys::bits`] draws, for counters
    /// laid out by the caller (e.g. several draws concatenated into one).
    pub fn bits_at(&self, counters: &Value) -> Result<Value> {
        let (y0, y1) = self.words_at("bits_at", "counters", counters)?;
        y0.xor(&y1)
    }

    /// [`Keys::normal`] with threefry's 20 rounds as straight-line elementwise ops
    /// ([`threefry2x32_unrolled`]): the same bits, for a consumer that reads each normal
    /// once, so XLA fuses the whole draw (rounds, `erf_inv` and the consumer) into one
    /// kernel instead of a `while` loop over full-size arrays. More ops to compile; use it
    /// at few sites.
    ///
    /// It keeps `chlo.erf_inv` (one scalar `logf` call per element) rather than
    /// [`normal_of_bits_exact`]: in `how = A`'s contraction kernel the longer loop body
    /// stops LLVM from unrolling the two-direction dot loop, so nothing is vectorized and a
    /// `how = A` generation takes 3× as long (`docs/performance.md`, "how = A with full-rank
    /// noise").
    pub fn normal_unrolled(&self, shape: &[i64]) -> Result<Value> {
        let f = self.k0.func();
        let (full, key_dims, counter) = self.counters("normal_unrolled", shape)?;
        let keys = self.broadcast_in_dim(&full, &key_dims)?;
        let zero = f.scalar(0u32)?.broadcast_to(&full)?;
        let (y0, y1) = threefry2x32_unrolled(&keys.k0, &keys.k1, &zero, &counter)?;
        normal_of_bits(&y0.xor(&y1)?)
    }

    /// `uniform(key, shape, lo, hi)` in f32 for every key (shape `keys.shape() ++ shape`).
    pub fn uniform(&self, shape: &[i64], lo: f32, hi: f32) -> Result<Value> {
        uniform_of_bits(&self.bits(shape)?, lo, hi)
    }

    /// `normal(key, shape)` in f32 for every key: `sqrt(2) · erf_inv(uniform(nextafter(-1, 0), 1))`.
    pub fn normal(&self, shape: &[i64]) -> Result<Value> {
        normal_of_bits(&self.bits(shape)?)
    }
}

/// The uniform f32 in `[lo, hi)` that random bits (u32) stand for, as `uniform` maps them.
pub fn uniform_of_bits(bits: &Value, lo: f32, hi: f32) -> Result<Value> {
    let f = bits.func();
    let unit = bits
        .shift_right_logical(&f.scalar(UNIFORM_MANTISSA_SHIFT)?)?
        .or(&f.scalar(UNIFORM_EXPONENT_BITS)?)?
        .bitcast_convert(DType::F32)?
        .sub(&f.scalar(1.0f32)?)?;
    let lo_v = f.scalar(lo)?;
    // XLA:CPU fuses this multiply-add into one FMA, which the host side mirrors.
    unit.mul(&f.scalar(hi - lo)?)?.add(&lo_v)?.max(&lo_v)
}

/// The standard normal f32 that random bits (u32) stand for, as `normal` maps them:
/// `sqrt(2) · erf_inv(uniform(bits, nextafter(-1, 0), 1))`.
pub fn normal_of_bits(bits: &Value) -> Result<Value> {
    let u = uniform_of_bits(bits, NORMAL_UNIFORM_LO, 1.0)?;
    let f = u.func();
    u.erf_inv()?.mul(&f.scalar(std::f32::consts::SQRT_2)?)
}

/// [`normal_of_bits`] with [`erf_inv_exact`] in place of `chlo.erf_inv`: the same bits on
/// the CPU plugin (also when fused with an unrolled threefry draw, `tests/suite/erf_inv_exact.rs`),
/// and no scalar library call for XLA to make per element; more ops (f64 ones among them),
/// which can keep LLVM from vectorizing a kernel with an inner loop, such as a fused `dot`.
pub fn normal_of_bits_exact(bits: &Value) -> Result<Value> {
    let u = uniform_of_bits(bits, NORMAL_UNIFORM_LO, 1.0)?;
    let f = u.func();
    erf_inv_exact(&u)?.mul(&f.scalar(std::f32::consts::SQRT_2)?)
}

/// threefry2x32 (20 rounds) elementwise over u32 values with numpy broadcasting.
///
/// Emitted as JAX lowers it on CPU, with the five four-round groups as one `while` loop, so
/// a program with many draws stays small and compiles fast (the unrolled form is ~8× the
/// ops). Unlike JAX's loop, whose carry rotates the key schedule and the rotation tables
/// each iteration, the carry holds only the counter and the two words (packed into one
/// i64, see `pack`): the three schedule keys stay loop-invariant (at the keys' own shape)
/// and group `g` picks its two with `g mod 3`, its rotations with `g mod 2`. Rotating full-size key arrays made XLA copy each
/// of them every iteration (19 % of a full-rank generation went to those copies).
pub fn threefry2x32(k0: &Value, k1: &Value, x0: &Value, x1: &Value) -> Result<(Value, Value)> {
    let f = k0.func();
    let u = |x: u32| f.scalar(x);
    let shape = broadcast_shape(&[k0.shape(), k1.shape(), x0.shape(), x1.shape()])?;
    let kshape = broadcast_shape(&[k0.shape(), k1.shape()])?;
    let to = |v: &Value, s: &[i64]| -> Result<Value> {
        if v.shape() == s {
            Ok(v.clone())
        } else {
            v.broadcast_to(s)
        }
    };
    let k2 = k0.xor(k1)?.xor(&u(THREEFRY_PARITY)?)?;
    let ks = [to(k0, &kshape)?, to(k1, &kshape)?, to(&k2, &kshape)?];
    // Group 0's injection, then groups 0..5 in the loop: after group g the schedule adds
    // ks[(g+1) % 3] and ks[(g+2) % 3] + g + 1 (THREEFRY_INJECTIONS).
    debug_assert_eq!(THREEFRY_INJECTIONS[0], [0, 1]);
    let x0 = to(x0, &shape)?.add(&to(&ks[0], &shape)?)?;
    let x1 = to(x1, &shape)?.add(&to(&ks[1], &shape)?)?;
    let groups = THREEFRY_GROUPS as u32;
    let init = [&u(0)?, &pack(&x0, &x1)?];
    let g = f.clone();
    let h = f.clone();
    let out = f.while_loop(
        &init,
        move |c| c[0].lt(&g.scalar(groups)?),
        move |c| {
            let i = c[0].clone();
            let (mut x0, mut x1) = unpack(&c[1])?;
            let full = x0.shape().to_vec();
            let is = |v: u32, m: u32| -> Result<Value> { i.rem(&h.scalar(m)?)?.eq(&h.scalar(v)?) };
            // The group's rotations: table g mod 2.
            let even = is(0, 2)?;
            let ra = even.select(
                &h.constant(&[4], &THREEFRY_ROTATIONS[0])?,
                &h.constant(&[4], &THREEFRY_ROTATIONS[1])?,
            )?;
            for k in 0..4 {
                let r = ra.slice_in_dim(k, k + 1, 0)?.reshape(&[])?;
                let l = h.scalar(32u32)?.sub(&r)?;
                x0 = x0.add(&x1)?;
                let rotl = x1
                    .shift_left(&r.broadcast_to(&full)?)?
                    .or(&x1.shift_right_logical(&l.broadcast_to(&full)?)?)?;
                x1 = rotl.xor(&x0)?;
            }
            // ks[(g + q) mod 3] for q = 1, 2.
            let (m0, m1) = (is(0, 3)?, is(1, 3)?);
            let pick = |q: usize| -> Result<Value> {
                m0.select(
                    &ks[(q) % 3],
                    &m1.select(&ks[(1 + q) % 3], &ks[(2 + q) % 3])?,
                )
            };
            let next = i.add(&h.scalar(1u32)?)?;
            x0 = x0.add(&to(&pick(1)?, &full)?)?;
            x1 = x1
                .add(&to(&pick(2)?, &full)?)?
                .add(&next.broadcast_to(&full)?)?;
            Ok(vec![next, pack(&x0, &x1)?])
        },
    )?;
    unpack(&out[1])
}

/// threefry2x32 (20 rounds) over u32 values of one shape, the rounds unrolled: the same
/// bits as [`threefry2x32`] (integer ops, exact), as one chain of elementwise ops that XLA
/// fuses into its consumer. [`threefry2x32`]'s loop writes and reads its full-size carry
/// (two words packed in an i64) once per four rounds; this form keeps every word in
/// registers, at about 8× the ops.
pub fn threefry2x32_unrolled(
    k0: &Value,
    k1: &Value,
    x0: &Value,
    x1: &Value,
) -> Result<(Value, Value)> {
    let f = k0.func();
    let shape = x0.shape().to_vec();
    if [k0.shape(), k1.shape(), x1.shape()]
        .iter()
        .any(|s| *s != shape.as_slice())
    {
        return Err(prng_err(
            "threefry2x32_unrolled",
            format!(
                "operands must share one shape, got {:?}, {:?}, {:?}, {:?}",
                k0.shape(),
                k1.shape(),
                x0.shape(),
                x1.shape()
            ),
        ));
    }
    let c = |x: u32| -> Result<Value> { f.scalar(x)?.broadcast_to(&shape) };
    let k2 = k0.xor(k1)?.xor(&c(THREEFRY_PARITY)?)?;
    let ks = [k0.clone(), k1.clone(), k2];
    let (mut x0, mut x1) = (x0.clone(), x1.clone());
    for (g, inj) in THREEFRY_INJECTIONS.iter().enumerate() {
        x0 = x0.add(&ks[inj[0]])?;
        x1 = x1.add(&ks[inj[1]])?;
        if g > 0 {
            x1 = x1.add(&c(g as u32)?)?;
        }
        if g == THREEFRY_GROUPS {
            break;
        }
        for &r in &THREEFRY_ROTATIONS[g % 2] {
            x0 = x0.add(&x1)?;
            let rotl = x1
                .shift_left(&c(r)?)?
                .or(&x1.shift_right_logical(&c(32 - r)?)?)?;
            x1 = rotl.xor(&x0)?;
        }
    }
    Ok((x0, x1))
}

/// Two u32 words as one i64 (`x0` high, `x1` low). The threefry loop carries its two words
/// packed: XLA then compiles the loop body as one fusion with one output. Carried apart, the
/// body became two fusions, one per word, each running all four rounds (the rounds computed
/// twice).
fn pack(x0: &Value, x1: &Value) -> Result<Value> {
    let f = x0.func();
    x0.convert(DType::I64)?
        .shift_left(&f.scalar(32i64)?.broadcast_to(x0.shape())?)?
        .or(&x1.convert(DType::I64)?)
}

/// The two u32 words of [`pack`].
fn unpack(x: &Value) -> Result<(Value, Value)> {
    let f = x.func();
    let low = |v: Value| -> Result<Value> {
        v.and(&f.scalar(0xFFFF_FFFFi64)?.broadcast_to(x.shape())?)?
            .convert(DType::U32)
    };
    let hi = low(x.shift_right_logical(&f.scalar(32i64)?.broadcast_to(x.shape())?)?)?;
    Ok((hi, low(x.clone())?))
}

/// numpy broadcast shape of several shapes.
fn broadcast_shape(shapes: &[&[i64]]) -> Result<Vec<i64>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1i64; rank];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(prng_err(
                    "threefry2x32",
                    format!("operand shapes {shapes:?} do not broadcast"),
                ));
            }
        }
    }
    Ok(out)
}
