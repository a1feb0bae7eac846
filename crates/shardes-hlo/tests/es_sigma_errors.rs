//! Per-leaf σ and frozen leaves: the settings that are refused, each with an error naming
//! the setting (the library's method or the config key) and, where the leaves decide, the
//! leaf paths; and what resolves, leaf by leaf. No plugin: programs are only built.

use std::collections::BTreeMap;

use shardes_hlo::es::strategy::from_spec;
use shardes_hlo::es::{
    leaf_infos, EsError, EsSpec, LeafInfo, LeafScale, LeafSigma, ShardedES, SigmaPatterns,
    StrategySpec,
};
use shardes_hlo::prng::key;
use shardes_hlo::problems::transformer_block::TransformerBlock;

/// The quickstart block's leaves: `w_down`, `w_up`, `wk`, `wo`, `wq`, `wv`, each (64, 64).
fn block() -> (TransformerBlock, Vec<LeafInfo>) {
    let tb = TransformerBlock::QUICKSTART;
    let leaves = leaf_infos(&tb.init(key(0).unwrap()).unwrap());
    (tb, leaves)
}

const PATHS: &str = "w_down, w_up, wk, wo, wq, wv";

fn lib() -> ShardedES {
    let s: StrategySpec = "mirrored(lowrank(r=1))".parse().unwrap();
    ShardedES::new(from_spec(&s), 16, 0.01, 0.01, 2).unwrap()
}

fn scalar_tree(paths: &[&str], sigma: f32) -> BTreeMap<String, LeafSigma> {
    paths
        .iter()
        .map(|p| (p.to_string(), LeafSigma::Scalar(sigma)))
        .collect()
}

const ALL: [&str; 6] = ["w_down", "w_up", "wk", "wo", "wq", "wv"];

fn message(r: Result<ShardedES, EsError>) -> String {
    r.expect_err("refused").message()
}

/// The message of the error building the generation program.
fn program_error(es: &ShardedES) -> (String, String) {
    let (tb, leaves) = block();
    let e = es
        .generation_program(&tb, &leaves)
        .err()
        .expect("the program is refused");
    // The same error from the resolution itself.
    let again = es.leaf_scales(&leaves).expect_err("refused");
    assert_eq!(e.message(), again.message());
    (e.message(), e.fix().unwrap_or_default())
}

#[test]
fn bad_sigma_values_in_the_library_tree_name_the_leaf() {
    for (bad, shown) in [
        (-1.0f32, "-1"),
        (f32::NAN, "NaN"),
        (0.0, "0"),
        (f32::INFINITY, "inf"),
    ] {
        let mut tree = scalar_tree(&ALL, 0.01);
        tree.insert("wq".into(), LeafSigma::Scalar(bad));
        let m = message(lib().with_sigma_leaves(tree));
        assert_eq!(
            m,
            format!("sigma_leaves[\"wq\"] = {shown} is not a finite number > 0"),
            "{bad}"
        );
    }
    let mut tree = scalar_tree(&ALL, 0.01);
    tree.insert("wq".into(), LeafSigma::Scalar(1e-45));
    assert!(message(lib().with_sigma_leaves(tree)).contains("too small for float32"));
    let mut tree = scalar_tree(&ALL, 0.01);
    tree.insert(
        "wq".into(),
        LeafSigma::Separable {
            p: vec![1.0; 64],
            q: vec![f32::NAN; 64],
        },
    );
    let m = message(lib().with_sigma_leaves(tree));
    assert_eq!(
        m,
        "sigma_leaves[\"wq\"]: q[0] = NaN is not a finite number > 0"
    );
}

#[test]
fn a_library_tree_with_a_missing_or_an_extra_leaf_is_refused() {
    let missing = lib()
        .with_sigma_leaves(scalar_tree(&ALL[..5], 0.01))
        .unwrap();
    let (m, fix) = program_error(&missing);
    assert_eq!(
        m,
        format!("sigma_leaves has no σ for leaf \"wv\"; the tree's leaves are: {PATHS}")
    );
    assert_eq!(fix, "give exactly one σ per leaf of the tree");
    let mut tree = scalar_tree(&ALL, 0.01);
    tree.insert("wz".into(), LeafSigma::Scalar(0.01));
    let (m, _) = program_error(&lib().with_sigma_leaves(tree).unwrap());
    assert_eq!(
        m,
        format!("sigma_leaves[\"wz\"] names no leaf; the tree's leaves are: {PATHS}")
    );
}

