//! The command line's tests, one binary: each file is a module (run one with
//! `cargo test --release -p shardes-cli --test cli cli_run::`). The 22 files were 22
//! binaries; as one they link once and the test threads overlap every file's tests. The
//! multi-process tier (`cli_mpi.rs`, `cli_mpi_tasks.rs`, feature `mpi`) stays two binaries
//! of its own, run by `.ci/mpi-tier`.

#[path = "../common/mod.rs"]
mod common;

mod cli_bench_decode;
mod cli_bench_qwen2;
mod cli_bf16;
mod cli_check_task;
mod cli_control;
mod cli_curves;
mod cli_errors;
mod cli_estimate;
mod cli_faults;
mod cli_hostile;
mod cli_init;
mod cli_inspect;
mod cli_install;
mod cli_mujoco;
mod cli_optimizer;
mod cli_plot;
mod cli_qwen2;
mod cli_reward;
mod cli_run;
mod cli_sigma;
mod cli_smollm2;
mod cli_task_hlo;
