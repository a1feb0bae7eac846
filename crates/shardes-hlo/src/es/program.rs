//! `ShardedES` and the generation program: ask + apply + tell as one StableHLO module.
//!
//! The program follows the spec's "State, ask and member ids", "Evaluation" and "Update"
//! sections. Placement:
//! - members are split over the `"pop"` axis; each device evaluates its own `n / D`
//!   members, `member_chunk` at a time in a `while` loop (inside `sdy.manual_computation`,
//!   so the split is exact and the chunk shape does not depend on the device count);
//! - the fitness is gathered (scalars only) and shaped on every device;
//! - `how = B`: each device contracts its own members, then one all-reduce per leaf;
//!   `how = A`: every device regenerates and contracts the whole population.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::builder::{DType, DotDims, Func, HloError, Mesh, Module, Sharding, TensorType, Value};
use crate::nn::{Act, Weight};
use crate::params::ParamTree;
use crate::prng::emit::Keys;

use super::shaping::{CenteredRanks, Shaping};
use super::strategy::{LeafInfo, Noise, Strategy};

/// Where the update is contracted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum How {
    /// Gather the weights; every device regenerates and contracts the whole population.
    A,
    /// Each device contracts its own members; one parameter-sized all-reduce (default).
    #[default]
    B,
}

/// Errors of the ES layer: invalid settings (naming the number to change) and program
/// construction errors.
#[derive(Debug, thiserror::Error)]
pub enum EsError {
    /// A setting is out of range.
    #[error("{message}; {fix}")]
    Invalid {
        /// What is wrong.
        message: String,
        /// What to change.
        fix: String,
    },
    /// The model's fitness is narrower than f32.
    #[error(
        "fitness is {dtype}: narrower than float32 is refused because in {dtype} a population's \
         losses collapse into ties and ranks of ties are noise; reduce the loss in float32 \
         (convert before the final mean)"
    )]
    NarrowFitness {
        /// The offending element type.
        dtype: String,
    },
    /// A model read a parameter the wrong way.
    #[error("parameter `{path}`: {reason}")]
    Param {
        /// Leaf path.
        path: String,
        /// What went wrong and the fix.
        reason: String,
    },
    /// Building the program failed.
    #[error(transparent)]
    Hlo(#[from] HloError),
}

fn invalid(message: String, fix: String) -> EsError {
    EsError::Invalid { message, fix }
}

/// A model the ES program can evaluate: a per-member loss written against the seams.
pub trait Model {
    /// Names and types of the batch inputs (replicated on every device).
    fn batch_types(&self) -> Vec<(String, TensorType)>;

    /// The loss of every member of a chunk: an [`Act`] with logical shape `[]`
    /// (or `[g]` for `group_relative`), f32. Read 2-D weights through
    /// [`ModelParams::weight`] and the seams in [`crate::nn`].
    fn loss(&self, params: &ModelParams, batch: &[Value]) -> Result<Act, EsError>;

    /// Fitness columns per member: 1 for a scalar loss, `g` when [`Model::loss`] returns
    /// `g` task losses (logical shape `[g]`, for `group_relative`).
    fn tasks(&self) -> usize {
        1
    }

    /// Bytes of one member's largest activation for one batch, if the model knows it
    /// (e.g. `tokens × width × 4` for f32). [`ShardedES::with_member_bytes`] takes it, and
    /// the default member chunk then keeps a chunk's activation within [`CHUNK_BYTES`].
    fn member_bytes(&self) -> Option<usize> {
        None
    }
}

/// How a model read a leaf (for [`check_model`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read through a seam (`dense`/`embed`).
    Seam,
    /// Read as a plain tensor.
    Raw,
}

enum Leaf {
    Matrix(Weight),
    Dense(Act),
}

/// The parameters as a model sees them for one member chunk.
pub struct ModelParams {
    leaves: BTreeMap<String, Leaf>,
    access: RefCell<BTreeMap<String, Vec<Access>>>,
}

impl ModelParams {
    fn new(leaves: Vec<(String, Leaf)>) -> Self {
        ModelParams {
            leaves: leaves.into_iter().collect(),
            access: RefCell::new(BTreeMap::new()),
        }
    }

    /// Unperturbed parameters (2-D leaves as [`Weight::Plain`], others shared), for
    /// programs outside ES such as inference or decoding.
    pub fn plain(leaves: Vec<(String, Value)>) -> Self {
        let entries = leaves.into_iter().map(|(path, v)| {
            let leaf = if v.rank() == 2 {
                Leaf::Matrix(Weight::Plain(v))
            } else {
                Leaf::Dense(Act::shared(v))
            };
            (path, leaf)
        });
        Self::new(entries.collect())
    }

    fn record(&self, path: &str, a: Access) {
        self.access
            .borrow_mut()
            .entry(path.to_string())
            .or_default()
            .push(a);
    }

    fn missing(&self, path: &str) -> EsError {
        let known: Vec<&str> = self.leaves.keys().map(String::as_str).collect();
        EsError::Param {
            path: path.into(),
            reason: format!("no such leaf; the tree has: {}", known.join(", ")),
        }
    }

    /// A 2-D leaf for the seams ([`crate::nn::dense`], [`crate::nn::embed`]).
    pub fn weight(&self, path: &str) -> Result<Weight, EsError> {
        match self.leaves.get(path) {
            Some(Leaf::Matrix(w)) => {
                self.record(path, Access::Seam);
                Ok(w.clone())
            }
            Some(Leaf::Dense(_)) => Err(EsError::Param {
                path: path.into(),
                reason: "is not 2-D; read it with ModelParams::tensor".into(),
            }),
            None => Err(self.missing(path)),
        }
    }

    /// A leaf as a plain tensor (biases, norms). A 2-D leaf under a structured
    /// perturbation cannot be read this way: it has no dense value to give.
    pub fn tensor(&self, path: &str) -> Result<Act, EsError> {
        match self.leaves.get(path) {
            Some(Leaf::Dense(a)) => {
                self.record(path, Access::Raw);
                Ok(a.clone())
            }
            Some(Leaf::Matrix(Weight::Plain(w))) => {
                self.record(path, Access::Raw);
                Ok(Act::shared(w.clone()))
            }
            Some(Leaf::Matrix(Weight::Members(w))) => {
                self.record(path, Access::Raw);
                Ok(Act::per_member(w.clone())?)
            }
            Some(Leaf::Matrix(Weight::LowRank { .. })) => {
                self.record(path, Access::Raw);
                Err(EsError::Param {
                    path: path.into(),
                    reason: "is a low-rank structured weight with no dense value; read it \
                             through nn::dense or nn::embed (ModelParams::weight)"
                        .into(),
                })
            }
            None => Err(self.missing(path)),
        }
    }

