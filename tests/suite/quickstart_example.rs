//! Runs `examples/quickstart.rs` (included, so this is the example's own code) and checks
//! that the mean loss falls.
//!
//! Oracles: generation 0 must equal the JAX reference's generation 0 (mean of the 256
//! fitness values in `shared/testdata/quickstart_gen0.safetensors`; per-member agreement is
//! 1e-5 relative, so 1e-5 on the mean); after that the loss must fall: generation 10 below
//! generation 0, 20 below 10, 29 below 20, and 29 at least 10% below 0 (the CLI run of the
//! same config goes from 2.521 to 1.856).

#[path = "../../examples/quickstart.rs"]
mod quickstart;

#[test]
fn quickstart_example_loss_falls() {
    let means = quickstart::quickstart(30).expect("the quickstart runs");
    assert_eq!(means.len(), 30);
    let file = shardes::io::SafetensorsFile::open(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/testdata/quickstart_gen0.safetensors"
    ))
    .unwrap();
    let jax = file.f32("fitness").unwrap();
    let jax_mean = jax.data().iter().map(|&f| f64::from(f)).sum::<f64>() / jax.len() as f64;
    let rel = (means[0] - jax_mean).abs() / jax_mean;
    println!(
        "mean loss: 0 {:.5} (JAX {jax_mean:.5}), 10 {:.5}, 20 {:.5}, 29 {:.5}",
        means[0], means[10], means[20], means[29]
    );
    assert!(
        rel <= 1e-5,
        "generation 0 mean {} vs JAX {jax_mean}",
        means[0]
    );
    assert!(means[10] < means[0], "{means:?}");
    assert!(means[20] < means[10], "{means:?}");
    assert!(means[29] < means[20], "{means:?}");
    assert!(means[29] < 0.9 * means[0], "{means:?}");
}
