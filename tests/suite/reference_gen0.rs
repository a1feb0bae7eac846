//! The independent host reference reproduces generation 0 of the quickstart run
//! (`shared/testdata/quickstart_gen0.safetensors`, computed with JAX):
//! `Mirrored(LowRank(1))`, n = 256, σ = 1e-2, lr = 1e-2, d_model = 64, batch 8 × seq 32.
//!
//! Tolerances (stated per check): params0/batch ≤ 1e-6 absolute (normal's bound); base key
//! exact; factors ≤ 1e-6 absolute; fitness ≤ 1e-5 relative; weights exact from the file's
//! fitness; update ≤ 1e-4 relative in norm per leaf.

use crate::support::es::{Data, Es, Inner, LeafNoise};
use crate::support::{max_abs_diff, rel_norm_diff, shaping};
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::{fold_in, key};
use shardes::hlo::problems::transformer_block::{init, make_batch, TransformerBlock};
use shardes::io::SafetensorsFile;

const QUICKSTART: Es = Es {
    inner: Inner::LowRank(1),
    mirrored: true,
    n: 256,
    sigma: 1e-2,
    lr: 1e-2,
};

fn gen0() -> SafetensorsFile {
    SafetensorsFile::open(crate::support::shared(
        "testdata/quickstart_gen0.safetensors",
    ))
    .expect("quickstart_gen0.safetensors")
}

fn bit_exact(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() == y.to_bits())
        .count()
}

struct Setup {
    file: SafetensorsFile,
    params: ParamTree,
    x: Vec<f32>,
    target: Vec<f32>,
}

fn setup() -> Setup {
    let file = gen0();
    let k0 = key(0).expect("seed 0");
    let cfg = TransformerBlock::QUICKSTART;
    let params = init(k0, cfg.d_model).expect("init");
    let batch = make_batch(fold_in(k0, 1), cfg.d_model, cfg.batch, cfg.seq).expect("batch");
    Setup {
        file,
        params,
        x: batch.x.into_data(),
        target: batch.target.into_data(),
    }
}

#[test]
fn params_batch_and_base_key() {
    let s = setup();
    let (mut exact, mut total, mut max_err) = (0, 0, 0.0f32);
    for (name, a) in s.params.leaves() {
        let want = s
            .file
            .f32(&format!("params0.{name}"))
            .expect("params0 leaf");
        assert_eq!(a.shape(), want.shape(), "params0.{name} shape");
        let err = max_abs_diff(a.data(), want.data());
        assert!(err <= 1e-6, "params0.{name}: max |err| {err:e}");
        exact += bit_exact(a.data(), want.data());
        total += a.len();
        max_err = max_err.max(err);
    }
    println!("params0: {exact}/{total} bit-exact, max |err| {max_err:e}");
    for (name, ours) in [("batch.x", &s.x), ("batch.target", &s.target)] {
        let want = s.file.f32(name).expect("batch tensor");
        assert_eq!(want.shape(), TransformerBlock::QUICKSTART.batch_shape());
        let err = max_abs_diff(ours, want.data());
        assert!(err <= 1e-6, "{name}: max |err| {err:e}");
        println!(
            "{name}: {}/{} bit-exact, max |err| {err:e}",
            bit_exact(ours, want.data()),
            ours.len()
        );
    }
    let (shape, bk) = s.file.u32("base_key").expect("base_key");
    assert_eq!(shape, vec![2]);
    let ours = crate::support::es::base_key(key(0).expect("seed"), 0);
    assert_eq!(ours.data().to_vec(), bk, "base_key = fold_in(key(0), 0)");
}

#[test]
fn low_rank_factors() {
    let s = setup();
    let base = crate::support::es::base_key(key(0).expect("seed"), 0);
    let mut max_err = 0.0f32;
    let (mut exact, mut total) = (0, 0);
    for (j, (name, w)) in s.params.leaves().into_iter().enumerate() {
        let fa = s.file.f32(&format!("factors.{name}.a")).expect("a");
        let fb = s.file.f32(&format!("factors.{name}.b")).expect("b");
        assert_eq!(fa.shape(), [128, 64, 1]);
        assert_eq!(fb.shape(), [128, 64, 1]);
        let (mut a_all, mut b_all) = (Vec::new(), Vec::new());
        for k in 0..QUICKSTART.directions() {
            match QUICKSTART.leaf_noise(base, j, w.shape(), k as u32) {
                LeafNoise::LowRank { a, b, .. } => {
                    a_all.extend(a);
                    b_all.extend(b);
                }
                LeafNoise::Full(_) => panic!("2-D leaf must be low rank"),
            }
        }
        for (ours, theirs, which) in [(&a_all, &fa, "a"), (&b_all, &fb, "b")] {
            let err = max_abs_diff(ours, theirs.data());
            assert!(err <= 1e-6, "factors.{name}.{which}: max |err| {err:e}");
            max_err = max_err.max(err);
            exact += bit_exact(ours, theirs.data());
            total += ours.len();
        }
    }
    println!("factors: {exact}/{total} bit-exact, max |err| {max_err:e}");
}

