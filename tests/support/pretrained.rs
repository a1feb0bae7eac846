//! Running a one-device model program on a parameter tree, for the tests that hold a
//! pretrained model's logits and greedy tokens against `transformers`.

use shardes::hlo::builder::Module;
use shardes::hlo::params::ParamTree;
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
