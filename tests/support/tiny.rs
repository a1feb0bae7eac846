//! Small models for the ES tests, cheap to compile: a 2-layer MLP with prime leaf dims
//! (so a member × m × k value is unambiguous in a shape), a multi-task variant, a
//! constant loss, a quadratic with a known gradient, and helpers to run one generation.

use shardes::hlo::builder::{DType, TensorType, Value};
use shardes::hlo::es::{EsError, Model, ModelParams, ShardedES};
use shardes::hlo::nn::{self, Act};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, key, normal, Key};
use shardes::runtime::Client;
use shardes::Trainer;

/// Rows of the MLP's batch (also its task count in the multi-task variant).
pub const BATCH: usize = 3;
/// Input width (k of `w1`).
pub const IN: usize = 13;
/// Hidden width (m of `w1`, k of `w2`, and the bias length).
pub const HIDDEN: usize = 7;
/// Output width (m of `w2`).
pub const OUT: usize = 5;

/// `out = w2 · tanh(w1 · x + b1)`, loss `mean((out − target)²)` (or one mean per batch
/// row when `tasks > 1`), optionally cast to a narrower dtype to test the refusal.
#[derive(Clone, Copy, Debug)]
pub struct Mlp {
    /// 1 for a scalar loss, [`BATCH`] for one loss per batch row.
    pub tasks: usize,
    /// The dtype the loss is returned in.
    pub loss_dtype: DType,
    /// Reads `w1` with `ModelParams::tensor` instead of the seam (for `check_model`).
    pub raw_w1: bool,
    /// Never reads `b1` (for `check_model`).
    pub skip_b1: bool,
}

impl Mlp {
    /// The plain scalar-loss MLP.
    pub const PLAIN: Mlp = Mlp {
        tasks: 1,
        loss_dtype: DType::F32,
        raw_w1: false,
        skip_b1: false,
    };

    /// One loss per batch row (for `group_relative`).
    pub const MULTI: Mlp = Mlp {
        tasks: BATCH,
        ..Mlp::PLAIN
    };
}

impl Model for Mlp {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        vec![
            ("x".into(), TensorType::f32(&[BATCH as i64, IN as i64])),
            (
                "target".into(),
                TensorType::f32(&[BATCH as i64, OUT as i64]),
            ),
        ]
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let [x, target] = batch else {
            return Err(EsError::Invalid {
                message: format!("Mlp takes 2 batch arrays, got {}", batch.len()),
                fix: "pass x and target".into(),
            });
        };
        let x = Act::shared(x.clone());
        if self.raw_w1 {
            // Deliberately wrong: a dense read of a 2-D leaf (refused under low rank).
            p.tensor("w1")?;
        }
        let pre = nn::dense(&x, &p.weight("w1")?)?;
        let pre = if self.skip_b1 {
            pre
        } else {
            pre.add(&p.tensor("b1")?)?
        };
        let h = pre.map(|v| v.tanh())?;
        let out = nn::dense(&h, &p.weight("w2")?)?;
        let diff = out.sub(&Act::shared(target.clone()))?;
        let sq = diff.mul(&diff)?;
        let loss = if self.tasks > 1 {
            sq.mean_dims(&[1])?
        } else {
            sq.mean_all()?
        };
        Ok(loss.map(|v| v.convert(self.loss_dtype))?)
    }

    fn tasks(&self) -> usize {
        self.tasks
    }
}

/// Parameters `b1 [7]`, `w1 (7, 13)`, `w2 (5, 7)` drawn from `seed`.
pub fn mlp_params(seed: u64) -> ParamTree {
    let k = key(seed).expect("small seed");
    let leaf = |j: u32, shape: &[usize], scale: f32| {
        let data: Vec<f32> = normal(fold_in(k, j), shape)
            .expect("small shape")
            .into_iter()
            .map(|v| v * scale)
            .collect();
        Array::new(shape.to_vec(), data).expect("shape matches")
    };
    ParamTree::map([
        ("b1", ParamTree::Leaf(leaf(0, &[HIDDEN], 0.5))),
        ("w1", ParamTree::Leaf(leaf(1, &[HIDDEN, IN], 0.4))),
        ("w2", ParamTree::Leaf(leaf(2, &[OUT, HIDDEN], 0.5))),
    ])
}

/// The usual MLP setup: an 8-device CPU client, [`mlp_params`]`(1)` and [`mlp_batch`]`(2)`.
pub fn mlp_on_8_devices() -> (Client, ParamTree, Vec<Array>) {
    let client = Client::cpu(8).expect("8 CPU devices");
    (client, mlp_params(1), mlp_batch(2))
}

