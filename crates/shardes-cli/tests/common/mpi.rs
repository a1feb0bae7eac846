//! Helpers of the multi-process tier (`cli_mpi.rs`, `cli_mpi_tasks.rs`): `mpirun` on
//! loopback, a run on some processes, and what two runs are compared by.

use std::path::Path;
use std::process::{Command, Output};

use super::{bin, exited, metrics, state, write};

/// `mpirun -np NP shardes` on loopback: TCP between the processes (as between hosts),
/// processes not bound to cores (2 cores here, up to 4 processes), root allowed (CI).
pub fn mpirun(np: usize) -> Command {
    let mut c = mpirun_base();
    c.args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_shardes")]);
    c
}

/// [`mpirun`]'s launcher options, without the processes.
pub fn mpirun_base() -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--bind-to", "none"])
        .args([
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            "lo",
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// Runs `shardes run CONFIG [extra]` on `np` processes (1: without mpirun) and returns its
/// output after checking that it exited 0.
pub fn run(np: usize, cfg: &Path, extra: &[&str]) -> Output {
    let mut c = if np == 1 { bin() } else { mpirun(np) };
    let o = c
        .arg("run")
        .arg(cfg)
        .args(extra)
        .output()
        .expect("spawning the run");
    exited(&o, 0);
    o
}

/// Writes `config` to `dir/name` and runs it on `np` processes ([`run`]).
pub fn run_config(np: usize, dir: &Path, name: &str, config: &str) -> Output {
    run(np, &write(dir, name, config), &[])
}

/// The fitness of every generation (mean, min, max as logged) and the checkpoint's digest.
pub fn trajectory(out: &Path) -> (Vec<[f64; 3]>, String) {
    let m = metrics(out)
        .iter()
        .map(|m| [m.fitness_mean, m.fitness_min, m.fitness_max])
        .collect();
    let sha = state(out)["params_sha256"]
        .as_str()
        .expect("params_sha256")
        .to_string();
    (m, sha)
}

/// The parameters of `out`'s checkpoint, leaf by leaf.
pub fn params(out: &Path) -> Vec<Vec<f32>> {
    let p = shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap();
    p.leaves()
        .into_iter()
        .map(|(_, a)| a.data().to_vec())
        .collect()
}

/// `‖a − b‖ / ‖b‖` of the worst leaf.
pub fn worst_leaf(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d: f64 = x.iter().zip(y).map(|(u, v)| f64::from(u - v).powi(2)).sum();
            let n: f64 = y.iter().map(|v| f64::from(*v).powi(2)).sum();
            (d / n.max(f64::MIN_POSITIVE)).sqrt()
        })
        .fold(0.0, f64::max)
}
