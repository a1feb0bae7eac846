//! Snapshots of the ES programs per optimizer on a two-leaf linear model. The `sgd_*`
//! snapshots were recorded before optimizers existed: `es.optimizer = "sgd"` (the default)
//! must keep emitting exactly those programs, with no extra arguments or results. The
//! others show what each optimizer adds (its state arguments, results and update ops).

use shardes_hlo::builder::{TensorType, Value};
use shardes_hlo::es::{
    leaf_infos, EsError, EsSpec, LeafInfo, Model, ModelParams, Program, ShardedES,
};
use shardes_hlo::nn::{self, Act};
use shardes_hlo::params::{Array, ParamTree};

/// `loss = mean((dense(x, w) + b)²)` with `w (3, 2)`, `b [3]` and `x [2, 2]`.
struct Linear;

impl Model for Linear {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        vec![("x".into(), TensorType::f32(&[2, 2]))]
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let x = Act::shared(batch[0].clone());
        let y = nn::dense(&x, &p.weight("w")?)?.add(&p.tensor("b")?)?;
        Ok(y.mul(&y)?.mean_all()?)
    }
}

fn leaves() -> Vec<LeafInfo> {
    let leaf = |shape: &[usize]| {
        let size = shape.iter().product();
        ParamTree::Leaf(Array::new(shape.to_vec(), vec![0.5; size]).unwrap())
    };
    leaf_infos(&ParamTree::map([("b", leaf(&[3])), ("w", leaf(&[3, 2]))]))
}

fn text(p: Result<Program, EsError>) -> String {
    p.unwrap().module.to_mlir()
}

fn sgd() -> EsSpec {
    EsSpec::new(8, 0.05, 0.1)
}

/// The program `make` builds on [`Linear`] with the default optimizer (sgd), as text.
fn sgd_text(make: impl FnOnce(&ShardedES, &[LeafInfo]) -> Result<Program, EsError>) -> String {
    text(make(&sgd().build(2).unwrap(), &leaves()))
}

#[test]
fn sgd_generation() {
    insta::assert_snapshot!(sgd_text(|es, l| es.generation_program(&Linear, l)));
}

#[test]
fn sgd_generation_multi() {
    insta::assert_snapshot!(sgd_text(|es, l| es.generation_program_multi(&Linear, l, 3)));
}

#[test]
fn sgd_tell() {
    insta::assert_snapshot!(sgd_text(|es, l| es.tell_program(&Linear, l)));
}

#[test]
fn sgd_noop() {
    insta::assert_snapshot!(sgd_text(|es, l| es.noop_program(&Linear, l)));
}

/// The signature and the update after `tell`'s contraction (the last manual computation)
/// of `optimizer`'s tell program: what the optimizer adds, without the noise around it.
fn tell_update(optimizer: &str) -> String {
    let mut spec = sgd();
    spec.optimizer = serde_json::from_str(optimizer).unwrap();
    let es = spec.build(2).unwrap();
    let text = text(es.tell_program(&Linear, &leaves()));
    let lines: Vec<&str> = text.lines().collect();
    let sig = lines.iter().find(|l| l.contains("func.func")).unwrap();
    let end = lines
        .iter()
        .rposition(|l| l.starts_with("    } : ("))
        .unwrap();
    let mut out = vec![sig.trim().to_string()];
    out.extend(lines[end + 1..].iter().map(|l| l.to_string()));
    out.join("\n")
}

#[test]
fn momentum_tell() {
    insta::assert_snapshot!(tell_update(r#""momentum""#));
}

#[test]
fn adam_tell_with_weight_decay() {
    insta::assert_snapshot!(tell_update(r#"{"name": "adam", "weight_decay": 0.01}"#));
}

#[test]
fn clipup_tell() {
    insta::assert_snapshot!(tell_update(r#"{"name": "clipup", "max_speed": 0.3}"#));
}

#[test]
fn sgd_written_out_is_the_default_program() {
    let es = |optimizer: &str| {
        let mut spec = sgd();
        spec.optimizer = serde_json::from_str(optimizer).unwrap();
        spec.build(2).unwrap()
    };
    let default = sgd().build(2).unwrap();
    for written in [
        r#""sgd""#,
        r#"{"name": "sgd"}"#,
        r#"{"name": "sgd", "weight_decay": 0}"#,
    ] {
        let es = es(written);
        assert_eq!(
            text(es.generation_program(&Linear, &leaves())),
            text(default.generation_program(&Linear, &leaves())),
            "{written}"
        );
        assert_eq!(
            text(es.tell_program(&Linear, &leaves())),
            text(default.tell_program(&Linear, &leaves())),
            "{written}"
        );
    }
}
