//! The compile cache: a program compiled once is loaded the next time, runs to the same bits,
//! and a damaged entry is compiled again and replaced.
//!
//! Tolerances: none; outputs are compared bit for bit.

mod common;

use shardes_runtime::{Buffer, Client, CompileCache, CompileOptions, Executable};

/// `exe`'s outputs on [`common::input`], device by device, as bits.
fn run_bits(client: &Client, exe: &Executable) -> Vec<Vec<Vec<u32>>> {
    let shards = common::input_shards(client);
    let args: Vec<Vec<&Buffer>> = shards.iter().map(|b| vec![b]).collect();
    exe.execute(&args)
        .unwrap()
        .iter()
        .map(|outs| {
            outs.iter()
                .map(|o| {
                    o.to_host::<f32>()
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits())
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// A program like [`common::sharded_program`] whose first output is `x * 3 + 1`, so that it
/// computes something different with the same signature.
fn times_three(d: usize) -> String {
    common::sharded_program(d).replace("dense<2.000000e+00>", "dense<3.000000e+00>")
}

#[test]
fn a_compiled_program_is_saved_and_loaded_to_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path().join("cache"));
    let d = 8;
    let (mlir, opts) = (common::sharded_program(d), CompileOptions::new(d));
    let plain = common::client(d).with_compile_cache(None);
    let want = run_bits(&plain, &plain.compile(&mlir, &opts).unwrap());

    let cached = common::client(d).with_compile_cache(Some(cache.clone()));
    let entry = cache.entry_path(&cached, &mlir, &opts).unwrap();
    assert!(!entry.exists());
    let first = cached.compile(&mlir, &opts).unwrap();
    assert!(entry.exists(), "the compile was not saved");
    assert_eq!(run_bits(&cached, &first), want);

    // A second client loads the entry: proven by putting another program's entry under
    // this program's name, which the load then runs.
    let other = times_three(d);
    cached.compile(&other, &opts).unwrap();
    let other_entry = cache.entry_path(&cached, &other, &opts).unwrap();
    assert_ne!(other_entry, entry);
    let saved = std::fs::read(&entry).unwrap();
    std::fs::copy(&other_entry, &entry).unwrap();
    let again = common::client(d).with_compile_cache(Some(cache.clone()));
    let swapped = run_bits(&again, &again.compile(&mlir, &opts).unwrap());
    let three = run_bits(&plain, &plain.compile(&other, &opts).unwrap());
    assert_eq!(swapped, three, "the second compile did not load the entry");
    std::fs::write(&entry, saved).unwrap();
    assert_eq!(
        run_bits(&again, &again.compile(&mlir, &opts).unwrap()),
        want
    );

    // Memory statistics and the optimized program survive the round trip.
    let loaded = again.compile(&mlir, &opts).unwrap();
    let fresh = plain.compile(&mlir, &opts).unwrap();
    assert_eq!(
        loaded.compiled_memory_stats().unwrap(),
        fresh.compiled_memory_stats().unwrap()
    );
    assert_eq!(
        loaded
            .optimized_hlo()
            .unwrap()
            .entry_computation()
            .unwrap()
            .instructions
            .len(),
        fresh
            .optimized_hlo()
            .unwrap()
            .entry_computation()
            .unwrap()
            .instructions
            .len()
    );
}

#[test]
fn the_key_separates_programs_options_and_device_counts() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path());
    let eight = common::client(8);
    let four = common::client(4);
    let p8 = common::sharded_program(8);
    let p4 = common::sharded_program(4);
    let paths = [
        cache.entry_path(&eight, &p8, &CompileOptions::new(8)),
        cache.entry_path(&eight, &p4, &CompileOptions::new(4)),
        cache.entry_path(&four, &p4, &CompileOptions::new(4)),
        cache.entry_path(&eight, &times_three(8), &CompileOptions::new(8)),
    ]
    .map(|p| p.unwrap());
    for i in 0..paths.len() {
        for j in 0..i {
            assert_ne!(paths[i], paths[j], "entries {i} and {j} share a key");
        }
    }
    assert_eq!(
        paths[0],
        cache
            .entry_path(&common::client(8), &p8, &CompileOptions::new(8))
            .unwrap(),
        "the same program on a new client of the same shape"
    );
}

#[test]
fn a_damaged_entry_is_compiled_again_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path());
    let d = 2;
    let (mlir, opts) = (common::sharded_program(d), CompileOptions::new(d));
    let client = common::client(d).with_compile_cache(Some(cache.clone()));
    let want = run_bits(&client, &client.compile(&mlir, &opts).unwrap());
    let entry = cache.entry_path(&client, &mlir, &opts).unwrap();
    let good = std::fs::read(&entry).unwrap();
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x55;
    for damaged in [flipped, good[..good.len() / 2].to_vec(), Vec::new()] {
        std::fs::write(&entry, &damaged).unwrap();
        let exe = client.compile(&mlir, &opts).unwrap();
        assert_eq!(run_bits(&client, &exe), want);
        // The plugin's bytes are not the same from one compile to the next, their size is.
        let now = std::fs::read(&entry).unwrap();
        assert!(
            now != damaged && now.len() == good.len(),
            "the entry was not replaced"
        );
    }
    // A directory that cannot be created costs the save, not the compile.
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, b"not a directory").unwrap();
    let client = client.with_compile_cache(Some(CompileCache::new(blocked.join("cache"))));
    assert_eq!(
        run_bits(&client, &client.compile(&mlir, &opts).unwrap()),
        want
    );
}

#[test]
fn threads_that_compile_one_program_at_once_all_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path());
    let d = 2;
    let (mlir, opts) = (common::sharded_program(d), CompileOptions::new(d));
    let plain = common::client(d).with_compile_cache(None);
    let want = run_bits(&plain, &plain.compile(&mlir, &opts).unwrap());
    let got: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let c = common::client(d).with_compile_cache(Some(cache.clone()));
                    run_bits(&c, &c.compile(&mlir, &opts).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(got.iter().all(|g| *g == want));
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(
        files.len(),
        1,
        "one entry, no temporary file left: {files:?}"
    );
}
