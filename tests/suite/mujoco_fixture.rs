//! The MuJoCo bindings against the `mujoco` Python package, and the MJCF conventions.
//!
//! `tests/fixtures/mujoco/rollouts.json` is written by `tools/mujoco_fixture.py`: the
//! shipped models stepped by `mujoco` 4.0.0 under fixed controls from a fixed state. The
//! same steps through `shardes_mujoco` must give the same `qpos` and `qvel` within
//! 1e-9 (absolute, or relative to the value where it is larger than 1): both call the same
//! `libmujoco.so.4.0.0` (the pinned one is byte-identical to the Python package's), so the
//! trajectories agree to the last bit in practice; the tolerance leaves room for another
//! build of 4.0.0 through `SHARDES_MUJOCO` (the cart-pole's pole spins, so a 1-ulp
//! difference would grow).
//!
//! The library is provisioned into the per-user cache on first use (pip, like the PJRT
//! plugin); once it is there these tests need no network.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use shardes::hlo::prng::key;
use shardes::mjcf::{MjcfEnv, MjcfError};
use shardes::mujoco::{Data, Model, Mujoco};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn lib() -> Arc<Mujoco> {
    Mujoco::open(None).expect("the MuJoCo library (provisioned on first use)")
}

fn model(name: &str) -> Arc<Model> {
    let path = repo().join("examples/mujoco").join(name);
    Arc::new(Model::load(&lib(), &path).unwrap())
}

