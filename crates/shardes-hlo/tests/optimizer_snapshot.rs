//! Snapshots of the ES programs per optimizer on a two-leaf linear model. The `sgd_*`
//! snapshots were recorded before optimizers existed: `es.optimizer = "sgd"` (the default)
//! must keep emitting exactly those programs, with no extra arguments or results. The
//! others show what each optimizer adds (its state arguments, results and update ops).

use shardes_hlo::builder::{TensorType, Value};
use shardes_hlo::es::{leaf_infos, EsError, EsSpec, LeafInfo, Model, ModelParams, Program};
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

#[test]
fn sgd_generation() {
    let es = sgd().build(2).unwrap();
    insta::assert_snapshot!(text(es.generation_program(&Linear, &leaves())));
}

#[test]
fn sgd_generation_multi() {
    let es = sgd().build(2).unwrap();
    insta::assert_snapshot!(text(es.generation_program_multi(&Linear, &leaves(), 3)));
}

#[test]
fn sgd_tell() {
    let es = sgd().build(2).unwrap();
    insta::assert_snapshot!(text(es.tell_program(&Linear, &leaves())));
}

#[test]
fn sgd_noop() {
    let es = sgd().build(2).unwrap();
    insta::assert_snapshot!(text(es.noop_program(&Linear, &leaves())));
}