    fn accesses(&self) -> BTreeMap<String, Vec<Access>> {
        self.access.borrow().clone()
    }
}

/// The leaves of a parameter tree as the program sees them (JAX leaf order).
pub fn leaf_infos(tree: &ParamTree) -> Vec<LeafInfo> {
    tree.leaves()
        .into_iter()
        .enumerate()
        .map(|(index, (path, a))| LeafInfo {
            index,
            path,
            shape: a.shape().iter().map(|&d| d as i64).collect(),
        })
        .collect()
}

/// Sharded evolution strategies: the settings of one run, validated at construction.
pub struct ShardedES {
    strategy: Box<dyn Strategy>,
    n: usize,
    sigma: f32,
    lr: f32,
    devices: usize,
    shaping: Box<dyn Shaping>,
    how: How,
    member_chunk: Option<usize>,
    member_bytes: Option<usize>,
    keep_noise_bytes: usize,
}

impl std::fmt::Debug for ShardedES {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedES")
            .field("strategy", &self.strategy.name())
            .field("n", &self.n)
            .field("sigma", &self.sigma)
            .field("lr", &self.lr)
            .field("devices", &self.devices)
            .field("shaping", &self.shaping.name())
            .field("how", &self.how)
            .field("member_chunk", &self.member_chunk)
            .field("member_bytes", &self.member_bytes)
            .field("keep_noise_bytes", &self.keep_noise_bytes)
            .finish()
    }
}

/// The largest default members per evaluation chunk: small enough that one chunk's activations
/// stay in cache-sized memory, and independent of the device count.
pub const DEFAULT_MEMBER_CHUNK: usize = 32;

/// The activation bytes a default member chunk aims to stay within when the model's
/// per-member size is known ([`ShardedES::with_member_bytes`]): half a megabyte, the L2
/// cache of one core here. `shardes bench benches/quickstart.toml --member-chunk C` measured
/// 78, 72, 66 and 68 ms per generation for C = 32, 16, 8 and 4 at 64 KiB per member.
pub const CHUNK_BYTES: usize = 512 * 1024;

/// The noise bytes `tell` regenerates per loop step ([`ShardedES::tell_chunk`]): small
/// enough that the draw's arrays stay in cache. `shardes bench benches/eggroll_n16384.toml
/// --n 4096` measured `tell` (generation minus ask + apply) at 30 ms with 64 KiB, 54 ms
/// with 256 KiB; 4 MiB took 364 ms at n = 16384.
pub const TELL_CHUNK_BYTES: usize = 64 * 1024;

/// The noise bytes per device that `how = B` keeps from `apply` for `tell`
/// ([`ShardedES::keeps_noise`]): under it, `apply`'s member loop also writes each chunk's
/// noise into buffers of all local directions and `tell` contracts those, drawing nothing;
/// over it (large populations), `tell` regenerates the noise chunk by chunk, so memory stays
/// bounded in `n`. 16 MiB holds eggroll_n16384 up to n = 65 536 (3 KiB per direction).
pub const KEEP_NOISE_BYTES: usize = 16 << 20;

impl ShardedES {
    /// Validates and builds: `n` must divide by `devices × pairing`, `sigma` finite and
    /// positive, `lr` finite. Shaping defaults to centered ranks, placement to `B`.
    pub fn new(
        strategy: Box<dyn Strategy>,
        n: usize,
        sigma: f32,
        lr: f32,
        devices: usize,
    ) -> Result<ShardedES, EsError> {
        let es = ShardedES {
            strategy,
            n,
            sigma,
            lr,
            devices,
            shaping: Box::new(CenteredRanks),
            how: How::B,
            member_chunk: None,
            member_bytes: None,
            keep_noise_bytes: KEEP_NOISE_BYTES,
        };
        es.validate()?;
        Ok(es)
    }

    /// Replaces the shaping.
    pub fn with_shaping(mut self, shaping: Box<dyn Shaping>) -> Self {
        self.shaping = shaping;
        self
    }

    /// Sets the placement of the contraction.
    pub fn with_how(mut self, how: How) -> Self {
        self.how = how;
        self
    }

    /// Sets members per evaluation chunk (checked when the program is built).
    pub fn with_member_chunk(mut self, chunk: Option<usize>) -> Self {
        self.member_chunk = chunk;
        self
    }

    /// Sets the bytes of one member's largest activation ([`Model::member_bytes`]), which
    /// caps the default member chunk at [`CHUNK_BYTES`] of activation. Every program of
    /// this ES then uses the same chunk, whichever model it is built with.
    pub fn with_member_bytes(mut self, bytes: Option<usize>) -> Self {
        self.member_bytes = bytes.filter(|&b| b > 0);
        self
    }

    /// Sets the noise bytes per device that `how = B` keeps from `apply` for `tell`
    /// (default [`KEEP_NOISE_BYTES`]; 0 always regenerates). More memory, a faster `tell`.
    pub fn with_keep_noise_bytes(mut self, bytes: usize) -> Self {
        self.keep_noise_bytes = bytes;
        self
    }

    fn validate(&self) -> Result<(), EsError> {
        let p = self.strategy.pairing();
        if p != 1 && p != 2 {
            return Err(invalid(
                format!("strategy {} pairs {p} members", self.strategy.name()),
                "use a pairing of 1 or 2 (mirror a strategy at most once)".into(),
            ));
        }
        if self.devices == 0 {
            return Err(invalid(
                "devices = 0".into(),
                "use at least 1 device".into(),
            ));
        }
        let per = self.devices * p;
        if self.n == 0 || !self.n.is_multiple_of(per) {
            let lo = (self.n / per).max(1) * per;
            return Err(invalid(
                format!(
                    "n = {} is not a positive multiple of devices ({}) × pairing ({p})",
                    self.n, self.devices
                ),
                format!("set n to a multiple of {per}, e.g. {lo} or {}", lo + per),
            ));
        }
        if !(self.sigma.is_finite() && self.sigma > 0.0) {
            return Err(invalid(
                format!("sigma = {} is not finite and > 0", self.sigma),
                "set sigma to a small positive number such as 0.01".into(),
            ));
        }
        if !self.lr.is_finite() {
            return Err(invalid(
                format!("lr = {} is not finite", self.lr),
                "set lr to a finite number such as 0.01".into(),
            ));
        }
        Ok(())
    }

    /// Population size.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Devices on the `"pop"` axis.
    pub fn devices(&self) -> usize {
        self.devices
    }

    /// Noise scale.
    pub fn sigma(&self) -> f32 {
        self.sigma
    }

