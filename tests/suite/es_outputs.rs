//! The outputs program (`ShardedES::outputs_program`) and its runner (`OutputsRunner`):
//! per-member outputs against a host oracle built from the materialized perturbation, the
//! sampling keys against their host derivation, 1 vs 8 devices, and tell from a host
//! fitness against `SplitTrainer`.
//!
//! Tolerances: the device evaluates `x Wᵀ + ((x B) Aᵀ)·sσ/√r` (low rank) where the oracle
//! multiplies by the materialized `W + sσ A Bᵀ/√r`: 1e-5 absolute on outputs of size ~1.
//! Keys, integer outputs, device-count invariance and tell against split mode are exact.

use crate::support::es::{base_key, Es, Inner};
use shardes::hlo::builder::{DType, TensorType, Value};
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{
    leaf_infos, EsError, MemberInfo, MemberOutputs, Model, ModelParams, ShardedES, SAMPLE_TAG,
};
use shardes::hlo::nn::{self, Act};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, key, normal, Key};
use shardes::runtime::Client;
use shardes::{HostArray, HostData, HostFitness, OutputsRunner, SplitTrainer};

const ROWS: usize = 3;
const IN: usize = 13;
const OUT: usize = 7;

/// `y = x Wᵀ + b` per member, with `argmax(y)` per row and the member's sampling key.
struct Linear;

impl MemberOutputs for Linear {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        vec![("x".into(), TensorType::f32(&[ROWS as i64, IN as i64]))]
    }

    fn output_types(&self) -> Vec<(String, TensorType)> {
        vec![
            ("y".into(), TensorType::f32(&[ROWS as i64, OUT as i64])),
            ("top".into(), TensorType::i32(&[ROWS as i64])),
            ("key".into(), TensorType::u32(&[2])),
            ("id".into(), TensorType::u32(&[])),
        ]
    }

    fn outputs(
        &self,
        p: &ModelParams,
        inputs: &[Value],
        member: &MemberInfo,
    ) -> Result<Vec<Act>, EsError> {
        let x = Act::shared(inputs[0].clone());
        let y = nn::dense(&x, &p.weight("w")?)?.add(&p.tensor("b")?)?;
        let top = match y.members() {
            Some(_) => Act::per_member(y.value().argmax(2)?)?,
            None => Act::shared(y.value().argmax(1)?),
        };
        Ok(vec![
            y,
            top,
            Act::per_member(member.keys.data()?)?,
            Act::per_member(member.ids.clone())?,
        ])
    }
}

/// The same model's loss `mean((y − target)²)`, for split mode.
struct LinearLoss;

impl Model for LinearLoss {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        Linear.input_types()
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let x = Act::shared(batch[0].clone());
        let y = nn::dense(&x, &p.weight("w")?)?.add(&p.tensor("b")?)?;
        let d = y.add_scalar(-0.5)?;
        Ok(d.mul(&d)?.mean_all()?)
    }
}

fn params() -> ParamTree {
    let k = key(3).unwrap();
    let leaf = |j: u32, shape: &[usize]| {
        let data = normal(fold_in(k, j), shape).unwrap();
        Array::new(shape.to_vec(), data.iter().map(|v| v * 0.5).collect()).unwrap()
    };
    ParamTree::map([
        ("b", ParamTree::Leaf(leaf(0, &[OUT]))),
        ("w", ParamTree::Leaf(leaf(1, &[OUT, IN]))),
    ])
}

fn x() -> HostArray {
    HostArray::f32(&[ROWS, IN], normal(key(4).unwrap(), &[ROWS, IN]).unwrap())
}

fn es(strategy: &str, n: usize, devices: usize) -> ShardedES {
    ShardedES::new(from_spec(&strategy.parse().unwrap()), n, 0.3, 0.1, devices).unwrap()
}

/// Member `i`'s leaves with its perturbation materialized on the host: `(b, w)`.
fn host_member(e: &Es, tree: &ParamTree, base: Key, i: usize) -> Vec<Vec<f32>> {
    crate::support::decode::member_params(e, tree, base, i)
        .leaves()
        .into_iter()
        .map(|(_, a)| a.data().to_vec())
        .collect()
}