/// Every strategy of the grids: the four noise families, each also mirrored.
pub const STRATEGIES: [&str; 8] = [
    "lowrank(r=1)",
    "lowrank(r=2)",
    "seed_regenerated(chunk=4)",
    "iid_gaussian",
    "mirrored(lowrank(r=1))",
    "mirrored(lowrank(r=2))",
    "mirrored(seed_regenerated(chunk=4))",
    "mirrored(iid_gaussian)",
];

/// A batch `x [3, 13]`, `target [3, 5]` drawn from `seed`.
pub fn mlp_batch(seed: u64) -> Vec<Array> {
    let k = fold_in(key(seed).expect("small seed"), 99);
    let x = normal(fold_in(k, 0), &[BATCH, IN]).expect("small shape");
    let t = normal(fold_in(k, 1), &[BATCH, OUT]).expect("small shape");
    vec![
        Array::new(vec![BATCH, IN], x).expect("shape matches"),
        Array::new(vec![BATCH, OUT], t).expect("shape matches"),
    ]
}

/// A loss that is the same constant for every member (reads every leaf, then discards it).
#[derive(Clone, Copy, Debug)]
pub struct Constant;

impl Model for Constant {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        Mlp::PLAIN.batch_types()
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let real = Mlp::PLAIN.loss(p, batch)?;
        // 0·loss + 1.5 is exactly 1.5 for every finite loss.
        Ok(real.scale(0.0)?.add_scalar(1.5)?)
    }
}

/// `f(θ) = ½‖b − b*‖² + ½‖w − w*‖²` over leaves `b [7]` and `w (5, 3)`; the 2-D leaf is
/// read through the seam as `dense(I₃, w) = wᵀ`. Batch: `eye [3, 3]`, `bt [7]`, `wt [3, 5]`
/// (= `w*ᵀ`).
#[derive(Clone, Copy, Debug)]
pub struct Quadratic;

/// `(m, k)` of the quadratic's 2-D leaf.
pub const QUAD_W: [usize; 2] = [5, 3];
/// Length of the quadratic's 1-D leaf.
pub const QUAD_B: usize = 7;

impl Model for Quadratic {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        let [m, k] = QUAD_W.map(|d| d as i64);
        vec![
            ("eye".into(), TensorType::f32(&[k, k])),
            ("bt".into(), TensorType::f32(&[QUAD_B as i64])),
            ("wt".into(), TensorType::f32(&[k, m])),
        ]
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let [eye, bt, wt] = batch else {
            return Err(EsError::Invalid {
                message: format!("Quadratic takes 3 batch arrays, got {}", batch.len()),
                fix: "pass eye, bt and wt".into(),
            });
        };
        let db = p.tensor("b")?.sub(&Act::shared(bt.clone()))?;
        let wt_member = nn::dense(&Act::shared(eye.clone()), &p.weight("w")?)?;
        let dw = wt_member.sub(&Act::shared(wt.clone()))?;
        let nb = QUAD_B as f64;
        let nw = (QUAD_W[0] * QUAD_W[1]) as f64;
        let fb = db.mul(&db)?.mean_all()?.scale(nb / 2.0)?;
        let fw = dw.mul(&dw)?.mean_all()?.scale(nw / 2.0)?;
        Ok(fb.add(&fw)?)
    }
}

/// The update `θ₁ − θ₀` of each leaf after one generation, and the fitness.
pub struct Generation {
    /// Fitness in member order.
    pub fitness: Vec<f32>,
    /// Per leaf (leaf order), `θ₁ − θ₀`.
    pub update: Vec<Vec<f32>>,
    /// The trainer after the step.
    pub trainer: Trainer,
}

/// Runs generation 0 of `es` on `model` from `params` with `batch` and key 7.
pub fn one_generation(
    client: &Client,
    es: &ShardedES,
    model: &dyn Model,
    params: &ParamTree,
    batch: &[Array],
) -> Generation {
    let k: Key = key(7).expect("small seed");
    let mut trainer = Trainer::with_state(client, es, model, params, k, batch, 0)
        .unwrap_or_else(|e| panic!("building {es:?}: {e}"));
    let fitness = trainer.step().expect("step");
    let after = trainer.params().expect("params");
    let update = params
        .leaves()
        .into_iter()
        .zip(after.leaves())
        .map(|((_, a0), (_, a1))| {
            a1.data()
                .iter()
                .zip(a0.data())
                .map(|(x, y)| x - y)
                .collect()
        })
        .collect();
    Generation {
        fitness,
        update,
        trainer,
    }
}
