//! Bad input gives a clear, typed error and never crashes the process.

mod common;

use std::path::Path;

use shardes_runtime::{
    Client, ClientOptions, CompileOptions, Plugin, RuntimeError, MAX_CPU_DEVICES,
};

#[test]
fn missing_plugin_path() {
    let err = Plugin::load("/nonexistent/dir/libpjrt_nothing.so").unwrap_err();
    assert!(matches!(err, RuntimeError::PluginMissing { .. }), "{err:?}");
    assert!(err
        .to_string()
        .contains("/nonexistent/dir/libpjrt_nothing.so"));
}

#[test]
fn text_file_is_not_a_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fake_plugin.so");
    std::fs::write(&p, "this is not an ELF file\n").unwrap();
    let err = Plugin::load(&p).unwrap_err();
    assert!(matches!(err, RuntimeError::NotAPlugin { .. }), "{err:?}");
    assert!(err.to_string().contains("not a PJRT plugin"), "{err}");
}

#[test]
fn shared_library_without_get_pjrt_api_is_not_a_plugin() {
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
        "/usr/lib64/libm.so.6",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists())
    .expect("libm.so.6 in a standard location");
    let err = Plugin::load(libm).unwrap_err();
    match &err {
        RuntimeError::NotAPlugin { reason, .. } => assert!(reason.contains("GetPjrtApi"), "{err}"),
        other => panic!("expected NotAPlugin, got {other:?}"),
    }
}

#[test]
fn malformed_mlir_carries_xla_diagnostic() {
    let client = common::client(1);
    let bad = "module @m {\n  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n    %0 = stablehlo.frobnicate %arg0 : tensor<4xf32>\n    return %0 : tensor<4xf32>\n  }\n}\n";
    let err = client.compile(bad, &CompileOptions::new(1)).unwrap_err();
    match &err {
        RuntimeError::Pjrt { message, .. } => {
            assert!(
                message.contains("frobnicate"),
                "diagnostic should name the bad op: {message}"
            )
        }
        other => panic!("expected a PJRT error, got {other:?}"),
    }
    println!("malformed MLIR -> {err}");
    let err = client
        .compile("not mlir at all", &CompileOptions::new(1))
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Pjrt { .. }), "{err:?}");
}

#[test]
fn too_many_partitions_for_the_client() {
    let client = common::client(2);
    let err = client
        .compile(&common::sharded_program(8), &CompileOptions::new(8))
        .unwrap_err();
    assert!(err.to_string().contains("cpu_device_count"), "{err}");
}

#[test]
fn wrong_shape_and_dtype_arguments() {
    let (client, exe) = common::compiled(1);
    let small = client
        .buffer_from_host(&[0f32; 4 * 16], &[4, 16], 0)
        .unwrap();
    match exe.execute(&[vec![&small]]).unwrap_err() {
        RuntimeError::ShapeMismatch { expected, got, .. } => {
            assert_eq!((expected, got), (vec![256, 16], vec![4, 16]))
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let f64s = client
        .buffer_from_host(&vec![0f64; 256 * 16], &[256, 16], 0)
        .unwrap();
    let err = exe.execute(&[vec![&f64s]]).unwrap_err();
    assert!(matches!(err, RuntimeError::DtypeMismatch { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("expected element type f32, got f64"),
        "{err}"
    );
    let ok = client
        .buffer_from_host(&vec![0f32; 256 * 16], &[256, 16], 0)
        .unwrap();
    let err = exe.execute(&[vec![&ok, &ok]]).unwrap_err();
    assert!(matches!(err, RuntimeError::Arity(_)), "{err:?}");
    // The executable is still fine afterwards.
    assert_eq!(exe.execute(&[vec![&ok]]).unwrap()[0].len(), 2);
}

#[test]
fn more_argument_lists_than_devices() {
    let (client, exe) = common::compiled(8);
    let shards = common::input_shards(&client);
    let mut args: Vec<Vec<_>> = shards.iter().map(|b| vec![b]).collect();
    args.push(vec![&shards[0]]);
    let err = exe.execute(&args).unwrap_err();
    assert!(matches!(err, RuntimeError::Arity(_)), "{err:?}");
    assert!(err.to_string().contains("only 8 device"), "{err}");
    args.truncate(7);
    let err = exe.execute(&args).unwrap_err();
    assert!(
        err.to_string().contains("compiled for 8 partition"),
        "{err}"
    );
    // Shards in the wrong device order are refused too.
    let swapped: Vec<Vec<_>> = (0..8).map(|d| vec![&shards[7 - d]]).collect();
    let err = exe.execute(&swapped).unwrap_err();
    assert!(err.to_string().contains("runs on device"), "{err}");
}

/// Asking for more simulated devices than the CPU plugin can run collectives on is refused at
/// once (it used to abort after a minute of rendezvous warnings, or hang creating devices).
#[test]
fn too_many_simulated_devices_are_refused_at_once() {
    let t = std::time::Instant::now();
    for n in [MAX_CPU_DEVICES + 1, 1000, 1_000_000, 99_999_999_999] {
        let err = Client::cpu(n).unwrap_err();
        match &err {
            RuntimeError::TooManyDevices { requested, max } => {
                assert_eq!((*requested, *max), (n, MAX_CPU_DEVICES));
            }
            other => panic!("expected TooManyDevices, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&n.to_string()), "{msg}");
        assert!(msg.contains("at most 256"), "{msg}");
    }
    let plugin = Plugin::load_default().unwrap();
    let err = Client::new(
        plugin,
        ClientOptions {
            cpu_device_count: Some(1000),
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, RuntimeError::TooManyDevices { .. }),
        "{err:?}"
    );
    assert!(
        t.elapsed().as_secs() < 10,
        "refusing took {:?}",
        t.elapsed()
    );
    // The limit itself works.
    let client = Client::cpu(MAX_CPU_DEVICES).unwrap();
    assert_eq!(client.device_count(), MAX_CPU_DEVICES);
}
