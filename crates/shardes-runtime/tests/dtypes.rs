//! Host → device → host round trips of every supported element type, ranks 0..3, and the
//! scatter / replicate / gather helpers.

mod common;

use shardes_runtime::half::{bf16, f16};
use shardes_runtime::{gather_rows, Element, ElementType, RuntimeError};

const SHAPES: [&[usize]; 4] = [&[], &[5], &[3, 4], &[2, 3, 5]];

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(make: impl Fn(usize) -> T) {
    let client = common::client(2);
    for dims in SHAPES {
        let n: usize = dims.iter().product();
        let data: Vec<T> = (0..n).map(&make).collect();
        for device in 0..2 {
            let b = client.buffer_from_host(&data, dims, device).unwrap();
            assert_eq!(b.element_type(), T::TYPE);
            assert_eq!(b.dims(), dims);
            assert_eq!(b.device(), device);
            let back = b.to_host::<T>().unwrap();
            assert_eq!(back, data, "{} {dims:?} on device {device}", T::TYPE);
        }
    }
}

#[test]
fn f32_round_trip() {
    round_trip(|i| i as f32 * -1.5 + 0.25);
}
#[test]
fn f64_round_trip() {
    round_trip(|i| i as f64 * 1e-300 + std::f64::consts::PI);
}
#[test]
fn bf16_round_trip() {
    round_trip(|i| bf16::from_f32(i as f32 * 0.5 - 3.0));
}
#[test]
fn f16_round_trip() {
    round_trip(|i| f16::from_f32(i as f32 * 0.25 - 2.0));
}
#[test]
fn i32_round_trip() {
    round_trip(|i| (i as i32 - 7) * 1_000_003);
}
#[test]
fn i64_round_trip() {
    round_trip(|i| (i as i64 - 7) * 1_000_000_000_007);
}
#[test]
fn u32_round_trip() {
    round_trip(|i| u32::MAX - i as u32 * 77);
}
#[test]
fn u8_round_trip() {
    round_trip(|i| (i * 37 % 256) as u8);
}
#[test]
fn pred_round_trip() {
    round_trip(|i| i % 3 == 1);
}

#[test]
fn wrong_host_type_and_length_are_errors() {
    let client = common::client(1);
    let b = client.buffer_from_host(&[1.0f32, 2.0], &[2], 0).unwrap();
    match b.to_host::<i32>() {
        Err(RuntimeError::DtypeMismatch { expected, got, .. }) => {
            assert_eq!((expected, got), (ElementType::F32, ElementType::S32))
        }
        other => panic!("expected DtypeMismatch, got {other:?}"),
    }
    assert!(matches!(
        client.buffer_from_host(&[1.0f32, 2.0, 3.0], &[2, 2], 0),
        Err(RuntimeError::HostDataLength {
            expected: 4,
            got: 3,
            ..
        })
    ));
    assert!(matches!(
        client.buffer_from_host(&[1.0f32], &[1], 5),
        Err(RuntimeError::NoSuchDevice {
            device: 5,
            count: 1
        })
    ));
}

#[test]
fn scatter_replicate_gather() {
    let client = common::client(4);
    let data: Vec<i32> = (0..8 * 3).collect();
    let shards = client.scatter_rows(&data, &[8, 3]).unwrap();
    assert_eq!(shards.len(), 4);
    for (d, s) in shards.iter().enumerate() {
        assert_eq!(s.device(), d);
        assert_eq!(s.dims(), [2, 3]);
        assert_eq!(s.to_host::<i32>().unwrap(), data[d * 6..(d + 1) * 6]);
    }
    assert_eq!(gather_rows::<i32>(&shards).unwrap(), data);
    let reps = client.replicate(&data, &[8, 3]).unwrap();
    assert_eq!(reps.len(), 4);
    for r in &reps {
        assert_eq!(r.to_host::<i32>().unwrap(), data);
    }
    match client.scatter_rows(&data[..6 * 3], &[6, 3]) {
        Err(
            e @ RuntimeError::UnevenSplit {
                rows: 6,
                devices: 4,
            },
        ) => {
            assert!(
                e.to_string().contains("multiple of the device count"),
                "{e}"
            )
        }
        other => panic!("expected UnevenSplit, got {other:?}"),
    }
}
