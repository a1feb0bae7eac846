//! Does the weight layout of a decode step's small-M dot matter on XLA:CPU? (issue #37)
//!
//! Runs a 30-layer loop of `x [M, 576] · W_l` with the layer's matrix cut out of a stacked
//! `[30, …]` argument by `dynamic_slice`, as the looped decode step does, three ways:
//! `nt`, `W` stored `(out, in)` and contracted on its last axis (the decoder's layout
//! today); `nn`, `W` stored `(in, out)`; `tr`, `(out, in)` transposed once per call before
//! the loop, then `nn`. Prints the best of `REPS` (default 5) calls each, alternating.
//!
//!     cargo run --release -p shardes-runtime --example dot_layout
use shardes_runtime::{Client, CompileOptions};
use std::time::Instant;

fn program(m: usize, n: usize, k: usize, l: usize, variant: &str) -> String {
    // variant: nt (W [L,N,K], contract 1x1), nn (W [L,K,N], contract 1x0), tr (W [L,N,K] transposed once, then nn)
    let (wshape, sl, wl, dims) = match variant {
        "nt" => (
            format!("{l}x{n}x{k}"),
            format!("1x{n}x{k}"),
            format!("{n}x{k}"),
            "[1] x [1]",
        ),
        _ => (
            format!("{l}x{k}x{n}"),
            format!("1x{k}x{n}"),
            format!("{k}x{n}"),
            "[1] x [0]",
        ),
    };
    let input_w = if variant == "tr" {
        format!("{l}x{n}x{k}")
    } else {
        wshape.clone()
    };
    let pre = if variant == "tr" {
        format!("    %w = stablehlo.transpose %w0, dims = [0, 2, 1] : (tensor<{input_w}xf32>) -> tensor<{wshape}xf32>\n")
    } else {
        // No op: the loop reads the argument itself.
        format!("    %w = stablehlo.reshape %w0 : (tensor<{wshape}xf32>) -> tensor<{wshape}xf32>\n")
    };
    let sizes = if variant == "nt" {
        format!("[1, {n}, {k}]")
    } else {
        format!("[1, {k}, {n}]")
    };
    format!(
        r#"module @probe attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{m}x{k}xf32>, %w0: tensor<{input_w}xf32>) -> (tensor<{m}x{k}xf32>) {{
{pre}    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = "stablehlo.while"(%c0, %x) ({{
    ^bb0(%i: tensor<i32>, %h: tensor<{m}x{k}xf32>):
      %nl = stablehlo.constant dense<{l}> : tensor<i32>
      %p = stablehlo.compare LT, %i, %nl, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    }}, {{
    ^bb0(%i: tensor<i32>, %h: tensor<{m}x{k}xf32>):
      %z = stablehlo.constant dense<0> : tensor<i32>
      %s = stablehlo.dynamic_slice %w, %i, %z, %z, sizes = {sizes} : (tensor<{wshape}xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<{sl}xf32>
      %wl = stablehlo.reshape %s : (tensor<{sl}xf32>) -> tensor<{wl}xf32>
      %y = stablehlo.dot_general %h, %wl, contracting_dims = {dims} : (tensor<{m}x{k}xf32>, tensor<{wl}xf32>) -> tensor<{m}x{n}xf32>
      %y2 = stablehlo.slice %y [0:{m}, 0:{k}] : (tensor<{m}x{n}xf32>) -> tensor<{m}x{k}xf32>
      %t = stablehlo.tanh %y2 : tensor<{m}x{k}xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i2 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i2, %t : tensor<i32>, tensor<{m}x{k}xf32>
    }}) : (tensor<i32>, tensor<{m}x{k}xf32>) -> (tensor<i32>, tensor<{m}x{k}xf32>)
    return %r#1 : tensor<{m}x{k}xf32>
  }}
}}
"#
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::cpu(1)?;
    let (k, l) = (576usize, 30usize);
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    for &n in &[1536usize] {
        for &m in &[64usize, 256] {
            let mut exes = Vec::new();
            for v in ["nt", "nn", "tr"] {
                let exe = client.compile(&program(m, n, k, l, v), &CompileOptions::new(1))?;
                let x: Vec<f32> = (0..m * k).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect();
                let w: Vec<f32> = (0..l * n * k)
                    .map(|i| ((i % 17) as f32 - 8.0) * 0.005)
                    .collect();
                let xb = client.buffer_from_host(&x, &[m, k], 0)?;
                // The same matrices every way: `nn` gets them transposed on the host.
                let (w, dims) = if v == "nn" {
                    (transposed(&w, l, n, k), [l, k, n])
                } else {
                    (w, [l, n, k])
                };
                let wb = client.buffer_from_host(&w, &dims, 0)?;
                exes.push((v, exe, xb, wb));
            }
            let mut best = vec![f64::MAX; exes.len()];
            for _ in 0..reps {
                for (j, (_, exe, xb, wb)) in exes.iter().enumerate() {
                    let t = Instant::now();
                    let out = exe.execute(&[vec![xb, wb]])?;
                    let _ = out[0][0].to_host::<f32>()?;
                    best[j] = best[j].min(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            let mut outputs = Vec::new();
            for (_, exe, xb, wb) in &exes {
                outputs.push(exe.execute(&[vec![xb, wb]])?[0][0].to_host::<f32>()?);
            }
            let bits = |o: &Vec<f32>| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let same: Vec<bool> = outputs
                .iter()
                .map(|o| bits(o) == bits(&outputs[0]))
                .collect();
            println!("m {m}: outputs bit-identical to nt's (nt, nn, tr): {same:?}");
            let flop = 2.0 * (m * n * k * l) as f64;
            for (j, (v, ..)) in exes.iter().enumerate() {
                println!(
                    "m {m} n {n} k {k} L {l} {v}: {:.2} ms, {:.1} GFLOP/s",
                    best[j],
                    flop / best[j] / 1e6
                );
            }
        }
    }
    Ok(())
}

/// `w` (`[l, n, k]`, row-major) as `[l, k, n]`.
fn transposed(w: &[f32], l: usize, n: usize, k: usize) -> Vec<f32> {
    let mut t = vec![0.0; w.len()];
    for layer in 0..l {
        for i in 0..n {
            for j in 0..k {
                t[layer * n * k + j * n + i] = w[layer * n * k + i * k + j];
            }
        }
    }
    t
}
