//! Two clients of one process running collective programs at the same time.
//!
//! XLA:CPU keys a collective's rendezvous on the execution's launch id and its devices,
//! process-wide; with the same id for every execution two clients' all-reduces met in one
//! rendezvous and the process aborted (seen in `lifetime.rs`, 3 of 15 runs). Each
//! execution now gets its own launch id.

mod common;

use shardes_runtime::Buffer;

#[test]
fn two_clients_all_reduce_at_once_without_meeting() {
    let workers: Vec<_> = (0..2)
        .map(|k| {
            std::thread::spawn(move || {
                let (client, exe) = common::compiled(2);
                // Different data per client, so a mixed all-reduce changes the sum.
                let scaled: Vec<f32> = common::input().iter().map(|x| x * (k + 1) as f32).collect();
                let shards = client.scatter_rows(&scaled, &[256, 16]).unwrap();
                let args: Vec<Vec<&Buffer>> = shards.iter().map(|b| vec![b]).collect();
                let first = exe.execute(&args).unwrap()[0][1].to_host::<f32>().unwrap();
                for _ in 0..200 {
                    let outs = exe.execute(&args).unwrap();
                    // Each all-reduce sums this client's own shards only, every time.
                    assert_eq!(outs[0][1].to_host::<f32>().unwrap(), first);
                    assert_eq!(outs[1][1].to_host::<f32>().unwrap(), first);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked");
    }
}
