//! How should a looped decode step hand its small-M dots their weights on XLA:CPU? (issue #37)
//!
//! Runs a 30-layer loop of `x [M, 576] · W_l` (`W_l` 1536 × 576), five ways:
//!
//! - `nt`: `W` stored `(out, in)` as one `[30, …]` argument, layer `l` cut out by
//!   `dynamic_slice` and contracted on its last axis (the decoder's layout before the
//!   fourth pass);
//! - `nn`: the same with `W` stored `(in, out)` (the decode program's layout now);
//! - `tr`: `(out, in)` transposed once per call before the loop, then `nn`;
//! - `case`: the 30 matrices `(in, out)` as 30 arguments carried by the loop, the dot of
//!   layer `l` in branch `l` of a `case` on the layer index, so no layer's matrix is copied
//!   out of a stack (what a copy-free loop would have to look like);
//! - `bf16`: `nn` with `x` and `W` in bf16 (the dot accumulating into f32), to see whether
//!   this XLA:CPU has a faster bf16 dot (AMX, AVX-512 BF16) than its f32 one.
//!
//! Prints the best of `REPS` (default 5) calls each, alternating, and whether the f32 ways'
//! outputs are bit-identical to `nt`'s.
//!
//!     cargo run --release -p shardes-runtime --example dot_layout
use half::bf16;
use shardes_runtime::{Buffer, Client, CompileOptions};
use std::time::Instant;

const WAYS: [&str; 5] = ["nt", "nn", "tr", "case", "bf16"];

