//! The library's integration tests, one binary: each file is a module (run one with
//! `cargo test --release --test suite decode_rows::`, one test by its full path). The 52
//! files were 52 binaries; as one they link once and the test threads overlap every file's
//! tests, which shortens the default tier (`docs/performance.md`, "The test suite and the
//! compile cache"). `tests/model_provision.rs` stays a binary of its own (it sets
//! environment variables, which would leak into the tests beside it), and so do the
//! pretrained model's tests (`tests/pretrained/`).

#[path = "../support/mod.rs"]
mod support;

mod bench_diag;
mod bench_engine;
mod control_envs;
mod control_problem;
mod decode_layer_noise;
mod decode_members;
mod decode_rows;
mod distributed_threads;
mod erf_inv_exact;
mod es_api;
mod es_bf16;
mod es_compile_cache;
mod es_coupling;
mod es_estimate;
mod es_gen0;
mod es_noise;
mod es_optimizer;
mod es_outputs;
mod es_program;
mod es_shaping;
mod es_sigma;
mod es_split;
mod es_stat;
mod es_update;
mod hlo_ops;
mod host_control;
mod io_owned;
mod io_roundtrip;
mod mujoco_fixture;
mod prng_emitted;
mod prng_unrolled;
mod prng_vectors;
mod problem_limits;
mod quickstart_example;
#[cfg(feature = "models")]
mod qwen2_fixture;
#[cfg(feature = "models")]
mod qwen2_hf;
mod qwen2_layers;
mod qwen2_model;
mod qwen2_size;
mod reference_gen0;
mod reward_command;
mod reward_processes;
mod rundir_checkpoint;
mod rundir_dir;
mod session;
mod source_shape;
mod tasks_chat;
mod tasks_countdown;
mod tasks_jsonl;
mod tasks_score;
mod tensorboard_events;
mod tensorboard_python;