#[test]
fn config_patterns_are_checked_by_value_and_against_the_leaves() {
    let spec = |patterns: &[(&str, f32)]| {
        let mut s = EsSpec::new(16, 0.01, 0.01);
        s.sigma_leaves = SigmaPatterns(patterns.iter().map(|(p, v)| (p.to_string(), *v)).collect());
        s
    };
    for (bad, shown) in [(-0.5f32, "-0.5"), (f32::NAN, "NaN")] {
        let e = spec(&[("w*", 0.02), ("wq", bad)]).build(2).unwrap_err();
        assert_eq!(
            e.message(),
            format!("es.sigma_leaves.\"wq\" = {shown} is not a finite number > 0")
        );
        assert!(e.fix().unwrap().contains("es.sigma_leaves.\"wq\""), "{e}");
    }
    let e = spec(&[("w[", 0.02)]).build(2).unwrap_err();
    assert!(
        e.message()
            .starts_with("es.sigma_leaves: \"w[\" is not a glob pattern"),
        "{e}"
    );
    // A pattern that matches no leaf names the leaves.
    let es = spec(&[("w*", 0.02), ("layers.*.wq", 0.03)])
        .build(2)
        .unwrap();
    let (m, _) = program_error(&es);
    assert_eq!(
        m,
        format!(
            "es.sigma_leaves: pattern \"layers.*.wq\" matches no leaf; the leaves are: {PATHS}"
        )
    );
    // First match wins, in the given order; unmatched leaves take es.sigma.
    let (_, leaves) = block();
    let es = spec(&[("wq", 0.5), ("w?", 0.25), ("w_*", 0.125)])
        .build(2)
        .unwrap();
    let got = es.leaf_scales(&leaves).unwrap();
    let want =
        [0.125, 0.125, 0.25, 0.25, 0.5, 0.25].map(|x| LeafScale::Sigma(LeafSigma::Scalar(x)));
    assert_eq!(got, want);
    let es = spec(&[("w?", 0.25), ("wq", 0.5)]).build(2).unwrap();
    let got = es.leaf_scales(&leaves).unwrap();
    let want = [0.01, 0.01, 0.25, 0.25, 0.25, 0.25].map(|x| LeafScale::Sigma(LeafSigma::Scalar(x)));
    assert_eq!(got, want);
}

#[test]
fn freeze_patterns_must_match_and_leave_something_to_train() {
    let mut s = EsSpec::new(16, 0.01, 0.01);
    s.freeze = vec!["wq".into(), "*.norm.weight".into()];
    let (m, fix) = program_error(&s.build(2).unwrap());
    assert_eq!(
        m,
        format!("es.freeze: pattern \"*.norm.weight\" matches no leaf; the leaves are: {PATHS}")
    );
    assert!(fix.contains("`*` matches any characters"), "{fix}");
    s.freeze = vec!["w*".into()];
    let (m, _) = program_error(&s.build(2).unwrap());
    assert_eq!(m, "es.freeze freezes every leaf: nothing would be trained");
    let (m, _) = program_error(&lib().with_freeze(&["wk", "nope"]).unwrap());
    assert!(
        m.starts_with("freeze: pattern \"nope\" matches no leaf"),
        "{m}"
    );
    // What resolves: the frozen leaves, everything else at the scalar σ.
    let (_, leaves) = block();
    let got = lib()
        .with_freeze(&["w_*", "wk"])
        .unwrap()
        .leaf_scales(&leaves)
        .unwrap();
    let s = LeafScale::Sigma(LeafSigma::Scalar(0.01));
    assert_eq!(
        got,
        [
            LeafScale::Frozen,
            LeafScale::Frozen,
            LeafScale::Frozen,
            s.clone(),
            s.clone(),
            s
        ]
    );
}