fn host_y(b: &[f32], w: &[f32], x: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0f32; ROWS * OUT];
    for r in 0..ROWS {
        for o in 0..OUT {
            let dot: f32 = (0..IN).map(|i| x[r * IN + i] * w[o * IN + i]).sum();
            y[r * OUT + o] = dot + b[o];
        }
    }
    y
}

fn inner(strategy: &str) -> (Inner, bool) {
    match strategy {
        "lowrank(r=1)" => (Inner::LowRank(1), false),
        "mirrored(lowrank(r=2))" => (Inner::LowRank(2), true),
        "seed_regenerated" => (Inner::FullRank, false),
        "mirrored(iid_gaussian)" => (Inner::FullRank, true),
        s => panic!("no oracle for {s}"),
    }
}

#[test]
fn every_member_outputs_what_its_materialized_perturbation_gives() {
    let client = Client::cpu(8).unwrap();
    let tree = params();
    let k = key(11).unwrap();
    let xs = x();
    let xv = xs.as_f32().unwrap().to_vec();
    let n = 16;
    let generation = 5;
    for strategy in [
        "lowrank(r=1)",
        "mirrored(lowrank(r=2))",
        "seed_regenerated",
        "mirrored(iid_gaussian)",
    ] {
        let e = es(strategy, n, 8);
        let (inner, mirrored) = inner(strategy);
        let host = Es {
            inner,
            mirrored,
            n,
            sigma: 0.3,
            lr: 0.1,
        };
        let runner = OutputsRunner::with_state(&client, &e, &Linear, &tree, k, generation).unwrap();
        let outs = runner.outputs(std::slice::from_ref(&xs)).unwrap();
        assert_eq!(outs.len(), 4);
        assert_eq!(outs[0].dims, [n, ROWS, OUT]);
        let (y, top) = (outs[0].as_f32().unwrap(), outs[1].as_i32().unwrap());
        let keys = match &outs[2].data {
            shardes::HostData::U32(v) => v.clone(),
            other => panic!("keys are u32, got {other:?}"),
        };
        let ids = match &outs[3].data {
            shardes::HostData::U32(v) => v.clone(),
            other => panic!("ids are u32, got {other:?}"),
        };
        let base = base_key(k, generation);
        let sample = fold_in(base, SAMPLE_TAG);
        let mut worst = 0.0f32;
        for i in 0..n {
            assert_eq!(ids[i], i as u32, "{strategy}: member order");
            let leaves = host_member(&host, &tree, base, i);
            let want = host_y(&leaves[0], &leaves[1], &xv);
            let got = &y[i * ROWS * OUT..(i + 1) * ROWS * OUT];
            for (g, w) in got.iter().zip(&want) {
                worst = worst.max((g - w).abs());
            }
            for r in 0..ROWS {
                let row = &got[r * OUT..(r + 1) * OUT];
                let best = (0..OUT)
                    .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                    .unwrap();
                assert_eq!(top[i * ROWS + r], best as i32, "{strategy}: argmax");
            }
            assert_eq!(
                keys[2 * i..2 * i + 2],
                fold_in(sample, i as u32).data(),
                "{strategy}: member {i}'s sampling key"
            );
        }
        assert!(
            worst < 1e-5,
            "{strategy}: outputs off the oracle by {worst}"
        );
        // Members differ: the perturbation reaches the outputs.
        assert_ne!(y[..ROWS * OUT], y[ROWS * OUT * 2..ROWS * OUT * 3]);
        // The plain program: every member gets the unperturbed outputs, and the same keys.
        let plain = e
            .plain_outputs_program(&Linear, &leaf_infos(&tree))
            .unwrap();
        let exe = runner.compile(&plain).unwrap();
        let p = runner
            .run(&exe, &plain.layout, std::slice::from_ref(&xs))
            .unwrap();
        let b = tree.get("b").unwrap().data();
        let w = tree.get("w").unwrap().data();
        let want = host_y(b, w, &xv);
        let py = p[0].as_f32().unwrap();
        for i in 0..n {
            for (g, w) in py[i * ROWS * OUT..(i + 1) * ROWS * OUT].iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{strategy}: plain output {g} vs {w}");
            }
        }
        assert_eq!(p[2], outs[2], "{strategy}: plain keys");
    }
}

