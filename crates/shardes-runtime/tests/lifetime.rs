//! Drop order and leaks.

mod common;

use shardes_runtime::{Buffer, Executable};

fn cycle(devices: usize) {
    let (client, exe) = common::compiled(devices);
    let shards = common::input_shards(&client);
    let args: Vec<Vec<&Buffer>> = shards.iter().map(|b| vec![b]).collect();
    let outs = exe.execute(&args).unwrap();
    assert_eq!(outs[0][1].dims(), [16]);
    // A 1 MiB buffer per cycle makes a leaked buffer visible in RSS (100 MiB over 100 cycles).
    let big = client
        .buffer_from_host(&vec![1.5f32; 256 * 1024], &[256, 1024], 0)
        .unwrap();
    assert_eq!(big.to_host::<f32>().unwrap()[256 * 1024 - 1], 1.5);
}

#[test]
fn drop_in_any_order() {
    // Every permutation of dropping (client, executable, input, output).
    let orders: [[usize; 4]; 6] = [
        [0, 1, 2, 3],
        [3, 2, 1, 0],
        [1, 0, 3, 2],
        [2, 0, 3, 1],
        [0, 3, 1, 2],
        [1, 3, 0, 2],
    ];
    for order in orders {
        let (client, exe) = common::compiled(2);
        let shards = common::input_shards(&client);
        let args: Vec<Vec<&Buffer>> = shards.iter().map(|b| vec![b]).collect();
        let outs = exe.execute(&args).unwrap();
        let mut client = Some(client);
        let mut exe: Option<Executable> = Some(exe);
        let mut shards = Some(shards);
        let mut outs = Some(outs);
        for what in order {
            match what {
                0 => drop(client.take()),
                1 => drop(exe.take()),
                2 => drop(shards.take()),
                _ => {
                    // Outputs stay readable even after their client and executable are gone.
                    let o = outs.take().unwrap();
                    assert_eq!(o[1][0].to_host::<f32>().unwrap().len(), 128 * 16);
                }
            }
        }
    }
}

/// RSS growth allowed over the measured cycles. Each cycle allocates a 1 MiB device buffer
/// (plus the host copies), a client with its thread pools and an executable, so leaking any
/// of them grows RSS by well over 1 MiB per cycle (>= 100 MiB over 100 cycles); the measured
/// growth without leaks is ~0.1 MiB (allocator noise, XLA's lazily filled caches).
fn leak_check(cycles: usize, bound_mib: f64) {
    for _ in 0..10 {
        cycle(2);
    }
    let before = common::rss_bytes();
    for _ in 0..cycles {
        cycle(2);
    }
    let after = common::rss_bytes();
    let growth = (after as f64 - before as f64) / (1024.0 * 1024.0);
    println!(
        "[measure] {cycles} client/compile/execute/drop cycles: RSS {:.1} MiB -> {:.1} MiB ({growth:+.2} MiB, bound {bound_mib} MiB)",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    assert!(
        growth < bound_mib,
        "RSS grew by {growth:.2} MiB over {cycles} cycles"
    );
}

#[test]
fn leak_loop_100_cycles() {
    leak_check(100, 8.0);
}

#[test]
#[ignore = "slow tier: 1,000 cycles take minutes"]
fn leak_loop_1000_cycles() {
    leak_check(1000, 16.0);
}
