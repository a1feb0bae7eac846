//! A small model written here, loaded and stepped through the safe layer: what the model
//! describes (joints, sensors, numerics, control ranges), a simulation's arrays, and
//! MuJoCo's load errors. The library is provisioned into the per-user cache on first use
//! (as the PJRT plugin); once it is there these tests need no network.

use std::path::Path;
use std::sync::Arc;

use shardes_mujoco::{Data, JointKind, Model, Mujoco, MujocoError};

const SLIDER: &str = r#"<mujoco>
  <option timestep="0.01"/>
  <custom><numeric name="gain" data="1 2 3"/></custom>
  <worldbody>
    <body name="cart">
      <joint name="slide" type="slide" axis="1 0 0"/>
      <geom type="box" size="0.1 0.1 0.1" mass="1"/>
      <body name="pole">
        <joint name="hinge" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.5" size="0.02" mass="0.1"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="push" joint="slide" ctrlrange="-2 2" ctrllimited="true"/>
    <motor name="free" joint="hinge"/>
  </actuator>
  <sensor><jointpos name="x" joint="slide"/></sensor>
</mujoco>
"#;

fn slider(dir: &Path) -> Arc<Model> {
    let path = dir.join("slider.xml");
    std::fs::write(&path, SLIDER).unwrap();
    let lib = Mujoco::open(None).expect("the MuJoCo library (provisioned on first use)");
    Arc::new(Model::load(&lib, &path).unwrap())
}

#[test]
fn a_model_says_what_it_holds() {
    let d = tempfile::tempdir().unwrap();
    let m = slider(d.path());
    assert_eq!((m.nq(), m.nv(), m.nu(), m.nsensordata()), (2, 2, 2, 1));
    assert_eq!(m.timestep(), 0.01);
    assert_eq!(m.qpos0(), &[0.0, 0.0]);
    let joints = m.joints();
    assert_eq!(joints.len(), 2);
    assert_eq!(
        (joints[0].name.as_str(), joints[0].kind, joints[0].qpos_adr),
        ("slide", JointKind::Slide, 0)
    );
    assert_eq!(
        (joints[1].name.as_str(), joints[1].kind, joints[1].qpos_adr),
        ("hinge", JointKind::Hinge, 1)
    );
    let sensors = m.sensors();
    assert_eq!(sensors.len(), 1);
    assert_eq!(
        (sensors[0].name.as_str(), sensors[0].adr, sensors[0].dim),
        ("x", 0, 1)
    );
    let numerics = m.numerics();
    assert_eq!(numerics.len(), 1);
    assert_eq!(numerics[0].name, "gain");
    assert_eq!(numerics[0].data, [1.0, 2.0, 3.0]);
    assert_eq!(m.ctrl_range(0), Some((-2.0, 2.0)));
    assert_eq!(m.ctrl_range(1), None);
    assert_eq!(m.ctrl_range(2), None);
    assert_eq!(m.library().version(), "4.0.0");
}

#[test]
fn a_simulation_steps_under_its_controls_and_resets() {
    let d = tempfile::tempdir().unwrap();
    let m = slider(d.path());
    let mut sim = Data::new(&m).unwrap();
    sim.ctrl_mut()[0] = 1.0;
    for _ in 0..10 {
        sim.step();
    }
    assert!((sim.time() - 0.1).abs() < 1e-12, "{}", sim.time());
    assert!(
        sim.qpos()[0] > 0.0 && sim.qvel()[0] > 0.0,
        "{:?}",
        sim.qpos()
    );
    sim.forward();
    assert_eq!(sim.sensordata()[0], sim.qpos()[0]);
    assert_eq!(sim.unstable_count(), 0);
    sim.reset();
    assert_eq!(
        (sim.time(), sim.qpos(), sim.ctrl()),
        (0.0, &[0.0, 0.0][..], &[0.0, 0.0][..])
    );
    sim.qvel_mut()[1] = 3.0;
    assert_eq!(sim.qvel(), &[0.0, 3.0]);
}

#[test]
fn a_model_mujoco_refuses_gives_its_message() {
    let d = tempfile::tempdir().unwrap();
    let lib = Mujoco::open(None).unwrap();
    let bad = d.path().join("bad.xml");
    std::fs::write(
        &bad,
        "<mujoco><worldbody><body><joint type=\"nope\"/></body></worldbody></mujoco>",
    )
    .unwrap();
    match Model::load(&lib, &bad) {
        Err(MujocoError::Load { path, message }) => {
            assert_eq!(path, bad);
            assert!(!message.is_empty() && !message.contains('\n'), "{message}");
        }
        other => panic!("expected a load error, got {other:?}"),
    }
    let e = Model::load(&lib, &d.path().join("missing.xml")).unwrap_err();
    assert!(e.to_string().contains("no such file"), "{e}");
    let e = Model::load(&lib, d.path()).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");
}