    /// Learning rate.
    pub fn lr(&self) -> f32 {
        self.lr
    }

    /// Placement of the contraction.
    pub fn how(&self) -> How {
        self.how
    }

    /// The strategy.
    pub fn strategy(&self) -> &dyn Strategy {
        self.strategy.as_ref()
    }

    /// The shaping.
    pub fn shaping(&self) -> &dyn Shaping {
        self.shaping.as_ref()
    }

    /// Members each device evaluates per loop step: the configured chunk (or the
    /// strategy's, or [`ShardedES::default_member_chunk`]), checked to divide the local
    /// population and the pairing.
    pub fn member_chunk(&self) -> Result<usize, EsError> {
        let local = self.n / self.devices;
        let p = self.strategy.pairing();
        let c = self
            .member_chunk
            .or(self.strategy.chunk())
            .unwrap_or_else(|| self.default_member_chunk());
        if c == 0 || !c.is_multiple_of(p) || !local.is_multiple_of(c) {
            return Err(invalid(
                format!(
                    "member chunk {c} does not divide the {local} members per device in \
                     multiples of the pairing {p}"
                ),
                format!("set the member chunk to a divisor of {local} that is a multiple of {p}"),
            ));
        }
        Ok(c)
    }

    /// The chunk used when neither the settings nor the strategy choose one: the largest
    /// multiple of the pairing, at most [`DEFAULT_MEMBER_CHUNK`] (and, when the member size
    /// is known, at most [`CHUNK_BYTES`] of activation but no fewer than two directions),
    /// that divides both the
    /// local population and `n / 8` (when 8 divides `n`). Dividing `n / 8` makes it the
    /// same on 1, 2, 4 and 8 devices, so each member's loss is computed by the same kernel
    /// shapes and is bit-identical across those device counts (rank shaping turns a 1-ulp
    /// difference between near ties into a different update).
    pub fn default_member_chunk(&self) -> usize {
        let local = self.n / self.devices;
        let p = self.strategy.pairing().max(1);
        let base = if self.n.is_multiple_of(8) && (self.n / 8).is_multiple_of(p) {
            gcd(local, self.n / 8)
        } else {
            local
        };
        let cap = match self.member_bytes {
            // At least two directions: each chunk pays a fixed cost (its PRNG draws, a
            // loop step), and one direction per chunk measured slower for qiu_d256
            // (482 against 406 ms per generation at 2 and 4 members).
            Some(b) => DEFAULT_MEMBER_CHUNK.min((CHUNK_BYTES / b).max(2 * p)),
            None => DEFAULT_MEMBER_CHUNK,
        };
        (1..=cap.min(base))
            .rev()
            .find(|c| base.is_multiple_of(*c) && c.is_multiple_of(p))
            .unwrap_or(p)
    }

    /// Directions `tell` regenerates and contracts per loop step, out of `dirs`: the
    /// largest divisor of `dirs` whose noise fits [`TELL_CHUNK_BYTES`], or at most the
    /// evaluation chunk's directions if that is more (at least 1). `tell` holds no
    /// activations, so the noise sets its size; not going below `apply`'s chunk lets XLA
    /// share the draws of the two when both run one step (qiu_d256: `tell` took 11 ms with
    /// two directions per step, 129 ms with one).
    pub fn tell_chunk(&self, leaves: &[LeafInfo], dirs: usize) -> usize {
        let bytes: usize = 4 * leaves
            .iter()
            .map(|l| self.strategy.noise_elements(l))
            .sum::<usize>();
        let apply_dirs = self
            .member_chunk()
            .map_or(1, |c| c / self.strategy.pairing().max(1));
        let cap = (TELL_CHUNK_BYTES / bytes.max(1)).max(apply_dirs).max(1);
        (1..=cap.min(dirs))
            .rev()
            .find(|c| dirs.is_multiple_of(*c))
            .unwrap_or(1)
    }

    /// Whether `how = B` keeps `apply`'s noise for `tell` instead of regenerating it: when
    /// the noise of a device's directions fits [`ShardedES::with_keep_noise_bytes`]
    /// ([`KEEP_NOISE_BYTES`] by default). `how = A` contracts every member on every device,
    /// so it always regenerates.
    pub fn keeps_noise(&self, leaves: &[LeafInfo]) -> bool {
        let bytes: usize = 4 * leaves
            .iter()
            .map(|l| self.strategy.noise_elements(l))
            .sum::<usize>();
        let dirs = self.n / self.devices.max(1) / self.strategy.pairing().max(1);
        self.how == How::B && dirs.saturating_mul(bytes) <= self.keep_noise_bytes
    }

