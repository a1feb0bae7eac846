//! [`ShardedES`], the settings of one run, and [`EsSpec`], the same settings as a config's
//! `[es]` section: validation (once, for both), the member-chunk policy, and the factors the
//! program derives from the settings.

use serde::{Deserialize, Serialize};

use super::error::{invalid, EsError};
use super::leaf_sigma::{LeafSettings, SigmaPatterns};
use super::model::{ChunkPolicy, Model};
use super::optimizer::{self, Optimizer, OptimizerSpec};
use super::precision::ComputeDtype;
use super::shaping::{Shaping, ShapingSpec};
use super::spec::{How, StrategySpec};
use super::strategy::{from_spec, LeafInfo, Strategy};

/// Sharded evolution strategies: the settings of one run, validated at construction.
pub struct ShardedES {
    pub(super) strategy: Box<dyn Strategy>,
    pub(super) n: usize,
    pub(super) sigma: f32,
    pub(super) lr: f32,
    pub(super) devices: usize,
    pub(super) shaping: Box<dyn Shaping>,
    pub(super) how: How,
    pub(super) member_chunk: Option<usize>,
    pub(super) member_bytes: Option<usize>,
    pub(super) device_invariant: bool,
    pub(super) keep_noise_bytes: usize,
    pub(super) optimizer: Optimizer,
    pub(super) leaf_sigma: LeafSettings,
    pub(super) compute_dtype: ComputeDtype,
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
            .field("device_invariant", &self.device_invariant)
            .field("keep_noise_bytes", &self.keep_noise_bytes)
            .field("optimizer", &self.optimizer)
            .field("leaf_sigma", &self.leaf_sigma)
            .field("compute_dtype", &self.compute_dtype)
            .finish()
    }
}

/// The largest default members per evaluation chunk: small enough that one chunk's activations
/// stay in cache-sized memory, and independent of the device count.
pub const DEFAULT_MEMBER_CHUNK: usize = 32;

/// The activation bytes a default member chunk aims to stay within when the model's
/// per-member size is known ([`Model::member_bytes`], [`ShardedES::with_member_bytes`]): half
/// a megabyte, the L2 cache of one core here. `shardes bench benches/quickstart.toml
/// --member-chunk C` measured 78, 72, 66 and 68 ms per generation for C = 32, 16, 8 and 4 at
/// 64 KiB per member.
pub const CHUNK_BYTES: usize = 512 * 1024;

