//! Shared helpers for the integration tests (real plugin, no mocks).
#![allow(dead_code)]

use shardes_runtime::{Buffer, Client, ClientOptions, CompileOptions, Executable, Plugin};

/// A CPU client with `devices` devices on the default plugin (discovery + provisioning).
pub fn client(devices: usize) -> Client {
    let plugin =
        Plugin::load_default().expect("a PJRT plugin (see shardes_runtime::plugin::locate)");
    Client::new(
        plugin,
        ClientOptions {
            cpu_device_count: Some(devices),
        },
    )
    .expect("client")
}

/// A client with `devices` devices and [`sharded_program`] compiled for all of them.
pub fn compiled(devices: usize) -> (Client, Executable) {
    let client = client(devices);
    let exe = client
        .compile(&sharded_program(devices), &CompileOptions::new(devices))
        .unwrap();
    (client, exe)
}

/// [`input`] split by rows over `client`'s devices, one shard each.
pub fn input_shards(client: &Client) -> Vec<Buffer> {
    client.scatter_rows(&input(), &[256, 16]).unwrap()
}

/// The sharded test program for `d` partitions: input `[256,16]` f32 sharded over "pop" by
/// rows; outputs `x * 2 + 1` (stays sharded) and the column sums over all 256 rows
/// (replicated, needs a cross-device all-reduce).
pub fn sharded_program(d: usize) -> String {
    format!(
        r#"module @m attributes {{mhlo.num_partitions = {d} : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh = <["pop"={d}]>
  func.func public @main(%arg0: tensor<256x16xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{"pop"}}, {{}}]>}})
      -> (tensor<256x16xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{"pop"}}, {{}}]>}},
          tensor<16xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{}}]>}}) {{
    %two = stablehlo.constant dense<2.000000e+00> : tensor<256x16xf32>
    %one = stablehlo.constant dense<1.000000e+00> : tensor<256x16xf32>
    %0 = stablehlo.multiply %arg0, %two : tensor<256x16xf32>
    %1 = stablehlo.add %0, %one : tensor<256x16xf32>
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.reduce(%arg0 init: %zero) applies stablehlo.add across dimensions = [0]
        : (tensor<256x16xf32>, tensor<f32>) -> tensor<16xf32>
    return %1, %2 : tensor<256x16xf32>, tensor<16xf32>
  }}
}}
"#
    )
}

/// Deterministic, non-trivial test input (values differ per row and column; not symmetric,
/// so a wrong row order or a missing shard changes the result).
pub fn input() -> Vec<f32> {
    (0..256 * 16)
        .map(|i| {
            let (r, c) = (i / 16, i % 16);
            ((r * 31 + c * 7) % 97) as f32 * 0.125 - 3.0 + (c as f32) * 0.01
        })
        .collect()
}

/// Host reference for `sharded_program`, column sums accumulated in f64.
pub fn reference(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let rows = x.iter().map(|v| v * 2.0 + 1.0).collect();
    let mut sums = vec![0f64; 16];
    for (i, v) in x.iter().enumerate() {
        sums[i % 16] += *v as f64;
    }
    (rows, sums.into_iter().map(|s| s as f32).collect())
}

/// Resident set size of this process in bytes (Linux).
pub fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("statm rss field");
    // x86_64 Linux (the platform of the pinned plugin) uses 4 KiB pages.
    pages * 4096
}
