//! The outputs program of a decoder whose layers are a loop (`Layers::Loop`) draws the
//! layers' noise once per member chunk in a loop over the layer index of its own, and the
//! decoder's layer loop reads its layer's rows (low-rank strategies): against the same
//! decoder with its layers' noise drawn leaf by leaf (`PerLeaf`, which hides
//! `MemberOutputs::layers`: the program the outputs program emitted for every strategy
//! before), and in op count against its own depth.
//!
//! Tolerances: none. Each member's noise is the same values through the same ops, so the
//! prefill logits are equal bit for bit and the decoded tokens equal; the tell after a
//! decode, from a fitness computed from the tokens on the host, updates the parameters bit
//! for bit as the per-leaf runner's does (both tell programs regenerate the noise). The
//! emitted op count of the decode program grows by a layer's noise rows cut from the
//! chunk's stacks and its branches of the `case`s that hand the loop its rows (two ops per
//! noise value), far fewer than its leaves' draws.

use shardes::hlo::builder::{TensorType, Value};
use shardes::hlo::decode::{DecodeShape, DecodeSpec, Decoder};
use shardes::hlo::es::{
    leaf_infos, ChunkPolicy, EsError, LayerLeaves, MemberInfo, MemberOutputs, ModelParams,
    ShardedES,
};
use shardes::hlo::nn::Act;
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::{fold_in, key};
use shardes::hlo::problems::qwen2::{Layers, Qwen2, Qwen2Config};
use shardes::runtime::Client;
use shardes::{HostArray, OutputsRunner};

const N: usize = 8;
const B: usize = 2;
const P: usize = 5;
const T: usize = 6;

/// `inner` with its layers hidden: every leaf's noise drawn on its own, once per chunk,
/// and the decoder's loop handed the layers by a `case` over the per-leaf values.
struct PerLeaf<'a>(&'a dyn MemberOutputs);

impl MemberOutputs for PerLeaf<'_> {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        self.0.input_types()
    }

    fn output_types(&self) -> Vec<(String, TensorType)> {
        self.0.output_types()
    }

    fn outputs(
        &self,
        params: &ModelParams,
        inputs: &[Value],
        member: &MemberInfo,
    ) -> Result<Vec<Act>, EsError> {
        self.0.outputs(params, inputs, member)
    }

    fn member_bytes(&self) -> Option<usize> {
        self.0.member_bytes()
    }

    fn chunk_policy(&self) -> ChunkPolicy {
        self.0.chunk_policy()
    }
}

/// The prefill's last-position logits per member (f32 `[B, V]`): the bits of a decode's
/// first step, where tokens would hide a last-place difference.
struct Prefill(Qwen2);

impl MemberOutputs for Prefill {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        vec![
            ("ids".into(), TensorType::i32(&[B as i64, P as i64])),
            ("lens".into(), TensorType::i32(&[B as i64])),
        ]
    }

    fn output_types(&self) -> Vec<(String, TensorType)> {
        let v = self.0.config.vocab_size as i64;
        vec![("logits".into(), TensorType::f32(&[B as i64, v]))]
    }

    fn outputs(
        &self,
        params: &ModelParams,
        inputs: &[Value],
        _: &MemberInfo,
    ) -> Result<Vec<Act>, EsError> {
        let (logits, _) = self.0.prefill(params, &inputs[0], &inputs[1], P as i64)?;
        Ok(vec![logits])
    }

    fn layers(&self) -> Option<LayerLeaves> {
        Decoder::layers(&self.0)
    }
}

fn es(strategy: &str, devices: usize) -> ShardedES {
    crate::support::sharded::es(strategy, N, 0.05, 0.01, devices)
}

/// The tiny preset with `layers` layers, looped, and weights large enough for peaked
/// logits.
fn model(layers: usize) -> (Qwen2, ParamTree) {
    let mut cfg = Qwen2Config::tiny();
    cfg.num_hidden_layers = layers;
    let tree = cfg.init(key(5).unwrap(), 0.25).unwrap();
    (Qwen2::new(cfg, B, P).with_layers(Layers::Loop), tree)
}

fn spec(q: Qwen2, max_new: usize) -> DecodeSpec<Qwen2> {
    DecodeSpec::new(
        q,
        DecodeShape {
            batch: B,
            prompt_len: P,
            max_new,
        },
        Vec::new(),
        0,
    )
    .unwrap()
}

fn inputs(vocab: usize) -> Vec<HostArray> {
    let ids = shardes::hlo::prng::bits(fold_in(key(1).unwrap(), 7), &[B * P])
        .unwrap()
        .iter()
        .map(|b| (b % vocab as u32) as i32)
        .collect();
    vec![
        HostArray::i32(&[B, P], ids),
        HostArray::i32(&[B], vec![P as i32, 3]),
    ]
}