/// The memory one member chunk of a [`ChunkPolicy::Batch`] model (a decode) may use: its
/// members' KV caches and activations. 4 GiB keeps a chunk well inside a CPU host's or an
/// accelerator's memory while holding every member of the decodes measured in
/// `docs/performance.md` in one batch (SmolLM2-135M, 32 members × 4 prompts × 152 slots:
/// 1.0 GiB).
pub const BATCH_BYTES: usize = 4 << 30;

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
        check_numbers(
            Names::Library,
            &Numbers {
                strategy: &strategy.name(),
                pairing: strategy.pairing(),
                n,
                sigma,
                lr,
                devices,
                member_chunk: None,
                optimizer: &Optimizer::sgd(),
            },
        )?;
        Ok(ShardedES {
            strategy,
            n,
            sigma,
            lr,
            devices,
            shaping: ShapingSpec::default().build(),
            how: How::default(),
            member_chunk: None,
            member_bytes: None,
            device_invariant: false,
            keep_noise_bytes: KEEP_NOISE_BYTES,
            optimizer: Optimizer::sgd(),
            leaf_sigma: LeafSettings::default(),
            compute_dtype: ComputeDtype::F32,
        })
    }

    /// Runs every model's forward in `dtype` on the f32 master parameters: `F32` (the
    /// default, today's programs) or `BF16` (the noise rounded to bf16 once, so `apply` and
    /// `tell` see the same bits; the fitness and the update stay f32; [`super::precision`]).
    /// Any other dtype is refused.
    pub fn with_compute_dtype(mut self, dtype: crate::builder::DType) -> Result<Self, EsError> {
        self.compute_dtype = ComputeDtype::of(dtype)?;
        Ok(self)
    }

    /// The dtype every model's forward runs in ([`ShardedES::with_compute_dtype`]).
    pub fn compute_dtype(&self) -> crate::builder::DType {
        self.compute_dtype.dtype()
    }

    /// Replaces the optimizer on the ES gradient (default [`Optimizer::sgd`], today's
    /// update), refusing hyper-parameters out of range.
    pub fn with_optimizer(mut self, optimizer: Optimizer) -> Result<Self, EsError> {
        // The other numbers were checked at construction; this is check_numbers' own check.
        optimizer::check(&optimizer, false)?;
        self.optimizer = optimizer;
        Ok(self)
    }

    /// The optimizer on the ES gradient.
    pub fn optimizer(&self) -> Optimizer {
        self.optimizer
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

    /// Keeps the default chunk of a [`ChunkPolicy::Batch`] model (a decode) a divisor of
    /// `n / 8`, as the fused programs' always is, so each member's outputs are computed by
    /// the same kernel shapes, and so are bit-identical, on 1, 2, 4 and 8 devices. Off by
    /// default: a decode then puts all of a device's members in one batch (within
    /// [`BATCH_BYTES`]), which is its throughput; on one device with `n = 16` the
    /// invariant chunk is 2 members, 8 times the steps.
    pub fn with_device_invariant(mut self, on: bool) -> Self {
        self.device_invariant = on;
        self
    }

    /// Whether default chunks of batch-policy models divide `n / 8`
    /// ([`ShardedES::with_device_invariant`]).
    pub fn device_invariant(&self) -> bool {
        self.device_invariant
    }

    /// Sets the bytes of one member's largest activation, which caps the default member
    /// chunk at [`CHUNK_BYTES`] of activation. Every program of this ES then uses the same
    /// chunk, whichever model it is built with. Unset (or `None`, or 0), each program takes
    /// its model's [`Model::member_bytes`], and [`ShardedES::member_chunk`] (no model) knows
    /// no size.
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
    /// population and the pairing. The member size is the one set with
    /// [`ShardedES::with_member_bytes`]; [`ShardedES::member_chunk_for`] is what the
    /// programs for a model use.
    pub fn member_chunk(&self) -> Result<usize, EsError> {
        self.chunk_with(self.member_bytes, ChunkPolicy::Cache)
    }

    /// The member chunk of the programs built for `model`: as [`ShardedES::member_chunk`],
    /// with the model's [`Model::member_bytes`] where [`ShardedES::with_member_bytes`] set
    /// none.
    pub fn member_chunk_for(&self, model: &dyn Model) -> Result<usize, EsError> {
        self.chunk_with(
            self.member_bytes
                .or(model.member_bytes().filter(|&b| b > 0)),
            model.chunk_policy(),
        )
    }

    fn chunk_with(
        &self,
        member_bytes: Option<usize>,
        policy: ChunkPolicy,
    ) -> Result<usize, EsError> {
        let local = self.n / self.devices;
        let p = self.strategy.pairing();
        let c = self
            .member_chunk
            .or(self.strategy.chunk())
            .unwrap_or_else(|| match policy {
                ChunkPolicy::Cache => self.default_chunk_with(member_bytes),
                ChunkPolicy::Batch { bytes } => self.batch_chunk_with(member_bytes, bytes),
            });
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
    /// difference between near ties into a different update). The member size is the one
    /// set with [`ShardedES::with_member_bytes`].
    pub fn default_member_chunk(&self) -> usize {
        self.default_chunk_with(self.member_bytes)
    }

    fn default_chunk_with(&self, member_bytes: Option<usize>) -> usize {
        let local = self.n / self.devices;
        let p = self.strategy.pairing().max(1);
        let base = if self.n.is_multiple_of(8) && (self.n / 8).is_multiple_of(p) {
            gcd(local, self.n / 8)
        } else {
            local
        };
        let cap = match member_bytes {
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

    /// The default chunk of a [`ChunkPolicy::Batch`] model: the largest multiple of the
    /// pairing that divides the local population (and `n / 8` under
    /// [`ShardedES::with_device_invariant`]) whose members fit `budget` bytes at
    /// `member_bytes` each (unbounded when the size is unknown).
    fn batch_chunk_with(&self, member_bytes: Option<usize>, budget: usize) -> usize {
        let local = self.n / self.devices;
        let p = self.strategy.pairing().max(1);
        let base = if self.device_invariant
            && self.n.is_multiple_of(8)
            && (self.n / 8).is_multiple_of(p)
        {
            gcd(local, self.n / 8)
        } else {
            local
        };
        let cap = member_bytes.map_or(usize::MAX, |b| (budget / b.max(1)).max(p));
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
    /// two directions per step, 129 ms with one). The evaluation chunk is
    /// [`ShardedES::member_chunk`]'s; a program for a model uses
    /// [`ShardedES::member_chunk_for`]'s.
    pub fn tell_chunk(&self, leaves: &[LeafInfo], dirs: usize) -> usize {
        self.tell_chunk_after(leaves, dirs, self.member_chunk().ok())
    }

    /// [`ShardedES::tell_chunk`] after an evaluation chunk of `apply_chunk` members.
    pub(super) fn tell_chunk_after(
        &self,
        leaves: &[LeafInfo],
        dirs: usize,
        apply_chunk: Option<usize>,
    ) -> usize {
        let bytes: usize = 4 * leaves
            .iter()
            .map(|l| self.strategy.noise_elements(l))
            .sum::<usize>();
        let apply_dirs = apply_chunk.map_or(1, |c| c / self.strategy.pairing().max(1));
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

    /// Refuses a model's fitness columns that the shaping does not take.
    pub(super) fn check_tasks(&self, tasks: usize) -> Result<(), EsError> {
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
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Whose names the messages of [`check_numbers`] use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Names {
    /// [`ShardedES::new`]'s parameters: `n`, `sigma`, `lr`, `devices`.
    Library,
    /// The config's keys, as the CLI reports them: `es.n`, `es.sigma`, ..., and the top-level
    /// `devices`.
    Config,
}

/// The numbers of a run, as [`check_numbers`] checks them.
struct Numbers<'a> {
    /// The strategy as named in messages.
    strategy: &'a str,
    pairing: usize,
    n: usize,
    sigma: f32,
    lr: f32,
    devices: usize,
    member_chunk: Option<usize>,
    optimizer: &'a Optimizer,
}

/// Two multiples of `per` near `n`, distinct: the one at or below `n` (at least `per`) and
/// the next above it.
fn nearby_multiples(n: usize, per: usize) -> (usize, usize) {
    let lower = (n / per).max(1) * per;
    let upper = ((n / per + 1) * per).max(lower + per);
    (lower, upper)
}

/// The one validation of the numbers of a run, for [`ShardedES::new`] and [`EsSpec::build`]:
/// the same checks, with each caller's names for the numbers (and its order where several
/// are wrong).
fn check_numbers(names: Names, s: &Numbers) -> Result<(), EsError> {
    let config = names == Names::Config;
    let key = |name: &str| {
        if config {
            format!("es.{name}")
        } else {
            name.to_string()
        }
    };
    let p = s.pairing;
    if p != 1 && p != 2 {
        return Err(invalid(
            format!("{} {} pairs {p} members", key("strategy"), s.strategy),
            "use a pairing of 1 or 2 (mirror a strategy at most once)".into(),
        ));
    }
    if s.devices == 0 {
        let fix = if config {
            "set devices to at least 1"
        } else {
            "use at least 1 device"
        };
        return Err(invalid("devices = 0".into(), fix.into()));
    }
    let n = key("n");
    if config && s.n == 0 {
        return Err(invalid(
            format!("{n} = 0"),
            format!("set {n} to at least 1"),
        ));
    }
    let per = s.devices * p;
    let mut indivisible = (s.n == 0 || !s.n.is_multiple_of(per)).then(|| {
        let (lo, hi) = nearby_multiples(s.n, per);
        let message = if config {
            format!(
                "{n} = {} is not divisible by devices ({}) × pairing ({p} for {})",
                s.n, s.devices, s.strategy
            )
        } else {
            format!(
                "{n} = {} is not a positive multiple of devices ({}) × pairing ({p})",
                s.n, s.devices
            )
        };
        invalid(
            message,
            format!("set {n} to a multiple of {per}, e.g. {lo} or {hi}"),
        )
    });
    // Where several numbers are wrong, each front end reports the one it always has: the
    // library the population first, the config sigma and lr first.
    if !config {
        if let Some(e) = indivisible.take() {
            return Err(e);
        }
    }
    let (sigma, lr) = (key("sigma"), key("lr"));
    // The library's and the config's texts differ in wording; library users' messages stay
    // as they were, and the CLI's are its config errors.
    let (finite_positive, such_as) = if config {
        ("is not a finite number > 0", ", e.g.")
    } else {
        ("is not finite and > 0", " such as")
    };
    if !(s.sigma.is_finite() && s.sigma > 0.0) {
        return Err(invalid(
            format!("{sigma} = {} {finite_positive}", s.sigma),
            format!("set {sigma} to a small positive number{such_as} 0.01"),
        ));
    }
    if !s.lr.is_finite() {
        return Err(invalid(
            format!("{lr} = {} is not finite", s.lr),
            format!("set {lr} to a finite number{such_as} 0.01"),
        ));
    }
    if let Some(e) = indivisible {
        return Err(e);
    }
    // Member ids and loop counters are 32-bit in the program.
    if s.n > i32::MAX as usize {
        return Err(invalid(
            format!(
                "{n} = {} exceeds the program's 32-bit member ids (at most {})",
                s.n,
                i32::MAX
            ),
            format!("lower {n}"),
        ));
    }
    // XLA flushes subnormal floats to zero, so such a σ perturbs no member at all, and
    // lr/(n·σ) is the update's f32 factor: where it overflows the first update is inf.
    if s.sigma < f32::MIN_POSITIVE {
        return Err(invalid(
            format!(
                "{sigma} = {:e} is too small for float32: below {:e} it is flushed to zero and \
                 perturbs nothing",
                s.sigma,
                f32::MIN_POSITIVE
            ),
            format!("set {sigma} to a small positive number{such_as} 0.01"),
        ));
    }
    let scale = s.lr / (s.n as f32 * s.sigma);
    if !scale.is_finite() {
        return Err(invalid(
            format!(
                "{lr} / ({n} · {sigma}) = {} / ({} · {:e}) overflows float32: the update would be \
                 infinite",
                s.lr, s.n, s.sigma
            ),
            format!("raise {sigma} or lower {lr}"),
        ));
    }
    if s.member_chunk == Some(0) {
        let chunk = key("member_chunk");
        return Err(invalid(
            format!("{chunk} = 0"),
            format!("set {chunk} to at least 1"),
        ));
    }
    optimizer::check(s.optimizer, config)
}

/// The `[es]` section of a config: the settings of a [`ShardedES`] as text and numbers.
/// Strategy, shaping and placement read and write as their names ([`StrategySpec`],
/// [`ShapingSpec`], [`How`]), so a bad name fails deserialization with its parse error;
/// unknown keys are refused. [`EsSpec::build`] checks the numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EsSpec {
    /// The strategy (default `mirrored(lowrank(r=1))`).
    #[serde(default = "default_strategy")]
    pub strategy: StrategySpec,
    /// Population size.
    pub n: usize,
    /// Noise scale.
    pub sigma: f32,
    /// Learning rate.
    pub lr: f32,
    /// Fitness shaping (default `centered_ranks`).
    #[serde(default)]
    pub shaping: ShapingSpec,
    /// Where the update is contracted (default `B`).
    #[serde(default)]
    pub how: How,
    /// Members evaluated together per loop step on each device (default: chosen from the
    /// model's member size, [`ShardedES::member_chunk_for`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_chunk: Option<usize>,
    /// MiB of noise per device that `how = B` keeps from `apply` for `tell` (default 16,
    /// [`KEEP_NOISE_BYTES`]; 0 always regenerates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_noise_mib: Option<usize>,
    /// The optimizer on the ES gradient: a name (`"adam"`) or a table with `name` and its
    /// settings (default `sgd`, today's update; left out when written back).
    #[serde(default, skip_serializing_if = "OptimizerSpec::is_default")]
    pub optimizer: OptimizerSpec,
    /// Globs over leaf paths whose leaves are frozen ([`ShardedES::with_freeze`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// A safetensors file of separable σ, `<leaf>.p` and `<leaf>.q` per 2-D leaf, read by
    /// the front end ([`ShardedES::with_sigma_separable`]); `build` does not read files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigma_separable: Option<std::path::PathBuf>,
    /// Where the update is contracted across processes when the population runs on several
    /// ([`super::processes`]): `A`, every process contracts the whole population (only the
    /// fitness crosses between processes), or `B`, each its own members and the partial
    /// sums are added across processes (default `A`, [`EsSpec::hosts_how`]). One process
    /// ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how_hosts: Option<How>,
    /// Per-leaf σ by glob pattern, first match wins (`es.sigma` for the rest; last: a table).
    #[serde(default, skip_serializing_if = "SigmaPatterns::is_empty")]
    pub sigma_leaves: SigmaPatterns,
    /// The dtype every model's forward runs in, `f32` (default) or `bf16`
    /// ([`ShardedES::with_compute_dtype`]; left out when unset, so configs without it keep
    /// their hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_dtype: Option<ComputeDtype>,
    /// Decode in member chunks that divide `n / 8`, so completions are bit-identical on 1,
    /// 2, 4 and 8 devices, at a cost in throughput ([`ShardedES::with_device_invariant`];
    /// default off, left out when off).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub device_invariant: bool,
}

fn default_strategy() -> StrategySpec {
    StrategySpec::Mirrored(Box::new(StrategySpec::LowRank { r: 1 }))
}

impl EsSpec {
    /// `n`, `sigma` and `lr` with every other key at its default.
    pub fn new(n: usize, sigma: f32, lr: f32) -> EsSpec {
        EsSpec {
            strategy: default_strategy(),
            n,
            sigma,
            lr,
            shaping: ShapingSpec::default(),
            how: How::default(),
            member_chunk: None,
            keep_noise_mib: None,
            optimizer: OptimizerSpec::default(),
            freeze: Vec::new(),
            sigma_separable: None,
            sigma_leaves: SigmaPatterns::default(),
            how_hosts: None,
            compute_dtype: None,
            device_invariant: false,
        }
    }

    /// The placement across processes: `es.how_hosts`, `A` when unset (`4·n` bytes cross
    /// between processes per generation, against a parameter-sized sum for `B`).
    pub fn hosts_how(&self) -> How {
        self.how_hosts.unwrap_or(How::A)
    }

    /// The noise budget in bytes ([`ShardedES::with_keep_noise_bytes`]).
    pub fn keep_noise_bytes(&self) -> usize {
        self.keep_noise_mib
            .map_or(KEEP_NOISE_BYTES, |m| m.saturating_mul(1 << 20))
    }

    /// The ES of these settings on `devices` devices. The errors name the config key
    /// (`es.n`, `es.sigma`, `es.lr`, `es.member_chunk`, `devices`) in
    /// [`EsError::message`], with the fix in [`EsError::fix`].
    pub fn build(&self, devices: usize) -> Result<ShardedES, EsError> {
        let strategy = from_spec(&self.strategy);
        let optimizer = self.optimizer.resolve()?;
        check_numbers(
            Names::Config,
            &Numbers {
                strategy: &self.strategy.to_string(),
                pairing: strategy.pairing(),
                n: self.n,
                sigma: self.sigma,
                lr: self.lr,
                devices,
                member_chunk: self.member_chunk,
                optimizer: &optimizer,
            },
        )?;
        let es = ShardedES {
            strategy,
            n: self.n,
            sigma: self.sigma,
            lr: self.lr,
            devices,
            shaping: self.shaping.build(),
            how: self.how,
            member_chunk: self.member_chunk,
            member_bytes: None,
            device_invariant: self.device_invariant,
            keep_noise_bytes: self.keep_noise_bytes(),
            optimizer,
            leaf_sigma: self.leaf_settings()?,
            compute_dtype: self.compute_dtype.unwrap_or_default(),
        };
        // A chunk that is set (by es.member_chunk or the strategy's chunk = C) must divide
        // the members per device; checked here, before any program is built.
        if self.member_chunk.is_some() || es.strategy.chunk().is_some() {
            let key = if self.member_chunk.is_some() {
                "es.member_chunk"
            } else {
                "es.strategy"
            };
            es.member_chunk().map_err(|e| {
                invalid(
                    format!("{key}: {}", e.message()),
                    e.fix().unwrap_or_default(),
                )
            })?;
        }
        Ok(es)
    }
}

#[cfg(test)]
mod tests;