#[test]
fn separable_sigma_must_fit_a_2d_leaf() {
    let one = |path: &str, m: usize, k: usize| {
        BTreeMap::from([(path.to_string(), (vec![0.1f32; m], vec![0.2f32; k]))])
    };
    let (m, fix) = program_error(&lib().with_sigma_separable(one("wq", 64, 63)).unwrap());
    assert_eq!(
        m,
        "sigma_separable: leaf \"wq\" is (64, 64) but p has 64 entries and q 63"
    );
    assert_eq!(
        fix,
        "give \"wq\" p of length 64 (rows) and q of length 64 (columns)"
    );
    let (m, _) = program_error(&lib().with_sigma_separable(one("wz", 64, 64)).unwrap());
    assert!(
        m.starts_with("sigma_separable: \"wz\" names no leaf; the leaves are: w_down"),
        "{m}"
    );
    let e = lib()
        .with_sigma_separable(BTreeMap::from([(
            "wq".to_string(),
            (vec![0.1f32, 0.0], vec![0.2f32; 64]),
        )]))
        .unwrap_err();
    assert_eq!(
        e.message(),
        "sigma_separable[\"wq\"]: p[1] = 0 is not a finite number > 0"
    );
    // A (5, 3) leaf: p per row, q per column; a 1-D leaf takes no separable σ.
    let leaf = |index: usize, path: &str, shape: &[i64]| LeafInfo {
        index,
        path: path.into(),
        shape: shape.to_vec(),
    };
    let leaves = [leaf(0, "b", &[5]), leaf(1, "w", &[5, 3])];
    // The scales of `leaves` with the separable σ of leaf `name` (p of `rows`, q of `cols`).
    let scales = |name: &str, rows: usize, cols: usize| {
        let es = lib().with_sigma_separable(one(name, rows, cols)).unwrap();
        es.leaf_scales(&leaves)
    };
    assert_eq!(
        scales("w", 5, 3).unwrap(),
        [
            LeafScale::Sigma(LeafSigma::Scalar(0.01)),
            LeafScale::Sigma(LeafSigma::Separable {
                p: vec![0.1; 5],
                q: vec![0.2; 3]
            })
        ]
    );
    let e = scales("w", 3, 5).unwrap_err();
    assert_eq!(
        e.message(),
        "sigma_separable: leaf \"w\" is (5, 3) but p has 3 entries and q 5"
    );
    let e = scales("b", 5, 1).unwrap_err();
    assert_eq!(
        e.message(),
        "sigma_separable: leaf \"b\" has shape [5]; separable σ is for 2-D leaves"
    );
    // Its products underflowing f32 is refused before any program.
    let tiny = BTreeMap::from([("wq".to_string(), (vec![1e-20f32; 64], vec![1e-20f32; 64]))]);
    assert!(message(lib().with_sigma_separable(tiny)).contains("too small for float32"));
}

#[test]
fn sigma_patterns_keep_their_order_through_serde() {
    let s: EsSpec = serde_json::from_str(
        r#"{"n": 8, "sigma": 0.1, "lr": 0.1, "sigma_leaves": {"z*": 0.5, "a": 0.25},
            "freeze": ["wq"]}"#,
    )
    .unwrap();
    assert_eq!(
        s.sigma_leaves.0,
        vec![("z*".to_string(), 0.5), ("a".to_string(), 0.25)]
    );
    assert_eq!(
        serde_json::to_string(&s).unwrap(),
        r#"{"strategy":"mirrored(lowrank(r=1))","n":8,"sigma":0.1,"lr":0.1,"shaping":"centered_ranks","how":"B","freeze":["wq"],"sigma_leaves":{"z*":0.5,"a":0.25}}"#
    );
    let e = serde_json::from_str::<EsSpec>(
        r#"{"n": 8, "sigma": 0.1, "lr": 0.1, "sigma_leaves": {"a": 0.5, "a": 0.25}}"#,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("pattern \"a\" is given twice"),
        "{e}"
    );
}
