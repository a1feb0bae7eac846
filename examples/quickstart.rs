//! The quickstart through the library: one transformer block (d_model 64) trained by
//! mirrored low-rank ES (r = 1, n = 256, sigma = lr = 0.01, the [`EsSpec`] defaults for the
//! rest) on 8 simulated CPU devices for 30 generations. Prints the population's mean loss
//! per generation.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! `shardes run examples/quickstart.toml` runs the same thing with progress, metrics and
//! checkpoints. `tests/suite/quickstart_example.rs` includes this file and checks that the loss
//! falls.

use shardes::hlo::es::EsSpec;
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::{runtime::Client, Problem, Trainer};

/// Runs the quickstart for `generations` generations on 8 simulated CPU devices and returns
/// each generation's mean loss over the population.
pub fn quickstart(generations: usize) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    // key = key(0); params = init(key); batch = make_batch(fold_in(key, 1)).
    let problem = Problem::transformer_block(TransformerBlock::QUICKSTART, 0)?;
    // The member chunk is sized from the model's activation bytes, as `shardes run` does.
    let es = EsSpec::new(256, 0.01, 0.01).build(8)?;
    let mut trainer = Trainer::new(&Client::cpu(8)?, &es, &problem)?;
    let mut means = Vec::with_capacity(generations);
    for _ in 0..generations {
        let f = trainer.step()?;
        means.push(f.iter().map(|&x| f64::from(x)).sum::<f64>() / f.len() as f64);
    }
    Ok(means)
}

// The test that includes this file calls `quickstart` only.
#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("mean loss per generation: {:?}", quickstart(30)?);
    Ok(())
}
