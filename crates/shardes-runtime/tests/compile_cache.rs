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
    let (cache, d) = (CompileCache::new(dir.path()), 2);
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
    let d = 2;
    let (mlir, opts) = (common::sharded_program(d), CompileOptions::new(d));
    let cache = CompileCache::new(dir.path());
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

/// A program like [`common::sharded_program`] whose first output is `x * k + 1`.
fn times(d: usize, k: u32) -> String {
    common::sharded_program(d).replace("dense<2.000000e+00>", &format!("dense<{k}.000000e+00>"))
}

#[test]
fn past_the_bound_the_least_recently_used_entries_are_deleted() {
    let d = 2;
    let opts = CompileOptions::new(d);
    let [a, b, c] = [4, 5, 6].map(|k| times(d, k));
    // Each entry's size, from a cache without a bound to speak of.
    let probe = tempfile::tempdir().unwrap();
    let unbounded = CompileCache::new(probe.path());
    let client = common::client(d).with_compile_cache(Some(unbounded.clone()));
    let size = |mlir: &String| {
        client.compile(mlir, &opts).unwrap();
        let entry = unbounded.entry_path(&client, mlir, &opts).unwrap();
        std::fs::metadata(entry).unwrap().len()
    };
    let [sa, sb, sc] = [&a, &b, &c].map(size);
    // Room for any two of the three, not for all three.
    let max = (sa + sb).max(sa + sc).max(sb + sc);
    assert!(max < sa + sb + sc);

    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path()).with_max_bytes(max);
    let client = common::client(d).with_compile_cache(Some(cache.clone()));
    let entry = |mlir: &String| cache.entry_path(&client, mlir, &opts).unwrap();
    let pause = || std::thread::sleep(std::time::Duration::from_millis(20));
    // A temporary file a dead writer left an hour and more ago goes; a fresh one stays.
    let stale = dir.path().join(".dead.1.0.tmp");
    let fresh = dir.path().join(".alive.2.0.tmp");
    for f in [&stale, &fresh] {
        std::fs::write(f, b"partial").unwrap();
    }
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options()
        .append(true)
        .open(&stale)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();

    client.compile(&a, &opts).unwrap();
    pause();
    client.compile(&b, &opts).unwrap();
    assert!(entry(&a).exists() && entry(&b).exists(), "two entries fit");
    assert!(!stale.exists(), "the stale temporary file was left");
    assert!(fresh.exists(), "a temporary file being written was deleted");
    pause();
    // Loading `a` makes it the most recently used, so `c` pushes out `b`, not `a`.
    let before = std::fs::metadata(entry(&a)).unwrap().modified().unwrap();
    client.compile(&a, &opts).unwrap();
    let after = std::fs::metadata(entry(&a)).unwrap().modified().unwrap();
    assert!(after > before, "a load did not mark its entry used");
    pause();
    client.compile(&c, &opts).unwrap();
    assert!(entry(&a).exists(), "the recently loaded entry was deleted");
    assert!(
        !entry(&b).exists(),
        "the least recently used entry was kept"
    );
    assert!(entry(&c).exists(), "the new entry was deleted");

    // An entry larger than the bound is not saved, and the program still runs.
    let tiny = CompileCache::new(dir.path().join("tiny")).with_max_bytes(sa / 2);
    let client = common::client(d).with_compile_cache(Some(tiny.clone()));
    let exe = client.compile(&a, &opts).unwrap();
    assert!(!tiny.entry_path(&client, &a, &opts).unwrap().exists());
    let plain = common::client(d).with_compile_cache(None);
    assert_eq!(
        run_bits(&client, &exe),
        run_bits(&plain, &plain.compile(&a, &opts).unwrap())
    );
}