fn bits(x: &HostArray) -> Vec<u32> {
    x.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
#[ignore = "slow tier"]
fn slow_layer_noise_drawn_once_per_chunk_decodes_the_per_leaf_bits() {
    let client = Client::cpu(8).unwrap();
    let k = key(21).unwrap();
    for layers in [2, 6] {
        let (q, tree) = model(layers);
        let xs = inputs(q.config.vocab_size);
        for (strategy, devices) in [("mirrored(lowrank(r=1))", 1), ("lowrank(r=2)", 2)] {
            let what = format!("{layers} layers, {strategy}, {devices} devices");
            let e = es(strategy, devices);
            // The prefill logits, bit for bit.
            let prefill = Prefill(q.clone());
            let run = |m: &dyn MemberOutputs| {
                OutputsRunner::with_state(&client, &e, m, &tree, k, 3)
                    .unwrap()
                    .outputs(&xs)
                    .unwrap()
            };
            let (got, want) = (run(&prefill), run(&PerLeaf(&prefill)));
            assert_eq!(bits(&got[0]), bits(&want[0]), "{what}: prefill logits");
            let v = q.config.vocab_size;
            let first = &got[0].as_f32().unwrap()[..B * v];
            assert!(
                got[0].as_f32().unwrap().chunks(B * v).any(|m| m != first),
                "{what}: every member's logits are the same"
            );
            // The decoded tokens, and the tell after them.
            let decode = spec(q.clone(), T);
            let per_leaf = PerLeaf(&decode);
            let mut new = OutputsRunner::with_state(&client, &e, &decode, &tree, k, 3).unwrap();
            let mut old = OutputsRunner::with_state(&client, &e, &per_leaf, &tree, k, 3).unwrap();
            let tokens = new.outputs(&xs).unwrap();
            assert_eq!(tokens, old.outputs(&xs).unwrap(), "{what}: tokens");
            let t = tokens[0].as_i32().unwrap();
            assert!(
                t.chunks(B * T).any(|m| m != &t[..B * T]),
                "{what}: every member decoded the same tokens"
            );
            // A host fitness from the tokens: the count of even tokens per member.
            let fitness: Vec<f32> = t
                .chunks(B * T)
                .map(|m| m.iter().filter(|&&x| x % 2 == 0).count() as f32)
                .collect();
            crate::support::tell_both(
                &mut new,
                &mut old,
                fitness,
                &format!("{what}: parameters after tell"),
            );
        }
    }
}

/// The emitted ops of the looped tiny model's decode program at `layers` layers, with the
/// layers' noise drawn in a loop (`looped`) or leaf by leaf.
fn decode_ops(layers: usize, strategy: &str, looped: bool) -> usize {
    let (q, tree) = model(layers);
    let leaves = leaf_infos(&tree);
    let decode = spec(q, 2);
    let per_leaf = PerLeaf(&decode);
    let m: &dyn MemberOutputs = if looped { &decode } else { &per_leaf };
    es(strategy, 2)
        .outputs_program(m, &leaves)
        .unwrap()
        .module
        .op_counts()
        .values()
        .sum()
}

#[test]
fn decode_program_op_count_is_flat_in_depth() {
    for strategy in ["mirrored(lowrank(r=1))", "lowrank(r=2)"] {
        let looped: Vec<usize> = [2, 4, 8]
            .iter()
            .map(|&l| decode_ops(l, strategy, true))
            .collect();
        let per_leaf: Vec<usize> = [2, 4]
            .iter()
            .map(|&l| decode_ops(l, strategy, false))
            .collect();
        println!("{strategy}: looped 2/4/8 layers {looped:?}, per leaf 2/4 {per_leaf:?}");
        // What a layer adds: its noise rows cut from the chunk's stacks (a slice and a
        // reshape per noise value, 19 here) and its branches of the `case`s that hand the
        // loop body its rows and 1-D leaves (prefill and step); measured: 62.
        let per_layer = (looped[1] - looped[0]) / 2;
        assert_eq!(looped[2] - looped[1], 4 * per_layer, "{looped:?}");
        assert!(per_layer <= 80, "a layer adds {per_layer} ops: {looped:?}");
        // Drawing each leaf on its own grows by a draw per leaf: the check can fail.
        let per_leaf_layer = (per_leaf[1] - per_leaf[0]) / 2;
        assert!(
            5 * per_layer < per_leaf_layer,
            "a looped layer adds {per_layer} ops, a per-leaf one {per_leaf_layer}"
        );
    }
}