/// The probe's StableHLO for one way: `m` rows, `k` → `n`, `l` layers.
fn program(m: usize, n: usize, k: usize, l: usize, way: &str) -> String {
    let t = if way == "bf16" { "bf16" } else { "f32" };
    let xt = format!("tensor<{m}x{k}x{t}>");
    let wl = format!("tensor<{k}x{n}x{t}>");
    // `case` carries the 30 matrices through the loop; the other ways carry nothing more.
    let per_layer = |each: &dyn Fn(usize) -> String| -> String {
        if way == "case" {
            (0..l).map(each).collect()
        } else {
            String::new()
        }
    };
    let args = match way {
        "case" => per_layer(&|j| format!(", %w{j}: {wl}")),
        "nt" | "tr" => format!(", %w0: tensor<{l}x{n}x{k}x{t}>"),
        _ => format!(", %w: tensor<{l}x{k}x{n}x{t}>"),
    };
    let carried = per_layer(&|j| format!(", %w{j}"));
    let carried_types = per_layer(&|_| format!(", {wl}"));
    let block_args = per_layer(&|j| format!(", %v{j}: {wl}"));
    let block_vals = per_layer(&|j| format!(", %v{j}"));
    let pre = if way == "tr" {
        format!("    %w = stablehlo.transpose %w0, dims = [0, 2, 1] : (tensor<{l}x{n}x{k}x{t}>) -> tensor<{l}x{k}x{n}x{t}>\n")
    } else {
        String::new()
    };
    let dot = |w: &str, dims: &str, wty: &str| {
        format!("stablehlo.dot_general %h, {w}, contracting_dims = {dims} : ({xt}, {wty}) -> tensor<{m}x{n}xf32>")
    };
    let product = match way {
        "case" => {
            let branches: Vec<String> = (0..l)
                .map(|j| {
                    format!(
                        "{{\n        %d = {}\n        stablehlo.return %d : tensor<{m}x{n}xf32>\n      }}",
                        dot(&format!("%v{j}"), "[1] x [0]", &wl)
                    )
                })
                .collect();
            format!(
                "      %y = \"stablehlo.case\"(%i) ({}) : (tensor<i32>) -> tensor<{m}x{n}xf32>\n",
                branches.join(", ")
            )
        }
        "nt" => format!(
            "      %s = stablehlo.dynamic_slice %w0, %i, %z, %z, sizes = [1, {n}, {k}] : (tensor<{l}x{n}x{k}x{t}>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x{n}x{k}x{t}>
      %wl = stablehlo.reshape %s : (tensor<1x{n}x{k}x{t}>) -> tensor<{n}x{k}x{t}>
      %y = {}\n",
            dot("%wl", "[1] x [1]", &format!("tensor<{n}x{k}x{t}>"))
        ),
        _ => format!(
            "      %s = stablehlo.dynamic_slice %w, %i, %z, %z, sizes = [1, {k}, {n}] : (tensor<{l}x{k}x{n}x{t}>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x{k}x{n}x{t}>
      %wl = stablehlo.reshape %s : (tensor<1x{k}x{n}x{t}>) -> {wl}
      %y = {}\n",
            dot("%wl", "[1] x [0]", &wl)
        ),
    };
    format!(
        r#"module @probe attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: {xt}{args}) -> ({xt}) {{
{pre}    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:{count} = "stablehlo.while"(%c0, %x{carried}) ({{
    ^bb0(%i: tensor<i32>, %h: {xt}{block_args}):
      %nl = stablehlo.constant dense<{l}> : tensor<i32>
      %p = stablehlo.compare LT, %i, %nl, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    }}, {{
    ^bb0(%i: tensor<i32>, %h: {xt}{block_args}):
      %z = stablehlo.constant dense<0> : tensor<i32>
{product}      %y2 = stablehlo.slice %y [0:{m}, 0:{k}] : (tensor<{m}x{n}xf32>) -> tensor<{m}x{k}xf32>
      %th = stablehlo.tanh %y2 : tensor<{m}x{k}xf32>
      %tc = stablehlo.convert %th : (tensor<{m}x{k}xf32>) -> {xt}
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i2 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i2, %tc{block_vals} : tensor<i32>, {xt}{carried_types}
    }}) : (tensor<i32>, {xt}{carried_types}) -> (tensor<i32>, {xt}{carried_types})
    return %r#1 : {xt}
  }}
}}
"#,
        count = 2 + if way == "case" { l } else { 0 },
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::cpu(1)?;
    let (k, l, n) = (576usize, 30usize, 1536usize);
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    for &m in &[64usize, 256] {
        let x: Vec<f32> = (0..m * k).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect();
        // `W` as the decoder stores it, `[l, n, k]`; the other ways get the same matrices.
        let w: Vec<f32> = (0..l * n * k)
            .map(|i| ((i % 17) as f32 - 8.0) * 0.005)
            .collect();
        let w_in_out = transposed(&w, l, n, k);
        let mut ways = Vec::new();
        for way in WAYS {
            let exe = client.compile(&program(m, n, k, l, way), &CompileOptions::new(1))?;
            let args: Vec<Buffer> = match way {
                "nt" | "tr" => vec![
                    client.buffer_from_host(&x, &[m, k], 0)?,
                    client.buffer_from_host(&w, &[l, n, k], 0)?,
                ],
                "nn" => vec![
                    client.buffer_from_host(&x, &[m, k], 0)?,
                    client.buffer_from_host(&w_in_out, &[l, k, n], 0)?,
                ],
                "case" => {
                    let mut v = vec![client.buffer_from_host(&x, &[m, k], 0)?];
                    for layer in w_in_out.chunks(k * n) {
                        v.push(client.buffer_from_host(layer, &[k, n], 0)?);
                    }
                    v
                }
                _ => {
                    let half = |v: &[f32]| v.iter().map(|&a| bf16::from_f32(a)).collect::<Vec<_>>();
                    vec![
                        client.buffer_from_host(&half(&x), &[m, k], 0)?,
                        client.buffer_from_host(&half(&w_in_out), &[l, k, n], 0)?,
                    ]
                }
            };
            ways.push((way, exe, args));
        }
        let mut best = vec![f64::MAX; ways.len()];
        for _ in 0..reps {
            for (j, (_, exe, args)) in ways.iter().enumerate() {
                let refs: Vec<&Buffer> = args.iter().collect();
                let t = Instant::now();
                let out = exe.execute(&[refs])?;
                drop(out);
                best[j] = best[j].min(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let mut bits = Vec::new();
        for (way, exe, args) in &ways {
            if *way == "bf16" {
                continue;
            }
            let refs: Vec<&Buffer> = args.iter().collect();
            let out = exe.execute(&[refs])?[0][0].to_host::<f32>()?;
            bits.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
        let same: Vec<bool> = bits.iter().map(|b| *b == bits[0]).collect();
        println!("m {m}: f32 outputs bit-identical to nt's (nt, nn, tr, case): {same:?}");
        let flop = 2.0 * (m * n * k * l) as f64;
        for (j, (way, ..)) in ways.iter().enumerate() {
            println!(
                "m {m} n {n} k {k} L {l} {way}: {:.2} ms, {:.1} GFLOP/s",
                best[j],
                flop / best[j] / 1e6
            );
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
