//! Donated inputs (`tf.aliasing_output`) are consumed; `non_donatable_inputs` keeps them.

mod common;

use shardes_runtime::{Buffer, Client, CompileOptions, Executable, ExecuteOptions, RuntimeError};

const DONATING: &str = r#"module @donate attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> tensor<4xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"#;

/// A client, [`DONATING`] compiled on it, and an input `[1, 2, 3, 4]`.
fn donating() -> (Client, Executable, Buffer) {
    let client = common::client(1);
    let exe = client.compile(DONATING, &CompileOptions::new(1)).unwrap();
    let x = client
        .buffer_from_host(&[1.0f32, 2.0, 3.0, 4.0], &[4], 0)
        .unwrap();
    (client, exe, x)
}

#[test]
fn donated_input_is_unusable_and_the_error_says_so() {
    let (_client, exe, x) = donating();
    let out = exe.execute(&[vec![&x]]).unwrap();
    assert_eq!(out[0][0].to_host::<f32>().unwrap(), [2.0, 4.0, 6.0, 8.0]);
    assert!(x.is_deleted().unwrap());
    let err = x.to_host::<f32>().unwrap_err();
    assert!(matches!(err, RuntimeError::BufferDeleted { .. }), "{err:?}");
    assert!(err.to_string().contains("deleted or donated"), "{err}");
    assert!(err.to_string().contains("non_donatable_inputs"), "{err}");
    // Passing it again is refused before reaching the plugin.
    let err = exe.execute(&[vec![&x]]).unwrap_err();
    assert!(matches!(err, RuntimeError::BufferDeleted { .. }), "{err:?}");
}

#[test]
fn non_donatable_input_stays_usable() {
    let (_client, exe, x) = donating();
    let opts = ExecuteOptions {
        non_donatable_inputs: vec![0],
    };
    for _ in 0..2 {
        let out = exe.execute_with(&[vec![&x]], &opts).unwrap();
        assert_eq!(out[0][0].to_host::<f32>().unwrap(), [2.0, 4.0, 6.0, 8.0]);
    }
    assert!(!x.is_deleted().unwrap());
    assert_eq!(x.to_host::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn explicit_delete() {
    let client = common::client(1);
    let x = client.buffer_from_host(&[7u8; 3], &[3], 0).unwrap();
    x.delete().unwrap();
    assert!(x.is_deleted().unwrap());
    assert!(matches!(
        x.to_host::<u8>(),
        Err(RuntimeError::BufferDeleted { .. })
    ));
}