#[test]
fn outputs_are_identical_on_1_and_8_devices() {
    let client = Client::cpu(8).unwrap();
    let tree = params();
    let k = key(2).unwrap();
    for strategy in ["mirrored(lowrank(r=1))", "seed_regenerated"] {
        let run = |devices| {
            let e = es(strategy, 32, devices);
            OutputsRunner::with_state(&client, &e, &Linear, &tree, k, 3)
                .unwrap()
                .outputs(&[x()])
                .unwrap()
        };
        assert_eq!(run(1), run(8), "{strategy}");
    }
}

#[test]
fn a_host_fitness_told_from_the_outputs_updates_as_split_mode_does() {
    let client = Client::cpu(8).unwrap();
    let tree = params();
    let k = key(9).unwrap();
    let xs = x();
    let batch = vec![Array::new(vec![ROWS, IN], xs.as_f32().unwrap().to_vec()).unwrap()];
    for strategy in ["mirrored(lowrank(r=1))", "seed_regenerated"] {
        let e = es(strategy, 16, 8);
        let mut runner = OutputsRunner::with_state(&client, &e, &Linear, &tree, k, 0).unwrap();
        let mut split = SplitTrainer::new(&client, &e, &LinearLoss, &tree, k, &batch, 0).unwrap();
        for g in 0..3 {
            assert_eq!(runner.generation(), g);
            let y = runner.outputs(std::slice::from_ref(&xs)).unwrap();
            let y = y[0].as_f32().unwrap();
            // The loss on the host: mean((y − 0.5)²) per member.
            let fitness: Vec<f32> = y
                .chunks(ROWS * OUT)
                .map(|m| m.iter().map(|v| (v - 0.5) * (v - 0.5)).sum::<f32>() / m.len() as f32)
                .collect();
            let device = split.evaluate().unwrap();
            for (h, d) in fitness.iter().zip(&device) {
                assert!(
                    (h - d).abs() <= 1e-5 * d.abs().max(1.0),
                    "{strategy}: {h} vs {d}"
                );
            }
            crate::support::tell_both(
                &mut runner,
                &mut split,
                fitness,
                &format!("{strategy} g{g}"),
            );
        }
        assert_eq!(runner.generation(), 3);
        // Resumed from the state it reached, the runner outputs what it would have.
        let resumed =
            OutputsRunner::with_state(&client, &e, &Linear, &runner.params().unwrap(), k, 3)
                .unwrap();
        assert_eq!(
            resumed.outputs(std::slice::from_ref(&xs)).unwrap(),
            runner.outputs(std::slice::from_ref(&xs)).unwrap()
        );
        // A wrong fitness length and a wrong input are refused with what to pass.
        let err = runner.tell(&HostFitness::F32(vec![0.0; 3])).unwrap_err();
        assert!(err.to_string().contains("n = 16"), "{err}");
        let err = runner
            .outputs(&[HostArray::i32(&[ROWS, IN], vec![0; ROWS * IN])])
            .unwrap_err();
        assert!(err.to_string().contains("input `x`"), "{err}");
    }
}

