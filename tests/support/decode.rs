//! Oracles for the decoding tests: a member's parameters with its perturbation
//! materialized on the host (`θ + s σ εᵢ` through the host PRNG), greedy decoding of one
//! parameter tree by the one-device `Qwen2::greedy_program`, and the smallest top-1/top-2
//! logit gap along a decoded sequence (from `Qwen2::logits_program`).

use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::Key;
use shardes::hlo::problems::qwen2::{Qwen2, Qwen2Config};
use shardes::runtime::{Buffer, Client, CompileOptions, Executable};

use super::es::{Es, LeafNoise};

/// Member `i`'s parameters with its perturbation materialized: `θ + s σ E`, `E` the dense
/// noise or `A Bᵀ / √r`.
pub fn member_params(e: &Es, tree: &ParamTree, base: Key, i: usize) -> ParamTree {
    let (id, s) = e.member(i);
    let leaves = tree
        .leaves()
        .into_iter()
        .enumerate()
        .map(|(j, (_, a))| {
            let eps: Vec<f32> = match e.leaf_noise(base, j, a.shape(), id) {
                LeafNoise::Full(eps) => eps,
                LeafNoise::LowRank { a, b, m, k, r } => {
                    let mut out = vec![0.0f32; m * k];
                    for row in 0..m {
                        for col in 0..k {
                            let dot: f32 = (0..r).map(|q| a[row * r + q] * b[col * r + q]).sum();
                            out[row * k + col] = dot / (r as f32).sqrt();
                        }
                    }
                    out
                }
            };
            let data = a
                .data()
                .iter()
                .zip(&eps)
                .map(|(t, x)| t + s * e.sigma * x)
                .collect();
            Array::new(a.shape().to_vec(), data).unwrap()
        })
        .collect();
    ParamTree::from_leaves(tree, leaves).unwrap()
}

/// Runs one-device programs whose arguments are a tree's leaves and one i32 array.
pub struct OneDevice {
    client: Client,
    exe: Executable,
}

impl OneDevice {
    /// Compiles `mlir` on a one-device client.
    pub fn new(client: &Client, mlir: &str) -> OneDevice {
        let exe = client.compile(mlir, &CompileOptions::new(1)).unwrap();
        OneDevice {
            client: client.clone(),
            exe,
        }
    }

    /// The first result of the program on `tree` and `ids` (shape `dims`).
    pub fn run(&self, tree: &ParamTree, ids: &[i32], dims: &[usize]) -> Buffer {
        let c = &self.client;
        let mut args: Vec<Buffer> = tree
            .leaves()
            .into_iter()
            .map(|(_, a)| c.buffer_from_host(a.data(), a.shape(), 0).unwrap())
            .collect();
        args.push(c.buffer_from_host(ids, dims, 0).unwrap());
        let refs: Vec<&Buffer> = args.iter().collect();
        self.exe.execute(&[refs]).unwrap().remove(0).remove(0)
    }
}

/// Greedy decoding of `b` prompts of length `p` (row-major) through `tree`: `t` tokens
/// per row, and the smallest top-1/top-2 gap of the logits that chose them.
pub struct Greedy {
    greedy: OneDevice,
    logits: OneDevice,
    cfg: Qwen2Config,
    b: usize,
    p: usize,
    t: usize,
}

impl Greedy {
    /// Both programs for `b × p` prompts and `t` new tokens (`tree` gives the shapes).
    pub fn new(
        client: &Client,
        cfg: &Qwen2Config,
        tree: &ParamTree,
        b: usize,
        p: usize,
        t: usize,
    ) -> Greedy {
        let g = Qwen2::new(cfg.clone(), b, p)
            .greedy_program(tree, p, t)
            .unwrap();
        let l = Qwen2::new(cfg.clone(), b, p + t)
            .logits_program(tree)
            .unwrap();
        Greedy {
            greedy: OneDevice::new(client, &g.to_mlir()),
            logits: OneDevice::new(client, &l.to_mlir()),
            cfg: cfg.clone(),
            b,
            p,
            t,
        }
    }

    /// The tokens (`[b, t]` row-major) and the smallest gap.
    pub fn decode(&self, tree: &ParamTree, prompts: &[i32]) -> (Vec<i32>, f32) {
        let (b, p, t) = (self.b, self.p, self.t);
        let tokens: Vec<i32> = self.greedy.run(tree, prompts, &[b, p]).to_host().unwrap();
        let mut seq = Vec::with_capacity(b * (p + t));
        for r in 0..b {
            seq.extend_from_slice(&prompts[r * p..(r + 1) * p]);
            seq.extend_from_slice(&tokens[r * t..(r + 1) * t]);
        }
        let logits: Vec<f32> = self.logits.run(tree, &seq, &[b, p + t]).to_host().unwrap();
        let v = self.cfg.vocab_size;
        let mut gap = f32::INFINITY;
        for r in 0..b {
            for s in p - 1..p + t - 1 {
                let row = &logits[(r * (p + t) + s) * v..(r * (p + t) + s + 1) * v];
                let mut top = [f32::NEG_INFINITY; 2];
                for &x in row {
                    if x > top[0] {
                        top = [x, top[0]];
                    } else if x > top[1] {
                        top[1] = x;
                    }
                }
                gap = gap.min(top[0] - top[1]);
            }
        }
        (tokens, gap)
    }
}
