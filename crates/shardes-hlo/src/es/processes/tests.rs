use super::*;
use crate::es::{leaf_infos, EsSpec, How};
use crate::prng::key;
use crate::problems::transformer_block::TransformerBlock;

fn quickstart() -> (TransformerBlock, Vec<LeafInfo>) {
    let tb = TransformerBlock::QUICKSTART;
    let leaves = leaf_infos(&tb.init(key(0).unwrap()).unwrap());
    (tb, leaves)
}

fn text(r: Result<Program, EsError>) -> String {
    r.unwrap().module.to_mlir()
}

#[test]
fn parts_split_the_members_in_rank_order() {
    let ranges: Vec<_> = (0..4)
        .map(|r| Part::new(r, 4).unwrap().members(256))
        .collect();
    assert_eq!(ranges, [0..64, 64..128, 128..192, 192..256]);
    assert_eq!(Part::SINGLE.members(256), 0..256);
    let e = Part::new(2, 2).unwrap_err().to_string();
    assert!(e.contains("process rank 2 of 2 processes"), "{e}");
}

#[test]
fn a_population_that_does_not_split_names_processes_devices_and_pairing() {
    assert!(check_processes(256, 2, 4, 2, "mirrored(lowrank(r=1))").is_ok());
    let e = check_processes(100, 2, 4, 2, "mirrored(lowrank(r=1))").unwrap_err();
    assert_eq!(
        e.message(),
        "es.n = 100 is not divisible by processes (2) × devices (4) × pairing (2 for \
         mirrored(lowrank(r=1))): each process evaluates n / processes members, split evenly \
         over its devices"
    );
    let fix = e.fix().unwrap();
    assert!(
        fix.starts_with("set es.n to a multiple of 16, e.g. 96 or 112"),
        "{fix}"
    );
    assert!(check_processes(8, 0, 4, 1, "lowrank(r=1)").is_err());
}

#[test]
fn one_process_runs_the_programs_of_one_process() {
    let (tb, leaves) = quickstart();
    for how in [How::A, How::B] {
        let mut s = EsSpec::new(64, 0.01, 0.01);
        s.how = how;
        let es = s.build(4).unwrap();
        let one = Part::SINGLE;
        assert_eq!(
            text(es.part_ask_apply_program(&tb, &leaves, one)),
            text(es.ask_apply_program(&tb, &leaves))
        );
        assert_eq!(
            text(es.part_tell_program(&tb, &leaves, one)),
            text(es.tell_program(&tb, &leaves))
        );
    }
}

#[test]
fn a_part_evaluates_its_own_global_members_on_its_own_devices() {
    let (tb, leaves) = quickstart();
    // 2 processes × 4 devices: the ES describes all 8.
    let es = EsSpec::new(64, 0.01, 0.01).build(8).unwrap();
    let first = es
        .part_ask_apply_program(&tb, &leaves, Part::new(0, 2).unwrap())
        .unwrap();
    let second = es
        .part_ask_apply_program(&tb, &leaves, Part::new(1, 2).unwrap())
        .unwrap();
    assert_eq!(first.layout.n, 32);
    assert_eq!(first.layout.fitness_dims(), [32]);
    let (a, b) = (first.module.to_mlir(), second.module.to_mlir());
    assert!(a.contains("@mesh = <[\"pop\"=4]>"), "{a}");
    // Rank 1's ids start at 32; rank 0's are the iota alone.
    assert!(
        b.contains("32 : tensor<ui32>") || b.contains("dense<32>"),
        "{b}"
    );
    assert_ne!(a, b);
    // The member chunk is the one of 8 devices, whatever the process count.
    let eight = EsSpec::new(64, 0.01, 0.01).build(8).unwrap();
    assert_eq!(
        es.member_chunk_for(&tb).unwrap(),
        eight.member_chunk_for(&tb).unwrap()
    );
    let e = match es.part_ask_apply_program(&tb, &leaves, Part::new(0, 3).unwrap()) {
        Ok(_) => panic!("8 devices over 3 processes"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("8 devices do not split over 3 processes"), "{e}");
}

#[test]
fn partial_and_update_programs_follow_their_layouts() {
    let (tb, leaves) = quickstart();
    let es = EsSpec::new(64, 0.01, 0.01).build(8).unwrap();
    let part = Part::new(1, 2).unwrap();
    let partial = es.partial_program(&tb, &leaves, part).unwrap();
    let l = &partial.layout;
    assert_eq!(l.kind, ProgramKind::Partial);
    assert_eq!(
        (l.n, l.arg_count(), l.result_count()),
        (64, leaves.len() + 3, leaves.len())
    );
    assert!(!l.donates());
    let t = partial.module.to_mlir();
    assert!(!t.contains("tf.aliasing_output"), "nothing donated");
    assert!(t.contains("%fitness: tensor<64xf32>"), "the whole fitness");
    let update = es.update_program(&tb, &leaves, part).unwrap();
    let l = &update.layout;
    assert_eq!(l.kind, ProgramKind::Update);
    assert_eq!(l.batch.len(), leaves.len());
    assert_eq!(l.batch[0].0, format!("u.{}", leaves[0].path));
    assert_eq!(l.arg_count(), 2 * leaves.len() + 2);
    assert_eq!(l.generation_result(), Some(leaves.len()));
    assert!(l.donates());
    let t = update.module.to_mlir();
    assert_eq!(
        t.matches("tf.aliasing_output").count(),
        leaves.len() + 1,
        "params and generation donated"
    );
    // A wrong number of updates names the list.
    let names: Vec<&str> = leaves.iter().map(|l| l.path.as_str()).collect();
    let e = l
        .args(names.clone(), "key", "gen", ["u"])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("the update program's update arguments: got 1"),
        "{e}"
    );
    assert!(l.args(names.clone(), "key", "gen", names).is_ok());
}
