//! Running a one-device model program on a parameter tree, for the tests that hold a
//! pretrained model's logits and greedy tokens against `transformers`.

use shardes::hlo::builder::Module;
use shardes::hlo::params::ParamTree;
use shardes::hlo::problems::qwen2::{Qwen2, Qwen2Config};
use shardes::runtime::{Buffer, Client, CompileOptions};

/// Compiles `m` for one device and runs it on `tree`'s leaves (in the tree's order) and
/// one i32 input of `shape`; its first output.
pub fn run_one(c: &Client, m: &Module, tree: &ParamTree, input: &[i32], shape: &[usize]) -> Buffer {
    let exe = c
        .compile(&m.to_mlir(), &CompileOptions::new(1))
        .unwrap_or_else(|e| panic!("compile failed: {e}"));
    let mut args: Vec<Buffer> = tree
        .leaves()
        .into_iter()
        .map(|(_, a)| c.buffer_from_host(a.data(), a.shape(), 0).expect("upload"))
        .collect();
    args.push(c.buffer_from_host(input, shape, 0).expect("input"));
    let refs: Vec<&Buffer> = args.iter().collect();
    exe.execute(&[refs]).expect("execute").remove(0).remove(0)
}

/// The largest absolute difference between the f32 logits `[b, s, V]` of `config` on
/// `tree` for the token ids `ids` (`b` rows of `s`) and the reference `want` (flat, the
/// same layout); the shapes are asserted equal.
pub fn logits_error(
    config: &shardes::hlo::problems::qwen2::Qwen2Config,
    tree: &ParamTree,
    ids: &[Vec<i32>],
    want: &[f32],
) -> f32 {
    let (b, s) = (ids.len(), ids[0].len());
    assert_eq!(
        want.len(),
        b * s * config.vocab_size,
        "reference logits shape"
    );
    let client = Client::cpu(1).expect("cpu client");
    let m = shardes::hlo::problems::qwen2::Qwen2::new(config.clone(), b, s)
        .logits_program(tree)
        .expect("build logits");
    let got = run_one(&client, &m, tree, &ids.concat(), &[b, s])
        .to_host::<f32>()
        .expect("logits");
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max)
}

/// The greedy tokens `config` on `tree` decodes after the token ids `prompt`, `max_new` of
/// them.
pub fn greedy_tokens(
    client: &Client,
    config: &Qwen2Config,
    tree: &ParamTree,
    prompt: &[u32],
    max_new: usize,
) -> Vec<i32> {
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let m = Qwen2::new(config.clone(), 1, ids.len())
        .greedy_program(tree, ids.len(), max_new)
        .expect("build greedy");
    run_one(client, &m, tree, &ids, &[1, ids.len()])
        .to_host::<i32>()
        .expect("tokens")
}
