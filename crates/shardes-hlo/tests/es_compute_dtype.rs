//! The ES's compute dtype as the emitter sees it (no plugin): a Qwen2 built for f32 under a
//! bf16 ES emits exactly the programs of a Qwen2 built for bf16 (the ES's dtype is the
//! forward's), for its loss and its decoding; the noise rounding is the ES's, so a bf16
//! Qwen2 under an f32 ES emits another program; and a bf16 loss is still refused.

use shardes_hlo::builder::{DType, TensorType, Value};
use shardes_hlo::decode::{DecodeShape, DecodeSpec};
use shardes_hlo::es::{leaf_infos, EsError, EsSpec, Model, ModelParams, Program, ShardedES};
use shardes_hlo::nn::{self, Act};
use shardes_hlo::prng::key;
use shardes_hlo::problems::qwen2::{Qwen2, Qwen2Config};

fn es(dtype: DType) -> ShardedES {
    EsSpec::new(8, 0.01, 0.01)
        .build(2)
        .unwrap()
        .with_member_chunk(Some(2))
        .with_compute_dtype(dtype)
        .unwrap()
}

#[test]
fn a_bf16_es_runs_an_f32_qwen2_as_a_bf16_one() {
    let config = Qwen2Config::tiny();
    let leaves = leaf_infos(&config.init(key(0).unwrap(), 0.02).unwrap());
    let f32_model = Qwen2::new(config.clone(), 2, 5);
    let bf16_model = f32_model.clone().with_compute_dtype(DType::BF16);
    let loss =
        |es: &ShardedES, m: &Qwen2| es.generation_program(m, &leaves).unwrap().module.to_mlir();
    let ruled = loss(&es(DType::BF16), &f32_model);
    assert_eq!(ruled, loss(&es(DType::BF16), &bf16_model));
    assert!(ruled.contains("xbf16>"));
    // The model's own bf16 under an f32 ES: its forward converts, the noise is not rounded.
    assert_ne!(ruled, loss(&es(DType::F32), &bf16_model));
    assert_ne!(ruled, loss(&es(DType::F32), &f32_model));

    let shape = DecodeShape {
        batch: 2,
        prompt_len: 3,
        max_new: 2,
    };
    let decode = |es: &ShardedES, m: &Qwen2| {
        let spec = DecodeSpec::new(m.clone(), shape, vec![], 0).unwrap();
        es.outputs_program(&spec, &leaves).unwrap().module.to_mlir()
    };
    assert_eq!(
        decode(&es(DType::BF16), &f32_model),
        decode(&es(DType::BF16), &bf16_model)
    );
}

/// A linear model whose loss stays in the weights' dtype (no f32 operand to promote to).
struct Narrow;

impl Model for Narrow {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        vec![("x".into(), TensorType::f32(&[2, 3]))]
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let x = Act::shared(batch[0].clone()).convert(p.compute_dtype())?;
        Ok(nn::dense(&x, &p.weight("w")?)?.mean_all()?)
    }
}

#[test]
fn the_fitness_stays_f32_under_bf16() {
    let leaves = vec![shardes_hlo::es::LeafInfo {
        index: 0,
        path: "w".into(),
        shape: vec![5, 3],
    }];
    assert!(es(DType::F32).generation_program(&Narrow, &leaves).is_ok());
    let err = match es(DType::BF16).generation_program(&Narrow, &leaves) {
        Ok(_) => panic!("a bf16 loss must be refused"),
        Err(e) => e,
    };
    assert!(matches!(err, EsError::NarrowFitness { .. }), "{err}");
    assert!(err.to_string().contains("bf16"), "{err}");
}

#[test]
fn every_example_model_emits_a_bf16_forward() {
    use shardes_hlo::problems::control::{host::PolicyStep, Control, Env};
    use shardes_hlo::problems::quadratic::Quadratic;
    use shardes_hlo::problems::transformer_block::TransformerBlock;
    let es = es(DType::BF16);
    let check = |name: &str, program: Result<Program, EsError>| {
        let text = program.unwrap().module.to_mlir();
        assert!(text.contains("xbf16>"), "{name}: no bf16 value");
        assert!(text.contains("dot_general"), "{name}: no contraction");
    };
    let tb = TransformerBlock {
        d_model: 8,
        batch: 2,
        seq: 4,
    };
    let leaves = leaf_infos(&tb.init(key(0).unwrap()).unwrap());
    check("transformer_block", es.generation_program(&tb, &leaves));
    let control = Control::new(Env::Pendulum, 2, 5, &[4]).unwrap();
    let leaves = leaf_infos(&control.init(key(0).unwrap()).unwrap());
    check("control", es.generation_program(&control, &leaves));
    // The host-simulated policy's actions stay the declared f32.
    let step = PolicyStep::new(&control.widths(), 8, 2).unwrap();
    check("policy step", es.outputs_program(&step, &leaves));
    let quad = Quadratic::new(4, 3, 10.0).unwrap();
    let leaves = leaf_infos(&quad.init().unwrap());
    check("quadratic", es.generation_program(&quad, &leaves));
}