/// Midranks of `f` as 0-based positions (for counting rank disagreements).
fn ranks(f: &[f32]) -> Vec<f32> {
    let n = f.len() as f32;
    shaping::centered_ranks(f)
        .iter()
        .map(|w| (w + 0.5) * (n - 1.0))
        .collect()
}

#[test]
fn fitness_weights_and_update() {
    let s = setup();
    let cfg = TransformerBlock::QUICKSTART;
    let base = crate::support::es::base_key(key(0).expect("seed"), 0);
    let data = Data {
        x: &s.x,
        target: &s.target,
        batch: cfg.batch,
        seq: cfg.seq,
    };
    let t0 = std::time::Instant::now();
    let fitness = QUICKSTART.evaluate(&s.params, base, data);
    let eval_s = t0.elapsed().as_secs_f64();

    // Fitness: ≤ 1e-5 relative per member.
    let file_fitness = s.file.f32("fitness").expect("fitness");
    assert_eq!(file_fitness.shape(), [256]);
    let mut max_rel = 0.0f32;
    for (i, (ours, theirs)) in fitness.iter().zip(file_fitness.data()).enumerate() {
        let rel = ((ours - theirs) / theirs).abs();
        assert!(
            rel <= 1e-5,
            "fitness[{i}]: ours {ours}, JAX {theirs}, rel {rel:e}"
        );
        max_rel = max_rel.max(rel);
    }
    println!(
        "fitness: max rel err {max_rel:e}, {}/256 bit-exact ({eval_s:.2} s for 256 members)",
        bit_exact(&fitness, file_fitness.data())
    );

    // Weights: centered_ranks of the file's fitness reproduce the file's weights exactly;
    // from our own fitness they agree except where near-ties swap.
    let file_weights = s.file.f32("weights").expect("weights");
    let w_file = shaping::centered_ranks(file_fitness.data());
    assert_eq!(
        w_file.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        file_weights
            .data()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        "centered_ranks(file fitness) must equal the file's weights bit for bit"
    );
    let w_ours = shaping::centered_ranks(&fitness);
    let swapped = ranks(&fitness)
        .iter()
        .zip(ranks(file_fitness.data()))
        .filter(|(a, b)| **a != *b)
        .count();
    println!("weights: from file fitness exact; from our fitness {swapped}/256 ranks differ");

    // Update: parameters after tell minus params0, ≤ 1e-4 relative in norm per leaf.
    for (label, weights) in [("file weights", &w_file), ("our weights", &w_ours)] {
        let new = QUICKSTART.update(&s.params, base, weights);
        let mut worst = 0.0f64;
        for ((name, p0), (_, p1)) in s.params.leaves().into_iter().zip(new.leaves()) {
            let delta = crate::support::sub(p1.data(), p0.data());
            let want = s.file.f32(&format!("update.{name}")).expect("update leaf");
            let rel = rel_norm_diff(&delta, want.data());
            worst = worst.max(rel);
            if label == "file weights" || swapped == 0 {
                assert!(rel <= 1e-4, "update.{name} ({label}): rel norm err {rel:e}");
            }
        }
        println!("update ({label}): max per-leaf rel norm err {worst:e}");
    }
}

/// Hand-computed shaping cases (tolerance 1e-7 absolute unless a test says exact).
mod shaping_cases {
    use crate::support::shaping::{centered, centered_ranks, group_relative, none};

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-7, "[{i}]: got {g}, want {w}");
        }
    }

    #[test]
    fn ties_get_midranks() {
        // Sorted: 1 (pos 0), 2 (pos 1), 3 and 3 (pos 2, 3 → midrank 2.5); n − 1 = 3.
        close(
            &centered_ranks(&[3.0, 1.0, 3.0, 2.0]),
            &[2.5 / 3.0 - 0.5, -0.5, 2.5 / 3.0 - 0.5, 1.0 / 3.0 - 0.5],
        );
        // All tied: everyone gets the middle, exactly 0.
        assert_eq!(centered_ranks(&[7.0; 5]), vec![0.0; 5]);
    }

    #[test]
    fn nan_ranks_worst() {
        close(&centered_ranks(&[f32::NAN, 0.0, 1.0]), &[0.5, -0.5, 0.0]);
        // NaN becomes +inf, so it ties with a real +inf (positions 1 and 2 → 1.5).
        close(
            &centered_ranks(&[f32::NAN, f32::INFINITY, 0.0]),
            &[0.25, 0.25, -0.5],
        );
    }

    #[test]
    fn fewer_than_two_members() {
        assert_eq!(centered_ranks(&[5.0]), vec![0.0]);
        assert!(centered_ranks(&[]).is_empty());
        assert_eq!(centered(&[4.0]), vec![4.0]);
    }

    #[test]
    fn centered_and_none() {
        // mean 2, n/(n − 1) = 1.5.
        close(&centered(&[1.0, 2.0, 3.0]), &[-1.5, 0.0, 1.5]);
        assert_eq!(none(&[1.0, -2.0]), vec![1.0, -2.0]);
    }

    #[test]
    fn group_relative_zero_spread_task_contributes_zero() {
        // n = 3 members × g = 2 tasks, row-major; task 1 has zero spread.
        let f = [1.0, 5.0, 2.0, 5.0, 3.0, 5.0];
        let w = group_relative(&f, 3, 2);
        let sd = (2.0f32 / 3.0).sqrt();
        close(&w, &[-0.5 / sd, 0.0, 0.5 / sd]);
        // Exactly: task 1 adds 0, so w = advantage of task 0 / 2, bit for bit.
        let only0 = group_relative(&[1.0, 2.0, 3.0], 3, 1);
        for (a, b) in w.iter().zip(&only0) {
            assert_eq!(a.to_bits(), (b / 2.0).to_bits());
        }
        assert_eq!(group_relative(&[4.0, 4.0], 2, 1), vec![0.0, 0.0]);
    }
}

