//! Programs outside ES for a trained policy: its returns on given reset states (a replay of
//! an in-program environment), and one policy step for observations from elsewhere (a
//! MuJoCo simulation on the host). Both take the unperturbed parameters as plain
//! arguments, one per leaf in [`crate::es::leaf_infos`] order, and run on one device.

use crate::builder::{Module, TensorType};
use crate::es::{EsError, LeafInfo, ModelParams};

use super::policy::Policy;
use super::Control;

/// Declares one f32 argument per leaf, named by its path.
fn declare_leaves(
    f: &crate::builder::Func,
    leaves: &[LeafInfo],
) -> Result<ModelParams<'static>, EsError> {
    let mut values = Vec::with_capacity(leaves.len());
    for l in leaves {
        values.push((l.path.clone(), f.arg(&l.path, TensorType::f32(&l.shape))?));
    }
    Ok(ModelParams::plain(values))
}

/// `(leaves…, reset f32[E, S]) → returns f32[E]`: the policy's return in each episode of
/// `control` (its rollout loop, masking and rewards exactly as in the generation program).
pub fn returns_program(control: &Control, leaves: &[LeafInfo]) -> Result<Module, EsError> {
    let mut m = Module::new("rollout");
    let f = m.func("main");
    let p = declare_leaves(&f, leaves)?;
    let shape = [control.episodes() as i64, control.env().state_dim() as i64];
    let reset = f.arg("reset", TensorType::f32(&shape))?;
    let returns = control.returns(&p, &reset)?;
    f.output(returns.value())?;
    m.add(f.finish()?)?;
    Ok(m)
}

/// `(leaves…, obs f32[B, widths[0]]) → actions f32[B, widths.last()]`: one step of the
/// policy of layer `widths` for a batch of `batch` observations.
pub fn policy_program(
    widths: &[usize],
    leaves: &[LeafInfo],
    batch: usize,
) -> Result<Module, EsError> {
    let (Some(&obs), true) = (widths.first(), widths.len() >= 2) else {
        return Err(EsError::Invalid {
            message: format!("a policy of widths {widths:?}"),
            fix: "give the observation size, the hidden sizes and the action size".into(),
        });
    };
    let mut m = Module::new("policy");
    let f = m.func("main");
    let p = declare_leaves(&f, leaves)?;
    let x = f.arg("obs", TensorType::f32(&[batch as i64, obs as i64]))?;
    let policy = Policy::read(&p, widths.len() - 1)?;
    f.output(&policy.act(&x)?)?;
    m.add(f.finish()?)?;
    Ok(m)
}
