//! A run whose programs come from the compile cache is the same run: the generation program
//! (collectives over 8 devices, donated parameters and optimizer state) loaded from the
//! cache gives the fitness and parameters of a freshly compiled one, bit for bit, for three
//! generations.
//!
//! Tolerances: none (bits).

use crate::support::tiny::{mlp_on_8_devices, Mlp};
use shardes::hlo::es::Optimizer;
use shardes::hlo::prng::key;
use shardes::runtime::{Client, CompileCache};
use shardes::Trainer;

/// Three generations on `client`: every fitness and the final parameters, as bits.
fn three_generations(client: &Client) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let (_, params, batch) = mlp_on_8_devices();
    let es = crate::support::sharded::es("mirrored(lowrank(r=1))", 64, 0.1, 0.5, 8)
        .with_optimizer(Optimizer::adam())
        .unwrap();
    let mut t = Trainer::with_state(
        client,
        &es,
        &Mlp::PLAIN,
        &params,
        key(7).unwrap(),
        &batch,
        0,
    )
    .unwrap();
    let fitness = (0..3)
        .map(|_| t.step().unwrap().iter().map(|x| x.to_bits()).collect())
        .collect();
    let params = t
        .params()
        .unwrap()
        .leaves()
        .into_iter()
        .map(|(_, a)| a.data().iter().map(|x| x.to_bits()).collect())
        .collect();
    (fitness, params)
}

#[test]
fn a_cached_generation_program_runs_the_same_generations() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path());
    let (fresh, _, _) = mlp_on_8_devices();
    let want = three_generations(&fresh.with_compile_cache(None));

    let (client, _, _) = mlp_on_8_devices();
    let client = client.with_compile_cache(Some(cache.clone()));
    assert_eq!(
        three_generations(&client),
        want,
        "cold cache (compiled, saved)"
    );
    let saved = entries(dir.path());
    assert!(!saved.is_empty(), "nothing was saved");

    let (client, _, _) = mlp_on_8_devices();
    let client = client.with_compile_cache(Some(cache));
    assert_eq!(three_generations(&client), want, "warm cache (loaded)");
    // The plugin's bytes differ from one compile to the next, so a recompile would have
    // rewritten an entry.
    assert!(
        entries(dir.path()) == saved,
        "the warm run compiled a program the cold one had saved"
    );
}

/// Every file in `dir` with its bytes, by name.
fn entries(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect()
}
