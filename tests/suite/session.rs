//! `shardes::session::Session` through the library, without the CLI: a run stopped by a
//! signal and resumed from its checkpoint ends with exactly the parameters and metrics of
//! an uninterrupted run; a divergence stops at the first non-finite fitness, after its
//! metrics line, keeping the last finite checkpoint; the observer sees every generation.

use std::path::Path;

use crate::support::tiny::{mlp_batch, mlp_params, Mlp};
use shardes::distributed::Distributed;
use shardes::hlo::es::strategy::{LowRank, Mirrored};
use shardes::hlo::es::ShardedES;
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::key;
use shardes::rundir::{read_metrics, Metric, Mode, RunDir};
use shardes::runtime::Client;
use shardes::session::{finite, Observer, Outcome, Plan, Record, Session, SessionError, Signal};
use shardes::Trainer;

const HASH: &str = "0123456789abcdef0123456789abcdef";

fn plan(dir: &Path, total: u32, sigma: f32, lr: f32) -> Plan {
    Plan {
        total,
        checkpoint_every: 2,
        es: finite::Settings { n: 8, sigma, lr },
        dir: dir.to_path_buf(),
        negated_return: false,
    }
}

#[derive(Default)]
struct Seen {
    generations: Vec<u32>,
    checkpoints: usize,
    failing: usize,
}

impl Observer for Seen {
    fn generation(&mut self, m: &Metric, done: u32, _total: u32, _eta: f64) {
        assert_eq!(m.generation + 1, done);
        self.generations.push(m.generation);
    }
    fn checkpoint(&mut self) {
        self.checkpoints += 1;
    }
    fn failing(&mut self) {
        self.failing += 1;
    }
}

/// Runs (or resumes) the MLP's run in `dir` to `total` generations; `stop_after` stops it
/// (as SIGTERM would) once that many generations are done.
fn run(
    dir: &Path,
    mode: Mode,
    total: u32,
    stop_after: Option<u32>,
    lr: f32,
) -> Result<(Outcome, Seen), SessionError> {
    let client = Client::cpu(1).expect("CPU client");
    let strategy = Box::new(Mirrored(Box::new(LowRank { r: 1 })));
    let es = ShardedES::new(strategy, 8, 0.05, lr, 1).expect("es");
    let mut prep = RunDir::prepare(dir, mode, HASH).expect("prepare");
    let mut params = mlp_params(3);
    let mut start = 0;
    if let Some(ckpt) = prep.take_checkpoint() {
        params = ckpt.params(&params).expect("checkpoint params");
        start = ckpt.state().generation;
    }
    let k = key(11).expect("key");
    let trainer = Trainer::with_state(&client, &es, &Mlp::PLAIN, &params, k, &mlp_batch(4), start)
        .expect("trainer");
    let rundir = prep.commit().expect("commit");
    let record = Record::new(rundir, k, serde_json::json!({"inputs": {}})).expect("record");
    let dist = Distributed::single();
    let mut session = Session::new(trainer, &dist, Some(record), plan(dir, total, 0.05, lr))?;
    let mut seen = Seen::default();
    let mut stop = || {
        let done = session_generation(dir);
        stop_after.filter(|&s| done >= s).map(|_| Signal(15))
    };
    let ending = session.run(&mut stop, &mut seen)?;
    session.finish()?;
    Ok((ending.outcome, seen))
}

/// Generations in `dir`'s metrics so far (what the stop closure counts).
fn session_generation(dir: &Path) -> u32 {
    read_metrics(&dir.join("metrics.jsonl"))
        .map(|m| m.records.len() as u32)
        .unwrap_or(0)
}

fn final_params(dir: &Path) -> Vec<u32> {
    let mut prep = RunDir::prepare(dir, Mode::Resume, HASH).expect("prepare");
    let ckpt = prep.take_checkpoint().expect("a checkpoint");
    let tree: ParamTree = ckpt.params(&mlp_params(3)).expect("params");
    tree.leaves()
        .into_iter()
        .flat_map(|(_, a)| a.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        .collect()
}

fn metrics(dir: &Path) -> Vec<(u32, u64)> {
    read_metrics(&dir.join("metrics.jsonl"))
        .expect("metrics")
        .records
        .iter()
        .map(|(m, _)| (m.generation, m.fitness_mean.to_bits()))
        .collect()
}

#[test]
fn a_stopped_and_resumed_session_is_the_uninterrupted_one() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (whole, parts) = (tmp.path().join("whole"), tmp.path().join("parts"));
    let (outcome, seen) = run(&whole, Mode::Fresh { force: false }, 6, None, 0.1).expect("run");
    assert_eq!(outcome, Outcome::Finished);
    assert_eq!(seen.generations, (0..6).collect::<Vec<_>>());
    // Checkpoints within the loop at 2 and 4; the end's is `finish`'s.
    assert_eq!(seen.checkpoints, 2);

    let (outcome, seen) =
        run(&parts, Mode::Fresh { force: false }, 6, Some(3), 0.1).expect("first part");
    assert_eq!(outcome, Outcome::Interrupted(Signal(15)));
    assert_eq!(outcome.exit_code(), 143);
    assert_eq!(seen.generations, vec![0, 1, 2]);
    let (outcome, seen) = run(&parts, Mode::Resume, 6, None, 0.1).expect("resumed");
    assert_eq!(outcome, Outcome::Finished);
    assert_eq!(seen.generations, vec![3, 4, 5]);

    assert_eq!(
        metrics(&whole),
        metrics(&parts),
        "the same fitness, bit for bit"
    );
    assert_eq!(
        final_params(&whole),
        final_params(&parts),
        "the same parameters"
    );
}

#[test]
fn a_diverging_session_stops_at_the_first_nan_and_keeps_its_last_checkpoint() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("nan");
    // An update this large overflows f32 after the first generation.
    let err = match run(&dir, Mode::Fresh { force: false }, 6, None, 1e38) {
        Ok((o, s)) => panic!("diverging run ended {o:?} after {:?}", s.generations),
        Err(e) => e,
    };
    let SessionError::Diverged { message, fix } = &err else {
        panic!("not a divergence: {err:?}");
    };
    // The update after generation 0 overflows; generation 1's fitness is NaN, before the
    // first checkpoint (at 2) was due.
    assert!(
        message.starts_with("the run diverged at generation 1:")
            && message.contains("fitness values are not finite"),
        "{message}"
    );
    assert!(fix.contains("es.lr"), "names the setting: {fix}");
    assert!(fix.contains("no checkpoint was written"), "{fix}");
    let recorded = metrics(&dir);
    assert_eq!(
        recorded.len(),
        2,
        "generation 1's line is written: {recorded:?}"
    );
    assert!(f64::from_bits(recorded[1].1).is_nan(), "{recorded:?}");
}