mod es_cases {
    use crate::support::es::{Data, Es, Inner, LeafNoise};
    use crate::support::{model, shaping};
    use shardes::hlo::params::{Array, ParamTree};
    use shardes::hlo::prng::{fold_in, key, normal};
    use shardes::hlo::problems::transformer_block::{init, make_batch};

    fn tree_with_vector_leaf() -> ParamTree {
        let k = key(3).expect("seed");
        let mut t = init(k, 8).expect("init");
        if let ParamTree::Map(m) = &mut t {
            let bias = normal(fold_in(k, 99), &[8]).expect("shape");
            m.insert(
                "bias".into(),
                ParamTree::Leaf(Array::new(vec![8], bias).expect("size")),
            );
        }
        t
    }

    #[test]
    fn mirrored_uniform_fitness_gives_exactly_zero_update() {
        let params = tree_with_vector_leaf();
        let base = fold_in(key(5).expect("seed"), 0);
        for inner in [Inner::FullRank, Inner::LowRank(2)] {
            let es = Es {
                inner,
                mirrored: true,
                n: 8,
                sigma: 0.1,
                lr: 0.5,
            };
            for weights in [
                shaping::centered_ranks(&[1.25; 8]),
                shaping::none(&[1.25; 8]),
            ] {
                let new = es.update(&params, base, &weights);
                for ((p, a), (_, b)) in params.leaves().into_iter().zip(new.leaves()) {
                    assert_eq!(a, b, "{inner:?}: leaf {p} moved");
                }
            }
            // A non-uniform fitness does move every leaf (the check above can fail).
            let w = shaping::centered_ranks(&[0.0, 1.0, 5.0, 2.0, 3.0, 7.0, 6.0, 4.0]);
            let new = es.update(&params, base, &w);
            for ((p, a), (_, b)) in params.leaves().into_iter().zip(new.leaves()) {
                assert_ne!(a, b, "{inner:?}: leaf {p} did not move");
            }
        }
    }

    #[test]
    fn low_rank_seam_equals_dense_perturbation() {
        // dense(x, W_i) = x Wᵀ + ((x B) Aᵀ)·sσ/√r must equal x (W + sσ A Bᵀ/√r)ᵀ; ≤ 1e-5 relative.
        let k = key(11).expect("seed");
        let d = 8;
        let params = init(k, d).expect("init");
        let b = make_batch(fold_in(k, 1), d, 2, 4).expect("batch");
        let base = fold_in(k, 0);
        let r = 2;
        let es = Es {
            inner: Inner::LowRank(r),
            mirrored: true,
            n: 4,
            sigma: 0.3,
            lr: 1.0,
        };
        let data = Data {
            x: b.x.data(),
            target: b.target.data(),
            batch: 2,
            seq: 4,
        };
        for i in 0..es.n {
            let seam = es.member_loss(&params, base, i, data);
            let (id, s) = es.member(i);
            let dense_w: Vec<(String, Vec<f32>)> = params
                .leaves()
                .into_iter()
                .enumerate()
                .map(|(j, (p, w))| match es.leaf_noise(base, j, w.shape(), id) {
                    LeafNoise::LowRank { a, b, m, k, r } => {
                        let c = s * es.sigma / (r as f32).sqrt();
                        let mut wi = w.data().to_vec();
                        for row in 0..m {
                            for col in 0..k {
                                let e: f32 = (0..r).map(|q| a[row * r + q] * b[col * r + q]).sum();
                                wi[row * k + col] += c * e;
                            }
                        }
                        (p, wi)
                    }
                    LeafNoise::Full(_) => panic!("2-D leaf"),
                })
                .collect();
            let dense = |name: &str, h: &[f32], rows: usize| {
                let w = &dense_w.iter().find(|(p, _)| p == name).expect("leaf").1;
                model::dense(h, rows, w, d, d)
            };
            let out = model::forward(data.x, 2, 4, d, &dense);
            let full = model::mse(&out, data.target);
            let rel = ((seam - full) / full).abs();
            assert!(rel <= 1e-5, "member {i}: seam {seam} vs dense {full}");
        }
    }
}