fn fixture() -> Value {
    let text = std::fs::read_to_string(repo().join("tests/fixtures/mujoco/rollouts.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn the_library_is_the_pinned_version() {
    let l = lib();
    assert_eq!(l.version(), "4.0.0");
    assert_eq!(fixture()["library"], "4.0.0");
}

#[test]
fn shipped_models_roll_out_as_the_python_package_does() {
    let fx = fixture();
    for (name, file) in [("cartpole", "cartpole.xml"), ("reacher", "reacher.xml")] {
        let case = &fx["cases"][name];
        let m = model(file);
        let mut d = Data::new(&m).unwrap();
        d.reset();
        let offset = floats(&case["qpos_offset"]);
        let q0: Vec<f64> = m.qpos0().iter().zip(&offset).map(|(a, b)| a + b).collect();
        d.qpos_mut().copy_from_slice(&q0);
        d.qvel_mut().copy_from_slice(&floats(&case["qvel0"]));
        let ctrl = case["ctrl"].as_array().unwrap();
        let (qpos, qvel) = (
            case["qpos"].as_array().unwrap(),
            case["qvel"].as_array().unwrap(),
        );
        assert_eq!(ctrl.len(), 200);
        for t in 0..ctrl.len() {
            d.ctrl_mut().copy_from_slice(&floats(&ctrl[t]));
            d.step();
            for (what, ours, theirs) in [("qpos", d.qpos(), &qpos[t]), ("qvel", d.qvel(), &qvel[t])]
            {
                let theirs = floats(theirs);
                assert_eq!(ours.len(), theirs.len());
                for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                    assert!(close(*a, *b), "{name} step {t} {what}[{i}]: {a} vs {b}");
                }
            }
        }
    }
}

#[test]
fn the_cartpole_environment_steps_as_its_model() {
    // Through the conventions: ctrlrange [-1, 1] maps the action onto itself, so the
    // environment's trajectory is the fixture's while the pole stays within the bounds,
    // with reward 1 per step; the first step outside the bounds ends the episode.
    let fx = fixture();
    let case = &fx["cases"]["cartpole"];
    let env = MjcfEnv::new(model("cartpole.xml")).unwrap();
    assert_eq!(
        (env.obs_dim(), env.action_dim(), env.frame_skip()),
        (4, 1, 1)
    );
    let mut state: Vec<f64> = floats(&case["qpos_offset"]);
    state.extend(floats(&case["qvel0"]));
    let mut ep = env.episode(&state).unwrap();
    let mut obs = [0f32; 4];
    let mut ended = None;
    for (t, u) in case["ctrl"].as_array().unwrap().iter().enumerate() {
        let a = floats(u)[0] as f32;
        let (r, done) = ep.step(&env, &[a]).unwrap();
        let q = floats(&case["qpos"][t]);
        if ended.is_none() {
            assert_eq!(ep.data().qpos(), &q[..], "step {t}");
            ep.observe(&mut obs);
            assert_eq!(obs[0], q[0] as f32);
            assert_eq!(r, 1.0);
            let out = q[0].abs() > 2.4 || q[1].abs() > 12f64.to_radians();
            assert_eq!(done, out, "step {t}: qpos {q:?}");
            if done {
                ended = Some(t);
            }
        } else {
            assert_eq!((r, done), (0.0, true), "an ended episode stays ended");
        }
    }
    let t = ended.expect("the fixture's controls push the pole over");
    assert_eq!(ep.ret(), (t + 1) as f64);
    assert_eq!(ep.steps(), t + 1);
}

#[test]
fn reacher_reward_is_minus_distance_and_a_tenth_of_the_control_cost() {
    let env = MjcfEnv::new(model("reacher.xml")).unwrap();
    assert_eq!(
        (env.obs_dim(), env.action_dim(), env.frame_skip()),
        (8, 2, 2)
    );
    let s = env.reset_states(key(3).unwrap(), 16).unwrap();
    assert_eq!(s.len(), 16 * 8);
    for row in s.chunks(8) {
        assert!(row[0].abs() < 0.1 && row[1].abs() < 0.1, "{row:?}");
        assert!(row[2].abs() < 0.2 && row[3].abs() < 0.2, "{row:?}");
        assert!(
            row[4].abs() < 0.005 && row[6] == 0.0 && row[7] == 0.0,
            "{row:?}"
        );
    }
    // Deterministic in the key, and the same first rows for more episodes.
    assert_eq!(s, env.reset_states(key(3).unwrap(), 16).unwrap());
    let mut ep = env.episode(&s[..8]).unwrap();
    let a = [0.5f32, -0.25];
    // The distance as mj_step leaves the sensor: measured at the start of the last substep.
    let (r, done) = ep.step(&env, &a).unwrap();
    let d = ep.data().sensordata();
    let dist = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
    assert!(!done);
    let want = -dist - 0.1 * (0.25 + 0.0625);
    assert!((r - want).abs() < 1e-12, "{r} vs {want}");
}

#[test]
fn bad_inputs_name_the_problem() {
    let env = MjcfEnv::new(model("cartpole.xml")).unwrap();
    let mut ep = env.episode(&[0.0; 4]).unwrap();
    let e = ep.step(&env, &[0.1, 0.2]).unwrap_err().to_string();
    assert!(
        e.contains("action: got 2 values") && e.contains("needs 1"),
        "{e}"
    );
    let e = env.episode(&[0.0; 3]).unwrap_err().to_string();
    assert!(e.contains("reset state: got 3 values"), "{e}");

    let d = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| -> PathBuf {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // MuJoCo's own message, naming the element.
    let broken = write(
        "broken.xml",
        "<mujoco><worldbody><body><geom type=\"sphere\"/></body>",
    );
    let e = Model::load(&lib(), &broken).unwrap_err().to_string();
    assert!(
        e.contains("MuJoCo cannot load") && e.contains("broken.xml"),
        "{e}"
    );
    assert!(
        e.to_lowercase().contains("xml"),
        "MuJoCo's parser message: {e}"
    );
    let e = Model::load(&lib(), Path::new("/nonexistent/model.xml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no such file"), "{e}");

    let load = |p: &Path| -> MjcfError {
        MjcfEnv::new(Arc::new(Model::load(&lib(), p).unwrap())).unwrap_err()
    };
    let passive = write(
        "passive.xml",
        "<mujoco><worldbody><body><joint type=\"hinge\"/><geom size=\"0.1\" mass=\"1\"/></body></worldbody></mujoco>",
    );
    assert!(load(&passive).to_string().contains("no actuators (nu = 0)"));
    let model = |custom: &str| {
        format!(
            "<mujoco><worldbody><body><joint name=\"j\" type=\"hinge\"/><geom size=\"0.1\" \
             mass=\"1\"/></body></worldbody><actuator><motor joint=\"j\"/></actuator>\
             <custom>{custom}</custom></mujoco>"
        )
    };
    for (custom, says) in [
        (
            "<numeric name=\"shardes_bound_k\" data=\"-1 1\"/>",
            "names no joint of the model (\"k\")",
        ),
        (
            "<numeric name=\"shardes_bound_j\" data=\"1 -1\"/>",
            "is not a range",
        ),
        (
            "<numeric name=\"shardes_alvie\" data=\"1\"/>",
            "unknown shardes numeric \"shardes_alvie\"",
        ),
        (
            "<numeric name=\"shardes_reset_qpos\" data=\"1 2\"/>",
            "has 2 values",
        ),
        (
            "<numeric name=\"shardes_frame_skip\" data=\"0.5\"/>",
            "not a whole number",
        ),
    ] {
        let e = load(&write("m.xml", &model(custom))).to_string();
        assert!(e.contains(says), "{custom}: {e}");
    }
}
