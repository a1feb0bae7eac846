//! The device-side ES the tests build and the shapes they look for in its programs.

use shardes::hlo::builder::Module;
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{ShardedES, StrategySpec};
use shardes::hlo::params::ParamTree;
use shardes::runtime::HloModule;

/// The ES of the strategy spelled `strategy` (as in a config, e.g.
/// `"mirrored(lowrank(r=1))"`) with `n` members, noise `sigma` and learning rate `lr` on
/// `devices` devices; the tests chain the rest (chunk, shaping, optimizer) onto it.
pub fn es(strategy: &str, n: usize, sigma: f32, lr: f32, devices: usize) -> ShardedES {
    let spec: StrategySpec = strategy
        .parse()
        .unwrap_or_else(|e| panic!("strategy {strategy:?}: {e}"));
    ShardedES::new(from_spec(&spec), n, sigma, lr, devices)
        .unwrap_or_else(|e| panic!("ES of {strategy:?}: {e}"))
}

/// The 2-D leaves' shapes `(out, in)`.
pub fn matrices(params: &ParamTree) -> Vec<[i64; 2]> {
    params
        .leaves()
        .into_iter()
        .filter(|(_, a)| a.ndim() == 2)
        .map(|(_, a)| [a.shape()[0] as i64, a.shape()[1] as i64])
        .collect()
}

/// The weight matrix `(out, in)` that `shape` holds per member as `(chunk, out, in)`, if
/// any. Batch geometries in these tests avoid `b·s` coinciding with a matrix dimension, so
/// an activation `(chunk, b·s, d)` cannot be mistaken for one.
pub fn member_matrix(shape: &[i64], chunk: i64, mats: &[[i64; 2]]) -> Option<[i64; 2]> {
    shape.windows(3).find_map(|w| {
        mats.iter()
            .find(|[o, i]| w[0] == chunk && w[1] == *o && w[2] == *i)
            .copied()
    })
}

/// Whether some value `module` emits holds one of `mats` per member of a `chunk`: what the
/// tests' detector must find in a dense-noise program, so that its silence on low-rank
/// programs means something.
pub fn emits_member_matrix(module: &Module, chunk: i64, mats: &[[i64; 2]]) -> bool {
    module
        .value_types()
        .iter()
        .any(|t| member_matrix(&t.shape, chunk, mats).is_some())
}

/// The dims of every shape in the optimized `hlo`, a tuple's elements after the tuple: what
/// the compiler actually allocates, for the tests that look for per-member matrices the
/// emitted program did not have but a fusion might.
pub fn optimized_shapes(hlo: &HloModule) -> Vec<Vec<i64>> {
    let mut stack: Vec<shardes::runtime::HloShape> = hlo
        .computations
        .iter()
        .flat_map(|c| c.instructions.iter().map(|i| i.shape.clone()))
        .collect();
    let mut shapes = Vec::new();
    while let Some(sh) = stack.pop() {
        shapes.push(sh.dims.iter().map(|&d| d as i64).collect());
        stack.extend(sh.tuple);
    }
    shapes
}
