//! TensorBoard event files, read back on the Rust side: the TFRecord framing and both CRCs
//! checked by a bitwise CRC32C written here (independent of the module's table), the
//! protobuf wire of the header record checked byte by byte, and the scalars decoded.
//! Exact: values are compared bit for bit.

use shardes::tensorboard::proto::event::What;
use shardes::tensorboard::{
    crc32c, masked_crc32c, read_events, scalars, EventWriter, TensorboardError, FILE_VERSION,
};

/// CRC32C bit by bit, straight from the definition (reflected 0x82F63B78).
fn crc32c_bitwise(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
    }
    !c
}

// Spelled as TensorFlow's `crc32c::Mask` spells it, not as the module does.
#[allow(clippy::manual_rotate)]
fn masked_bitwise(data: &[u8]) -> u32 {
    let c = crc32c_bitwise(data);
    ((c >> 15) | (c << 17)).wrapping_add(0xa282_ead8)
}

/// Splits a file into its records' data, asserting every length and CRC.
fn records(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
        assert_eq!(len_crc, masked_bitwise(len_bytes), "length CRC at {at}");
        let data = &bytes[at + 12..at + 12 + len];
        let data_crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
        assert_eq!(data_crc, masked_bitwise(data), "data CRC at {at}");
        out.push(data);
        at += 16 + len;
    }
    assert_eq!(at, bytes.len());
    out
}

#[test]
fn crc32c_matches_the_standard_check_values() {
    // The CRC catalogue's check value and RFC 3720's (iSCSI) 32-byte vectors.
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
    let ascending: Vec<u8> = (0..32).collect();
    assert_eq!(crc32c(&ascending), 0x46DD_794E);
    assert_eq!(crc32c(b""), 0);
    for data in [&b"brain.Event:2"[..], &[7u8; 1000], &ascending] {
        assert_eq!(crc32c(data), crc32c_bitwise(data));
        assert_eq!(masked_crc32c(data), masked_bitwise(data));
    }
}

#[test]
fn event_file_frames_checksums_and_scalars_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let tb = dir.path().join("run/tb");
    let mut w = EventWriter::create(&tb).unwrap();
    let name = w.path().file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let time: &str = name["events.out.tfevents.".len()..]
        .split('.')
        .next()
        .unwrap();
    assert_eq!(time.len(), 10, "{name}");
    assert!(time.chars().all(|c| c.is_ascii_digit()), "{name}");
    assert_eq!(w.path().parent().unwrap(), tb);

    for g in 0..5i64 {
        let mean = 1.0 / (1.0 + g as f32);
        w.add_scalars(
            g,
            &[("fitness/mean", mean), ("fitness/min", 0.0), ("ms", 12.5)],
        )
        .unwrap();
    }
    w.add_scalar("eval/accuracy", 4, f32::NAN).unwrap();
    w.add_scalar("eval/accuracy", 5, -0.0).unwrap();
    w.flush().unwrap();

    let bytes = std::fs::read(w.path()).unwrap();
    let recs = records(&bytes);
    assert_eq!(recs.len(), 1 + 5 + 2);
    // The header record on the wire: wall_time (field 1, fixed64), then file_version
    // (field 3, length-delimited); step 0 is proto3's default and is not written.
    let head = recs[0];
    assert_eq!(head[0], 0x09);
    assert_eq!(&head[9..11], &[0x1a, FILE_VERSION.len() as u8]);
    assert_eq!(&head[11..], FILE_VERSION.as_bytes());
    let wall = f64::from_le_bytes(head[1..9].try_into().unwrap());
    assert!(wall > 1.5e9, "wall time {wall}");

    let events = read_events(w.path()).unwrap();
    assert_eq!(events.len(), recs.len());
    assert_eq!(events[0].what, Some(What::FileVersion(FILE_VERSION.into())));
    let got = scalars(&events);
    assert_eq!(got.len(), 5 * 3 + 2);
    for g in 0..5i64 {
        let row = &got[(g * 3) as usize..(g * 3 + 3) as usize];
        assert_eq!(row[0], ("fitness/mean".into(), g, 1.0 / (1.0 + g as f32)));
        // 0.0 is on the wire (a oneof), not dropped as a proto3 default.
        assert_eq!(row[1], ("fitness/min".into(), g, 0.0));
        assert_eq!(row[2], ("ms".into(), g, 12.5));
    }
    assert!(got[15].2.is_nan() && got[15].1 == 4);
    assert_eq!(got[16].2.to_bits(), (-0.0f32).to_bits());
    for e in &events[1..] {
        assert!(e.wall_time >= events[0].wall_time);
    }
}

#[test]
fn a_second_writer_gets_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = EventWriter::create(dir.path()).unwrap();
    let b = EventWriter::create(dir.path()).unwrap();
    assert_ne!(a.path(), b.path());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn damaged_records_are_refused_naming_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path()).unwrap();
    w.add_scalar("x", 1, 2.0).unwrap();
    w.flush().unwrap();
    let path = w.path().to_path_buf();
    drop(w);
    let good = std::fs::read(&path).unwrap();
    let first_len = 16 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;

    let check = |bytes: Vec<u8>, offset: u64, what: &str| {
        std::fs::write(&path, bytes).unwrap();
        match read_events(&path) {
            Err(TensorboardError::Corrupt {
                offset: o, what: w, ..
            }) => {
                assert_eq!(o, offset);
                assert!(w.contains(what), "{w:?} does not say {what:?}");
            }
            other => panic!("{other:?}"),
        }
    };
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    check(flipped, first_len as u64, "data's CRC");
    let mut data_flip = good.clone();
    data_flip[first_len + 14] ^= 0x40;
    check(data_flip, first_len as u64, "data's CRC");
    let mut len_flip = good.clone();
    len_flip[first_len] ^= 1;
    check(len_flip, first_len as u64, "length's CRC");
    check(
        good[..good.len() - 3].to_vec(),
        first_len as u64,
        "cut short",
    );
    check(
        good[..first_len + 5].to_vec(),
        first_len as u64,
        "header is cut short",
    );
    std::fs::write(&path, &good).unwrap();
    assert_eq!(read_events(&path).unwrap().len(), 2);
}
