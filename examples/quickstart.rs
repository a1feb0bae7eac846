//! The quickstart through the library: one transformer block (d_model 64) trained by
//! mirrored low-rank ES (r = 1, n = 256, sigma = lr = 0.01) on 8 simulated CPU devices for
//! 30 generations. Prints the population's mean loss at generations 0, 10, 20 and 29.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! `shardes run examples/quickstart.toml` runs the same thing with progress, metrics and
//! checkpoints. `tests/quickstart_example.rs` includes this file and checks that the loss
//! falls.

use shardes::hlo::es::{
    strategy::{LowRank, Mirrored},
    ShardedES,
};
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::{runtime::Client, Problem, Trainer};

/// Runs the quickstart for `generations` generations on 8 simulated CPU devices and returns
/// each generation's mean loss over the population.
pub fn quickstart(generations: usize) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    // key = key(0); params = init(key); batch = make_batch(fold_in(key, 1)).
    let problem = Problem::transformer_block(TransformerBlock::QUICKSTART, 0)?;
    let strategy = Box::new(Mirrored(Box::new(LowRank { r: 1 })));
    // Member bytes size the member chunks (and so the program) as `shardes run` sizes them.
    let es = ShardedES::new(strategy, 256, 0.01, 0.01, 8)?
        .with_member_bytes(problem.model.member_bytes());
    let mut trainer = Trainer::new(&Client::cpu(8)?, &es, &problem)?;
    let mut means = Vec::with_capacity(generations);
    for _ in 0..generations {
        let fitness = trainer.step()?;
        means.push(fitness.iter().map(|&f| f64::from(f)).sum::<f64>() / fitness.len() as f64);
    }
    Ok(means)
}

// The test that includes this file calls `quickstart` only.
#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let means = quickstart(30)?;
    for step in [0, 10, 20, 29] {
        println!("step {step:>2}: mean loss {:.5}", means[step]);
    }
    Ok(())
}
