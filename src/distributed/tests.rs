use super::*;

/// Runs `f` on each member of a thread group of `size`, returning the results in rank
/// order.
fn on_group<T: Send>(size: usize, f: impl Fn(&Distributed) -> T + Sync) -> Vec<T> {
    threads::run(size, |d| f(&d))
}

#[test]
fn a_single_process_is_the_identity() {
    let d = Distributed::single();
    assert_eq!((d.rank(), d.size(), d.is_lead()), (0, 1, true));
    assert_eq!(d.gather_fitness(&[1.0, 2.0]).unwrap(), [1.0, 2.0]);
    assert_eq!(d.sum_in_rank_order(&[3.0], 1).unwrap(), [3.0]);
    assert_eq!(
        d.sum_in_rank_order(&[1e8, 1.0, -1e8, 2.0], 2).unwrap(),
        [0.0, 3.0]
    );
    assert!(d.agree("x", 7, "").is_ok());
    assert_eq!(d.broadcast_bytes(vec![1, 2]).unwrap(), [1, 2]);
    assert_eq!(d.members(10), 0..10);
}

#[test]
fn gathers_are_in_rank_order() {
    let out = on_group(3, |d| {
        let r = d.rank() as f32;
        d.gather_fitness(&[r, r + 0.5]).unwrap()
    });
    for got in out {
        assert_eq!(got, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    }
}

#[test]
fn sums_are_added_in_rank_order_and_the_same_bits_everywhere() {
    // Values whose sum depends on the order (1e8 + 1 − 1e8 is 0 in f32 in this order);
    // 7 values do not split evenly over 3 processes.
    let value = |r: usize, part: usize, i: usize| -> f32 {
        match (r + part) % 3 {
            0 => 1e8 + i as f32,
            1 => 1.0 + 0.25 * part as f32,
            _ => -1e8,
        }
    };
    for parts in [1, 2] {
        let local = |r: usize| -> Vec<f32> {
            (0..parts)
                .flat_map(|part| (0..7).map(move |i| value(r, part, i)))
                .collect()
        };
        let out = on_group(3, |d| d.sum_in_rank_order(&local(d.rank()), parts).unwrap());
        let want: Vec<f32> = (0..7)
            .map(|i| {
                let mut terms = (0..3).flat_map(|r| (0..parts).map(move |p| value(r, p, i)));
                let first = terms.next().unwrap();
                terms.fold(first, |acc, x| acc + x)
            })
            .collect();
        for got in &out {
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{parts} parts"
            );
        }
    }
}

#[test]
fn a_differing_hash_is_refused_on_every_process_naming_it() {
    let out = on_group(3, |d| {
        let h = if d.rank() == 2 { 9 } else { 5 };
        d.agree("the config", h, "start every process with the same config")
            .unwrap_err()
            .to_string()
    });
    assert!(out[0].starts_with("the processes disagree on the config: process 0 has 0000000000000005, process 2 has 0000000000000009"), "{}", out[0]);
    assert!(
        out[2].contains("process 2 has 0000000000000009, process 0 has 0000000000000005"),
        "{}",
        out[2]
    );
    assert!(
        out[1].ends_with("; start every process with the same config"),
        "{}",
        out[1]
    );
    assert!(on_group(2, |d| d.agree("x", 1, "").is_ok())
        .iter()
        .all(|ok| *ok));
}

#[test]
fn broadcasts_carry_process_zeros_data() {
    let out = on_group(2, |d| {
        let mine = if d.is_lead() {
            vec![7u8; 10]
        } else {
            Vec::new()
        };
        d.broadcast_bytes(mine).unwrap()
    });
    assert_eq!(out, [vec![7u8; 10], vec![7u8; 10]]);
    let tree = |v: f32| {
        ParamTree::map([
            (
                "b",
                ParamTree::Leaf(Array::new(vec![2], vec![v, v + 1.0]).unwrap()),
            ),
            (
                "w",
                ParamTree::Leaf(Array::new(vec![1, 3], vec![v; 3]).unwrap()),
            ),
        ])
    };
    let out = on_group(3, |d| d.broadcast_params(&tree(d.rank() as f32)).unwrap());
    assert!(out.iter().all(|t| *t == tree(0.0)));
    assert_eq!(params_digest(&out[1]), params_digest(&tree(0.0)));
    assert_ne!(params_digest(&tree(0.0)), params_digest(&tree(1.0)));
}