    /// `lr / (n σ)`, the f32 factor of the update, computed once.
    pub fn update_scale(&self) -> f32 {
        self.lr / (self.n as f32 * self.sigma)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Argument and result positions of a generation program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The parameter leaves, in order (arguments `0..L` and results `0..L`).
    pub leaves: Vec<LeafInfo>,
    /// Names and types of the batch arguments (after `key` and `generation`).
    pub batch: Vec<(String, TensorType)>,
    /// Population size.
    pub n: usize,
    /// Fitness columns per member (1 unless the model returns several tasks).
    pub tasks: usize,
}

impl Layout {
    /// Index of the `key` argument (`u32[2]`).
    pub fn key_arg(&self) -> usize {
        self.leaves.len()
    }
    /// Index of the `generation` argument (u32 scalar).
    pub fn generation_arg(&self) -> usize {
        self.leaves.len() + 1
    }
    /// Index of the first batch argument.
    pub fn batch_arg(&self) -> usize {
        self.leaves.len() + 2
    }
    /// Index of the fitness result.
    pub fn fitness_result(&self) -> usize {
        self.leaves.len() + 1
    }
}

/// A built program and its layout.
pub struct Program {
    /// The module (print with [`Module::to_mlir`]).
    pub module: Module,
    /// Argument/result positions.
    pub layout: Layout,
}

fn f32s(shape: &[i64]) -> TensorType {
    TensorType::f32(shape)
}

fn dims(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> DotDims {
    DotDims {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contract: lc.to_vec(),
        rhs_contract: rc.to_vec(),
    }
}

/// Carries an [`EsError`] out of a builder region closure (regions can only fail with
/// [`HloError`]): the closure's error is kept here and returned once the region is built.
struct Stash(RefCell<Option<EsError>>);

impl Stash {
    fn new() -> Self {
        Stash(RefCell::new(None))
    }

    /// Runs `f` inside a region, stashing its error and handing the builder a summary.
    fn run<T>(
        &self,
        op: &str,
        f: impl FnOnce() -> Result<T, EsError>,
    ) -> crate::builder::Result<T> {
        f().map_err(|e| {
            let reason = e.to_string();
            *self.0.borrow_mut() = Some(e);
            HloError::InvalidAttribute {
                op: op.into(),
                types: String::new(),
                reason,
            }
        })
    }

    /// The region's result, the stashed error first.
    fn finish<T>(self, r: crate::builder::Result<T>) -> Result<T, EsError> {
        match self.0.into_inner() {
            Some(e) => Err(e),
            None => Ok(r?),
        }
    }
}

/// Direction ids and signs of a block of member ids (`u32[c]`, aligned to the pairing):
/// `dirs = ids[::p] / p` (`u32[c/p]`), `signs` f32[c] (+1, or −1 for odd mirrored members).
fn directions(ids: &Value, p: i64) -> Result<(Value, Value), EsError> {
    let f = ids.func();
    let c = ids.shape()[0];
    if p == 1 {
        return Ok((ids.clone(), f.full(1.0f32, &[c])?));
    }
    let dirs = ids
        .reshape(&[c / p, p])?
        .slice_in_dim(0, 1, 1)?
        .reshape(&[c / p])?
        .shift_right_logical(&f.scalar(1u32)?)?;
    let odd = ids.and(&f.scalar(1u32)?)?.convert(DType::F32)?;
    let signs = f.scalar(1.0f32)?.sub(&odd.mul(&f.scalar(2.0f32)?)?)?;
    Ok((dirs, signs))
}

/// Multiplies `x [c, ...]` by `s [c]` along dim 0.
fn scale_rows(x: &Value, s: &Value) -> Result<Value, EsError> {
    Ok(x.mul(&s.broadcast_in_dim(x.shape(), &[0])?)?)
}

/// The chunk's noise, each element computed once.
///
/// XLA:CPU fuses cheap elementwise producers into their consumers, even where the consumer
/// reads each element many times: the noise transform (uniform bits → erf_inv polynomial)
/// was fused into the rank-1 corrections `(x B) Aᵀ` (a broadcast multiply once XLA
/// strength-reduces the r = 1 dot), so every factor element was recomputed once per token.
/// A profile of the quickstart put 40 % of a generation in those fusions.
/// `optimization_barrier` does not help (XLA:CPU expands it before fusion); an "expensive"
/// op does, because XLA never duplicates one into a consumer that reuses its elements.
/// `remainder(z, +inf)` is such an op and the identity on finite `z` (IEEE 754 `fmod`), so
/// the noise keeps its exact bits.
fn materialize(noise: Vec<Noise>) -> Result<Vec<Noise>, EsError> {
    let once =
        |v: &Value| -> Result<Value, EsError> { Ok(v.rem(&v.func().scalar(f32::INFINITY)?)?) };
    noise
        .into_iter()
        .map(|n| {
            Ok(match n {
                Noise::Dense(v) => Noise::Dense(once(&v)?),
                Noise::Factors { a, b } => Noise::Factors {
                    a: once(&a)?,
                    b: once(&b)?,
                },
            })
        })
        .collect()
}

/// The per-leaf stream keys `fold_in(base_key, j)`, as one batch `[L]` (one draw).
fn streams(base: &Keys, leaves: &[LeafInfo]) -> Result<Keys, EsError> {
    let f = base.words().0.func();
    let ids = f.iota(TensorType::u32(&[leaves.len() as i64]), 0)?;
    Ok(base.fold_in(&ids)?)
}

/// The shapes of the values each leaf's noise is made of for one direction
/// (`[1, ..leaf shape]` dense, `[1, r, m]` and `[1, r, k]` for factors), probed by drawing
/// one direction in a scratch module that is then dropped: a manual computation declares
/// its results, and a loop its carry, before their bodies are built.
fn noise_shapes(
    strategy: &dyn Strategy,
    leaves: &[LeafInfo],
) -> Result<Vec<Vec<Vec<i64>>>, EsError> {
    let probe = Module::new("probe");
    let f = probe.func("probe");
    let key = Keys::from_data(&f.arg("key", TensorType::u32(&[2]))?)?;
    let dirs = f.iota(TensorType::u32(&[1]), 0)?;
    let noise = strategy.noise_all(&streams(&key, leaves)?, leaves, &dirs)?;
    Ok(noise
        .iter()
        .map(|n| n.values().iter().map(|v| v.shape().to_vec()).collect())
        .collect())
}

/// Rebuilds per-leaf noise from the flat values of [`Noise::values`]; `layout` has one
/// entry per value of each leaf, as [`noise_shapes`] gives them (shapes, or their ranks).
fn noise_from_values<T>(values: &[Value], layout: &[Vec<T>]) -> Vec<Noise> {
    let mut it = values.iter().cloned();
    layout
        .iter()
        .filter_map(|r| match r.len() {
            1 => it.next().map(Noise::Dense),
            _ => match (it.next(), it.next()) {
                (Some(a), Some(b)) => Some(Noise::Factors { a, b }),
                _ => None,
            },
        })
        .collect()
}

impl ShardedES {
    fn check_leaves(&self, leaves: &[LeafInfo]) -> Result<(), EsError> {
        for (j, l) in leaves.iter().enumerate() {
            if l.index != j {
                return Err(EsError::Param {
                    path: l.path.clone(),
                    reason: format!("leaf index {} at position {j}; use leaf_infos()", l.index),
                });
            }
        }
        Ok(())
    }

    /// Perturbed parameters of one member chunk for the model.
    fn perturbed(
        &self,
        params: &[Value],
        leaves: &[LeafInfo],
        noise: &[Noise],
        signs: &Value,
    ) -> Result<ModelParams, EsError> {
        let f = signs.func();
        let p = self.strategy.pairing() as i64;
        let sig = signs.mul(&f.scalar(self.sigma)?)?;
        let mut out = Vec::with_capacity(leaves.len());
        for ((leaf, theta), noise) in leaves.iter().zip(params).zip(noise) {
            let noise = noise.repeat(p)?;
            let entry = match noise {
                Noise::Factors { a, b } => {
                    let r = a.shape()[1];
                    let inv = f.scalar(1.0f32 / (r as f32).sqrt())?;
                    Leaf::Matrix(Weight::LowRank {
                        base: theta.clone(),
                        a,
                        b,
                        scale: sig.mul(&inv)?,
                    })
                }
                Noise::Dense(e) => {
                    let c = e.shape()[0];
                    let mut shape = vec![c];
                    shape.extend_from_slice(theta.shape());
                    let tdims: Vec<usize> = (1..shape.len()).collect();
                    let w = theta
                        .broadcast_in_dim(&shape, &tdims)?
                        .add(&scale_rows(&e, &sig)?)?;
                    if leaf.shape.len() == 2 {
                        Leaf::Matrix(Weight::Members(w))
                    } else {
                        Leaf::Dense(Act::per_member(w)?)
                    }
                }
            };
            out.push((leaf.path.clone(), entry));
        }
        Ok(ModelParams::new(out))
    }

    /// The loss of a chunk as `f32[c]` or `f32[c, g]`, refusing narrow fitness.
    fn chunk_fitness(&self, loss: Act, c: i64, tasks: usize) -> Result<Value, EsError> {
        match loss.dtype() {
            DType::F32 => {}
            DType::F64 => {}
            d @ (DType::BF16 | DType::F16) => {
                return Err(EsError::NarrowFitness {
                    dtype: d.mlir().to_string(),
                })
            }
            d => {
                return Err(invalid(
                    format!("the model's loss has element type {}", d.mlir()),
                    "return a float32 loss".into(),
                ))
            }
        }
        let logical = loss.logical_shape().to_vec();
        let want: Vec<i64> = if tasks > 1 {
            vec![tasks as i64]
        } else {
            vec![]
        };
        if logical != want {
            return Err(invalid(
                format!(
                    "the model's loss has logical shape {logical:?} but Model::tasks() = {tasks} \
                     expects {want:?}"
                ),
                "return one scalar per member, or [g] task losses with Model::tasks() = g \
                 (for group_relative)"
                    .into(),
            ));
        }
        let mut shape = vec![c];
        shape.extend_from_slice(&logical);
        let v = match loss.members() {
            Some(_) => loss.value().clone(),
            None => {
                let d: Vec<usize> = (1..shape.len()).collect();
                loss.value().broadcast_in_dim(&shape, &d)?
            }
        };
        Ok(if v.dtype() == DType::F64 {
            v.convert(DType::F32)?
        } else {
            v
        })
    }

    /// Noise for a block of directions: regenerated, or sliced from a materialized set;
    /// each element computed once ([`materialize`]). `apply` and `tell` both take their
    /// noise from here, so they see it through the same ops (and XLA compiles it alike).
    fn chunk_noise(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs: &Value,
        all: Option<(&[Noise], &Value)>,
    ) -> Result<Vec<Noise>, EsError> {
        let d = dirs.shape()[0];
        match all {
            // Sliced from noise that came through here (and `materialize`) already.
            Some((noise, start)) => noise
                .iter()
                .map(|n| Ok(n.dynamic_rows(start, d)?))
                .collect(),
            None => materialize(self.strategy.noise_all(streams, leaves, dirs)?),
        }
    }

    /// `apply`: every local member's loss. Runs inside the manual computation, on local
    /// values; `ids` are this device's global member ids.
    #[allow(clippy::too_many_arguments)]
    fn apply_local(
        &self,
        model: &dyn Model,
        ids: &Value,
        base_key: &Value,
        params: &[Value],
        batch: &[Value],
        layout: &Layout,
        keep: bool,
    ) -> Result<(Value, Option<Vec<Noise>>), EsError> {
        let (leaves, tasks) = (&layout.leaves[..], layout.tasks);
        let f = ids.func();
        let local = ids.shape()[0];
        let c = self.member_chunk()? as i64;
        let p = self.strategy.pairing() as i64;
        let base = Keys::from_data(base_key)?;
        let streams = streams(&base, leaves)?;
        let all = if self.strategy.materialized() {
            let (dirs, _) = directions(ids, p)?;
            Some(self.chunk_noise(&streams, leaves, &dirs, None)?)
        } else {
            None
        };
        let mut fshape = vec![local];
        if tasks > 1 {
            fshape.push(tasks as i64);
        }
        // With `keep`, the loop also writes each chunk's noise into buffers of every local
        // direction (unless the strategy materialized it already): `apply` evaluates
        // through exactly the ops it uses without them, so the fitness is the same bits.
        let shapes = if keep && all.is_none() {
            noise_shapes(self.strategy.as_ref(), leaves)?
        } else {
            Vec::new()
        };
        let mut inits = vec![f.full(0.0f32, &fshape)?];
        for shape in shapes.iter().flatten() {
            let mut s = shape.clone();
            s[0] = local / p;
            inits.push(f.full(0.0f32, &s)?);
        }
        let init_refs: Vec<&Value> = inits.iter().collect();
        let steps = (local / c) as i32;
        let stash = Stash::new();
        let out = f.fori_loop(0, steps, &init_refs, |i, carried| {
            stash.run("apply", || -> Result<Vec<Value>, EsError> {
                let start = i.mul(&f.scalar(c as i32)?)?;
                let ids_c = ids.dynamic_slice(&[&start], &[c])?;
                let (dirs, signs) = directions(&ids_c, p)?;
                let dstart = i.mul(&f.scalar((c / p) as i32)?)?;
                let noise = self.chunk_noise(
                    &streams,
                    leaves,
                    &dirs,
                    all.as_deref().map(|n| (n, &dstart)),
                )?;
                let mp = self.perturbed(params, leaves, &noise, &signs)?;
                let loss = model.loss(&mp, batch)?;
                let fit = self.chunk_fitness(loss, c, tasks)?;
                let zero = f.scalar(0i32)?;
                let starts: Vec<&Value> = if tasks > 1 {
                    vec![&start, &zero]
                } else {
                    vec![&start]
                };
                let mut next = vec![carried[0].dynamic_update_slice(&fit, &starts)?];
                if !shapes.is_empty() {
                    for (buf, v) in carried[1..]
                        .iter()
                        .zip(noise.iter().flat_map(Noise::values))
                    {
                        let mut at = vec![dstart.clone()];
                        at.resize(v.rank(), zero.clone());
                        let at: Vec<&Value> = at.iter().collect();
                        next.push(buf.dynamic_update_slice(&v, &at)?);
                    }
                }
                Ok(next)
            })
        });
        let mut out = stash.finish(out)?;
        let kept = match (keep, all) {
            (false, _) => None,
            (true, Some(all)) => Some(all),
            (true, None) => Some(noise_from_values(&out[1..], &shapes)),
        };
        Ok((out.swap_remove(0), kept))
    }

    /// `tell`'s contraction `u_j = Σ_i w_i s_i ε_j(i)` over the given members (local ids
    /// for `B`, all ids for `A`). Runs inside the manual computation.
    fn contract_local(
        &self,
        ids: &Value,
        weights: &Value,
        base_key: &Value,
        leaves: &[LeafInfo],
        kept: Option<Vec<Noise>>,
    ) -> Result<Vec<Value>, EsError> {
        let f = ids.func();
        let count = ids.shape()[0];
        let p = self.strategy.pairing() as i64;
        let (dirs_all, signs) = directions(ids, p)?;
        let mut coef = weights.mul(&signs)?;
        if p > 1 {
            coef = coef.reshape(&[count / p, p])?.reduce_sum(&[1])?;
        }
        // Σ_d k_d ε_d for a block of directions, per leaf.
        let contract = |noise: &[Noise], k: &Value| -> Result<Vec<Value>, EsError> {
            noise
                .iter()
                .map(|noise| {
                    Ok(match noise {
                        Noise::Dense(e) => {
                            let ed: Vec<usize> = vec![0];
                            k.dot_general(e, &dims(&[], &[], &[0], &ed))?
                        }
                        Noise::Factors { a, b } => {
                            let r = a.shape()[1];
                            let ks = k.mul(&f.scalar(1.0f32 / (r as f32).sqrt())?)?;
                            scale_rows(a, &ks)?.dot_general(b, &dims(&[], &[], &[0, 1], &[0, 1]))?
                        }
                    })
                })
                .collect()
        };
        let cd = self.tell_chunk(leaves, (count / p) as usize) as i64;
        let base = Keys::from_data(base_key)?;
        let streams = streams(&base, leaves)?;
        let all = if kept.is_some() {
            kept
        } else if self.strategy.materialized() {
            Some(self.chunk_noise(&streams, leaves, &dirs_all, None)?)
        } else {
            None
        };
        let inits: Vec<Value> = leaves
            .iter()
            .map(|l| f.full(0.0f32, &l.shape))
            .collect::<Result<_, _>>()?;
        let init_refs: Vec<&Value> = inits.iter().collect();
        let steps = (count / p / cd) as i32;
        let stash = Stash::new();
        let out = f.fori_loop(0, steps, &init_refs, |i, acc| {
            stash.run("tell", || -> Result<Vec<Value>, EsError> {
                let start = i.mul(&f.scalar(cd as i32)?)?;
                let dirs = dirs_all.dynamic_slice(&[&start], &[cd])?;
                let k = coef.dynamic_slice(&[&start], &[cd])?;
                let noise =
                    self.chunk_noise(&streams, leaves, &dirs, all.as_deref().map(|n| (n, &start)))?;
                contract(&noise, &k)?
                    .iter()
                    .zip(acc)
                    .map(|(term, u)| Ok(u.add(term)?))
                    .collect()
            })
        });
        stash.finish(out)
    }

    /// The layout for `model`; the fitness columns come from the model (the shaping's
    /// expectation, where it has one, must agree).
    fn layout(&self, model: &dyn Model, leaves: &[LeafInfo]) -> Result<Layout, EsError> {
        let tasks = model.tasks();
        self.check_tasks(tasks)?;
        Ok(Layout {
            leaves: leaves.to_vec(),
            batch: model.batch_types(),
            n: self.n,
            tasks,
        })
    }

    fn check_tasks(&self, tasks: usize) -> Result<(), EsError> {
        if tasks == 0 {
            return Err(invalid(
                "the model reports 0 tasks".into(),
                "return 1 from Model::tasks for a scalar loss, g for g task losses".into(),
            ));
        }
        match self.shaping.tasks() {
            Some(want) if want != tasks => Err(invalid(
                format!(
                    "the model returns {tasks} task losses per member but shaping {} takes {want}",
                    self.shaping.name()
                ),
                "use group_relative shaping for several task losses, or reduce the loss to \
                 one scalar per member"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// Declares the state and batch arguments: params (donated into results `0..L`),
    /// key, generation (donated into result `L`), batch.
    fn state_args(
        &self,
        f: &Func,
        layout: &Layout,
    ) -> Result<(Vec<Value>, Value, Value, Vec<Value>), EsError> {
        let mut params = Vec::new();
        for (j, l) in layout.leaves.iter().enumerate() {
            let v = f.arg_donated(
                &l.path,
                f32s(&l.shape),
                &Sharding::replicated(l.shape.len()),
                j,
            )?;
            params.push(v);
        }
        let key = f.arg_sharded("key", TensorType::u32(&[2]), &Sharding::replicated(1))?;
        let generation = f.arg_donated(
            "generation",
            TensorType::scalar(DType::U32),
            &Sharding::replicated(0),
            layout.leaves.len(),
        )?;
        let mut batch = Vec::new();
        for (name, ty) in &layout.batch {
            batch.push(f.arg_sharded(name, ty.clone(), &Sharding::replicated(ty.rank()))?);
        }
        Ok((params, key, generation, batch))
    }

    /// `ask`: the generation's base key `fold_in(key, generation)` (as u32[2]) and the
    /// incremented generation.
    fn ask(&self, key: &Value, generation: &Value) -> Result<(Value, Value), EsError> {
        let base = Keys::from_data(key)?.fold_in(generation)?.data()?;
        let next = generation.add(&generation.func().scalar(1u32)?)?;
        Ok((base, next))
    }

    /// `apply` over the whole population: fitness `f32[n]` (or `[n, g]`), split over "pop",
    /// and with `keep`, the noise of every direction (`[n / pairing, ..]` per value, split
    /// over "pop" alike) for `tell`.
    fn apply(
        &self,
        model: &dyn Model,
        layout: &Layout,
        base_key: &Value,
        params: &[Value],
        batch: &[Value],
        keep: bool,
    ) -> Result<(Value, Option<Vec<Noise>>), EsError> {
        let f = base_key.func();
        let n = self.n as i64;
        let ids = f
            .iota(TensorType::u32(&[n]), 0)?
            .shard(&Sharding::split(1, 0)?)?;
        let mut inputs: Vec<&Value> = vec![&ids, base_key];
        inputs.extend(params.iter());
        inputs.extend(batch.iter());
        let mut in_sh = vec![Sharding::split(1, 0)?, Sharding::replicated(1)];
        in_sh.extend(inputs[2..].iter().map(|v| Sharding::replicated(v.rank())));
        let tasks = layout.tasks;
        let out_rank = if tasks > 1 { 2 } else { 1 };
        let nl = params.len();
        let ranks: Vec<Vec<usize>> = if keep {
            noise_shapes(self.strategy.as_ref(), &layout.leaves)?
                .iter()
                .map(|l| l.iter().map(Vec::len).collect())
                .collect()
        } else {
            Vec::new()
        };
        let mut out_sh = vec![Sharding::split(out_rank, 0)?];
        for r in ranks.iter().flatten() {
            out_sh.push(Sharding::split(*r, 0)?);
        }
        let stash = Stash::new();
        let out = f.manual_computation(&inputs, &in_sh, &out_sh, |loc| {
            stash.run("apply", || {
                let (ids, key) = (&loc[0], &loc[1]);
                let (params, batch) = (&loc[2..2 + nl], &loc[2 + nl..]);
                let (fitness, kept) =
                    self.apply_local(model, ids, key, params, batch, layout, keep)?;
                let mut out = vec![fitness];
                out.extend(kept.iter().flatten().flat_map(Noise::values));
                Ok(out)
            })
        });
        let mut out = stash.finish(out)?;
        let kept = keep.then(|| noise_from_values(&out[1..], &ranks));
        Ok((out.swap_remove(0), kept))
    }

    /// `tell`: shaped weights → new parameters `θ − lr/(nσ) · u`, from the noise `apply`
    /// kept (`how = B` only) or regenerated.
    fn tell(
        &self,
        layout: &Layout,
        base_key: &Value,
        params: &[Value],
        weights: &Value,
        kept: Option<Vec<Noise>>,
    ) -> Result<Vec<Value>, EsError> {
        let f = base_key.func();
        let n = self.n as i64;
        let (member_sh, weights) = match self.how {
            How::B => (
                Sharding::split(1, 0)?,
                weights.shard(&Sharding::split(1, 0)?)?,
            ),
            How::A => (Sharding::replicated(1), weights.clone()),
        };
        let ids = f.iota(TensorType::u32(&[n]), 0)?.shard(&member_sh)?;
        let kept_values: Vec<Value> = kept.iter().flatten().flat_map(Noise::values).collect();
        if !kept_values.is_empty() && self.how != How::B {
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
        let out_sh: Vec<Sharding> = layout
            .leaves
            .iter()
            .map(|l| Sharding::replicated(l.shape.len()))
            .collect();
        let how = self.how;
        let stash = Stash::new();
        let u = f.manual_computation(&inputs, &in_sh, &out_sh, |loc| {
            stash.run("tell", || -> Result<Vec<Value>, EsError> {
                let kept = (!ranks.is_empty()).then(|| noise_from_values(&loc[3..], &ranks));
                let u = self.contract_local(&loc[0], &loc[1], &loc[2], &layout.leaves, kept)?;
                match how {
                    How::B => u.iter().map(|v| Ok(v.all_reduce_sum()?)).collect(),
                    How::A => Ok(u),
                }
            })
        });
        let u = stash.finish(u)?;
        let scale = f.scalar(self.update_scale())?;
        params
            .iter()
            .zip(u)
            .map(|(theta, u)| Ok(theta.sub(&u.mul(&scale)?)?))
            .collect()
    }

    /// Fitness → weights on every device.
    fn shape_fitness(&self, fitness: &Value) -> Result<Value, EsError> {
        let rep = fitness.shard(&Sharding::replicated(fitness.rank()))?;
        Ok(self.shaping.weights(&rep)?)
    }

    /// One generation, ask + apply + tell: `(params'…, generation + 1, fitness)`.
    fn one_generation(
        &self,
        model: &dyn Model,
        layout: &Layout,
        key: &Value,
        params: &[Value],
        generation: &Value,
        batch: &[Value],
    ) -> Result<Vec<Value>, EsError> {
        let (base_key, next) = self.ask(key, generation)?;
        let keep = self.keeps_noise(&layout.leaves);
        let (fitness, kept) = self.apply(model, layout, &base_key, params, batch, keep)?;
        let weights = self.shape_fitness(&fitness)?;
        let mut out = self.tell(layout, &base_key, params, &weights, kept)?;
        out.push(next);
        out.push(fitness);
        Ok(out)
    }

    /// The generation program: `(params…, key, generation, batch…) → (params'…,
    /// generation + 1, fitness)`. Params and generation are donated; the key is unchanged.
    pub fn generation_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        self.generation_program_multi(model, leaves, 1)
    }

    /// `k` generations in one program: the same arguments and results as
    /// [`ShardedES::generation_program`], with a `while` over generations inside, so one
    /// dispatch advances the state by `k` (generation + k) and returns the fitness of the
    /// last generation. Each iteration is exactly one generation's ask/apply/tell, so the
    /// parameters match `k` single steps. `k = 1` is the single-generation program.
    pub fn generation_program_multi(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
        k: usize,
    ) -> Result<Program, EsError> {
        let steps = i32::try_from(k).ok().filter(|&s| s > 0).ok_or_else(|| {
            invalid(
                format!("{k} generations per dispatch"),
                "use between 1 and 2^31 − 1 generations per dispatch".into(),
            )
        })?;
        self.check_leaves(leaves)?;
        self.member_chunk()?;
        let layout = self.layout(model, leaves)?;
        let mut module = Module::with_mesh("generation", Mesh::pop(self.devices as i64)?);
        let f = module.func("main");
        let (params, key, generation, batch) = self.state_args(&f, &layout)?;
        let mut fshape = vec![self.n as i64];
        if layout.tasks > 1 {
            fshape.push(layout.tasks as i64);
        }
        let nl = params.len();
        let out = if steps == 1 {
            self.one_generation(model, &layout, &key, &params, &generation, &batch)?
        } else {
            self.generation_loop(
                model,
                &layout,
                &key,
                &params,
                &generation,
                &batch,
                &fshape,
                steps,
            )?
        };
        for (p, l) in out[..nl].iter().zip(&layout.leaves) {
            f.output_sharded(p, &Sharding::replicated(l.shape.len()))?;
        }
        f.output_sharded(&out[nl], &Sharding::replicated(0))?;
        f.output_sharded(&out[nl + 1], &Sharding::split(fshape.len(), 0)?)?;
        module.add(f.finish()?)?;
        Ok(Program { module, layout })
    }

    /// `steps` generations as a `while` loop carrying the parameters, the generation and
    /// the last fitness.
    #[allow(clippy::too_many_arguments)]
    fn generation_loop(
        &self,
        model: &dyn Model,
        layout: &Layout,
        key: &Value,
        params: &[Value],
        generation: &Value,
        batch: &[Value],
        fshape: &[i64],
        steps: i32,
    ) -> Result<Vec<Value>, EsError> {
        let f = key.func();
        let fit0 = f
            .full(0.0f32, fshape)?
            .shard(&Sharding::split(fshape.len(), 0)?)?;
        let nl = params.len();
        let mut init: Vec<&Value> = params.iter().collect();
        init.push(generation);
        init.push(&fit0);
        let stash = Stash::new();
        let out = f.fori_loop(0, steps, &init, |_, c| {
            stash.run("generations", || {
                self.one_generation(model, layout, key, &c[..nl], &c[nl], batch)
            })
        });
        stash.finish(out)
    }

    /// The split mode's first half: `(params…, key, generation, batch…) → fitness`, nothing
    /// donated. Pair it with [`ShardedES::tell_program`] to compute rewards outside XLA.
    pub fn ask_apply_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        self.check_leaves(leaves)?;
        self.member_chunk()?;
        let layout = self.layout(model, leaves)?;
        let mut module = Module::with_mesh("ask_apply", Mesh::pop(self.devices as i64)?);
        let f = module.func("main");
        let mut params = Vec::new();
        for l in &layout.leaves {
            params.push(f.arg_sharded(
                &l.path,
                f32s(&l.shape),
                &Sharding::replicated(l.shape.len()),
            )?);
        }
        let key = f.arg_sharded("key", TensorType::u32(&[2]), &Sharding::replicated(1))?;
        let generation = f.arg_sharded(
            "generation",
            TensorType::scalar(DType::U32),
            &Sharding::replicated(0),
        )?;
        let mut batch = Vec::new();
        for (name, ty) in &layout.batch {
            batch.push(f.arg_sharded(name, ty.clone(), &Sharding::replicated(ty.rank()))?);
        }
        let (base_key, _) = self.ask(&key, &generation)?;
        let (fitness, _) = self.apply(model, &layout, &base_key, &params, &batch, false)?;
        f.output_sharded(&fitness, &Sharding::split(fitness.rank(), 0)?)?;
        module.add(f.finish()?)?;
        Ok(Program { module, layout })
    }

    /// The split mode's second half: `(params…, key, generation, fitness) → (params'…,
    /// generation + 1)` with a host-provided f32 fitness (replicated input).
    pub fn tell_program(&self, leaves: &[LeafInfo], tasks: usize) -> Result<Program, EsError> {
        self.check_tasks(tasks)?;
        self.check_leaves(leaves)?;
        self.member_chunk()?;
        let layout = Layout {
            leaves: leaves.to_vec(),
            batch: Vec::new(),
            n: self.n,
            tasks,
        };
        let mut module = Module::with_mesh("tell", Mesh::pop(self.devices as i64)?);
        let f = module.func("main");
        let (params, key, generation, _) = self.state_args(&f, &layout)?;
        let mut fshape = vec![self.n as i64];
        if tasks > 1 {
            fshape.push(tasks as i64);
        }
        let fitness = f.arg_sharded(
            "fitness",
            f32s(&fshape),
            &Sharding::replicated(fshape.len()),
        )?;
        let (base_key, next) = self.ask(&key, &generation)?;
        let weights = self.shape_fitness(&fitness)?;
        let new_params = self.tell(&layout, &base_key, &params, &weights, None)?;
        for (p, l) in new_params.iter().zip(&layout.leaves) {
            f.output_sharded(p, &Sharding::replicated(l.shape.len()))?;
        }
        f.output_sharded(&next, &Sharding::replicated(0))?;
        module.add(f.finish()?)?;
        Ok(Program { module, layout })
    }

    /// A zero-noise variant for the inference limit: the same member chunking, sharding
    /// and loss through the unperturbed parameters, every member evaluated.
    pub fn inference_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        let zero = ShardedES {
            strategy: Box::new(ZeroNoise),
            n: self.n,
            sigma: self.sigma,
            lr: self.lr,
            devices: self.devices,
            shaping: Box::new(super::shaping::NoShaping),
            how: self.how,
            member_chunk: Some(self.member_chunk()?),
            member_bytes: self.member_bytes,
            keep_noise_bytes: 0,
        };
        zero.ask_apply_program(model, leaves)
    }
}

/// Noise that is exactly zero and free, in the per-member layout: the inference baseline.
struct ZeroNoise;

impl Strategy for ZeroNoise {
    fn name(&self) -> String {
        "zero".into()
    }

    fn noise(
        &self,
        _stream: &Keys,
        leaf: &LeafInfo,
        dirs: &Value,
    ) -> crate::builder::Result<Noise> {
        let mut shape = vec![dirs.shape()[0]];
        shape.extend_from_slice(&leaf.shape);
        // Zero, but computed from the member ids: a constant zero lets XLA prove every
        // member's weights equal and evaluate one member for the whole chunk, which is
        // not the inference of n members this program stands for. `id · 0` is not folded
        // for floats (NaN semantics), so each member keeps its own weights.
        let f = dirs.func();
        let z = dirs
            .convert(crate::builder::DType::F32)?
            .mul(&f.scalar(0.0f32)?)?;
        Ok(Noise::Dense(z.broadcast_in_dim(&shape, &[0])?))
    }
}

/// What [`check_model`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Leaf path.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Reports every 2-D leaf the model reads without a seam and every leaf it never reads,
/// by building the model once for a chunk of two low-rank members.
pub fn check_model(model: &dyn Model, leaves: &[LeafInfo]) -> Result<Vec<Finding>, EsError> {
    let f = Func::new("check");
    let c = 2;
    let mut entries = Vec::new();
    for l in leaves {
        let theta = f.arg(&l.path, f32s(&l.shape))?;
        let entry = if let [m, k] = l.shape.as_slice() {
            Leaf::Matrix(Weight::LowRank {
                base: theta,
                a: f.full(0.0f32, &[c, 1, *m])?,
                b: f.full(0.0f32, &[c, 1, *k])?,
                scale: f.full(0.0f32, &[c])?,
            })
        } else {
            let mut shape = vec![c];
            shape.extend_from_slice(&l.shape);
            let d: Vec<usize> = (1..shape.len()).collect();
            Leaf::Dense(Act::per_member(theta.broadcast_in_dim(&shape, &d)?)?)
        };
        entries.push((l.path.clone(), entry));
    }
    let mp = ModelParams::new(entries);
    let mut batch = Vec::new();
    for (name, ty) in model.batch_types() {
        batch.push(f.arg(&name, ty)?);
    }
    let mut findings = Vec::new();
    if let Err(e) = model.loss(&mp, &batch) {
        match e {
            EsError::Param { .. } => {}
            other => return Err(other),
        }
    }
    let acc = mp.accesses();
    for l in leaves {
        match acc.get(&l.path) {
            None => findings.push(Finding {
                path: l.path.clone(),
                message: "never read by the model: remove it from the tree or use it".into(),
            }),
            Some(a) if l.shape.len() == 2 && a.contains(&Access::Raw) => findings.push(Finding {
                path: l.path.clone(),
                message: "2-D leaf read without a seam: use nn::dense(x, params.weight(..)) \
                          or nn::embed so low-rank strategies never densify it"
                    .into(),
            }),
            _ => {}
        }
    }
    Ok(findings)
}