#[test]
fn the_outputs_layout_returns_outputs_and_donates_nothing() {
    let tree = params();
    let e = es("mirrored(lowrank(r=1))", 16, 8);
    let p = e.outputs_program(&Linear, &leaf_infos(&tree)).unwrap();
    let text = p.module.to_mlir();
    assert!(!text.contains("tf.aliasing_output"), "nothing donated");
    assert_eq!(p.layout.result_count(), 4);
    assert_eq!(
        p.layout.output_types()[1],
        TensorType::new(DType::I32, &[16, ROWS as i64])
    );
    assert!(p.layout.split_results(vec![1, 2, 3, 4]).is_err());
    assert_eq!(
        p.layout.split_outputs(vec![1, 2, 3, 4]).unwrap(),
        [1, 2, 3, 4]
    );
    // Low rank: no value holds a member axis with both dimensions of `w`.
    for t in p.module.value_types() {
        let s = &t.shape;
        let has = |d: i64| s.contains(&d);
        assert!(
            !(has(OUT as i64) && has(IN as i64) && s.len() >= 3),
            "a perturbed matrix {t} was formed"
        );
    }
}

/// [`Linear`], which reads `w` through `dense`, plus `embed(w, ids)` with ids shared and
/// per member, its matrices stored as the program hands them over (`(in, out)` when
/// `in_out`, `MemberOutputs::matrices_in_out`).
struct Seams {
    in_out: bool,
}

impl MemberOutputs for Seams {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        Linear.input_types()
    }

    fn output_types(&self) -> Vec<(String, TensorType)> {
        let mut types = Linear.output_types();
        types.push(("rows".into(), TensorType::f32(&[2, IN as i64])));
        types.push(("own".into(), TensorType::f32(&[IN as i64])));
        types
    }

    fn outputs(&self, p: &ModelParams, x: &[Value], m: &MemberInfo) -> Result<Vec<Act>, EsError> {
        let mut out = Linear.outputs(p, x, m)?;
        let w = p.weight("w")?;
        let f = x[0].func();
        out.push(nn::embed(&w, &Act::shared(f.constant(&[2], &[6i32, 1])?))?);
        // Member i reads row i mod OUT.
        let own = m.ids.rem(&f.full(OUT as u32, m.ids.shape())?)?;
        out.push(nn::embed(&w, &Act::per_member(own.convert(DType::I32)?)?)?);
        Ok(out)
    }

    fn matrices_in_out(&self) -> bool {
        self.in_out
    }
}

/// An output's values as bits.
fn bits(h: &HostArray) -> Vec<u32> {
    match &h.data {
        HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::I32(v) => v.iter().map(|&x| x as u32).collect(),
        HostData::U32(v) => v.clone(),
    }
}

#[test]
fn matrices_handed_over_in_out_give_the_same_bits() {
    let client = Client::cpu(8).unwrap();
    let tree = params();
    let k = key(5).unwrap();
    for strategy in [
        "lowrank(r=1)",
        "mirrored(lowrank(r=2))",
        "seed_regenerated",
        "mirrored(iid_gaussian)",
    ] {
        let e = es(strategy, 16, 8);
        let run = |in_out| {
            let model = Seams { in_out };
            let pop = OutputsRunner::with_state(&client, &e, &model, &tree, k, 2).unwrap();
            let mut outs = pop.outputs(&[x()]).unwrap();
            // The unperturbed program too (every member the same weights).
            let plain = e.plain_outputs_program(&model, &leaf_infos(&tree)).unwrap();
            let exe = pop.compile(&plain).unwrap();
            outs.extend(pop.run(&exe, &plain.layout, &[x()]).unwrap());
            outs
        };
        let (stored, in_out) = (run(false), run(true));
        assert_eq!(stored.len(), 12);
        for (a, b) in stored.iter().zip(&in_out) {
            assert_eq!(bits(a), bits(b), "{strategy}");
        }
        // The unperturbed program's lookups are w's rows (not its columns) either way.
        let w = tree.leaves()[1].1.data().to_vec();
        let row = |i: usize| w[i * IN..(i + 1) * IN].to_vec();
        let want: Vec<f32> = [row(6), row(1)].concat();
        let own: Vec<f32> = (0..16).flat_map(|i| row(i % OUT)).collect();
        for outs in [&stored, &in_out] {
            assert_eq!(outs[10].as_f32().unwrap(), want.repeat(16), "{strategy}");
            assert_eq!(outs[11].as_f32().unwrap(), own.as_slice(), "{strategy}");
        }
    }
}
