//! The policy step of a control problem whose environment runs outside the program (a
//! MuJoCo model on the host): every member's policy on its own observations, one step.
//!
//! The input `obs f32[n, E, obs]` holds the observations of all `n × E` episodes (member
//! `i`'s rows at `i`); member `i` evaluates its perturbed policy on its `E` rows, giving
//! `action f32[E, act]`. The policy is the in-program problem's ([`super::policy`]).

use crate::builder::{TensorType, Value};
use crate::es::{EsError, MemberInfo, MemberOutputs, Model, ModelParams};
use crate::nn::Act;

use super::policy::Policy;
use super::Fitness;

/// One policy step for `members × episodes` host episodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicyStep {
    widths: Vec<usize>,
    members: usize,
    episodes: usize,
    fitness: Fitness,
}

impl PolicyStep {
    /// The step of a policy of layer `widths` (observation, hidden, action) for `members`
    /// members playing `episodes` episodes each.
    pub fn new(widths: &[usize], members: usize, episodes: usize) -> Result<PolicyStep, EsError> {
        if widths.len() < 2 || widths.contains(&0) || members == 0 || episodes == 0 {
            return Err(EsError::Invalid {
                message: format!(
                    "a policy step of widths {widths:?} for {members} members × {episodes} \
                     episodes"
                ),
                fix: "give positive observation, hidden and action sizes, members and episodes"
                    .into(),
            });
        }
        Ok(PolicyStep {
            widths: widths.to_vec(),
            members,
            episodes,
            fitness: Fitness::Mean,
        })
    }

    /// The same step with the host fitness `fitness`: [`Fitness::PerEpisode`] makes the
    /// tell program paired with it take `E` columns ([`Model::tasks`]).
    pub fn with_fitness(mut self, fitness: Fitness) -> PolicyStep {
        self.fitness = fitness;
        self
    }

    /// The policy's widths.
    pub fn widths(&self) -> &[usize] {
        &self.widths
    }

    /// Members `n`.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Episodes per member `E`.
    pub fn episodes(&self) -> usize {
        self.episodes
    }

    /// Observation size.
    pub fn obs_dim(&self) -> usize {
        self.widths[0]
    }

    /// Action size.
    pub fn action_dim(&self) -> usize {
        self.widths[self.widths.len() - 1]
    }

    /// The observation input's type, `f32[n, E, obs]`.
    pub fn obs_type(&self) -> TensorType {
        TensorType::f32(&[
            self.members as i64,
            self.episodes as i64,
            self.obs_dim() as i64,
        ])
    }

    /// The actions `[C, E, act]` of a chunk of members (global ids `ids u32[C]`) under
    /// their parameters `p`, from all observations `obs f32[n, E, obs]`.
    pub fn actions(&self, p: &ModelParams, obs: &Value, ids: &Value) -> Result<Act, EsError> {
        let (e, k) = (self.episodes as i64, self.obs_dim() as i64);
        let c = ids.shape()[0];
        let f = obs.func();
        // A chunk's members are consecutive (the outputs program hands out member ids in
        // blocks), so their rows are one slice starting at the first id.
        let zero = f.scalar(0i32)?;
        let first = ids
            .slice_in_dim(0, 1, 0)?
            .reshape(&[])?
            .convert(crate::builder::DType::I32)?;
        let mine = obs.dynamic_slice(&[&first, &zero, &zero], &[c, e, k])?;
        let policy = Policy::read(p, self.widths.len() - 1)?;
        let act = match policy.members() {
            Some(_) => policy.act(&mine)?,
            // Plain parameters: the chunk's rows as one batch.
            None => {
                let flat = mine.reshape(&[c * e, k])?;
                policy
                    .act(&flat)?
                    .reshape(&[c, e, self.action_dim() as i64])?
            }
        };
        Ok(Act::per_member(act)?)
    }
}

impl Model for PolicyStep {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        vec![("obs".into(), self.obs_type())]
    }

    /// A policy step has no loss: the return comes from the host simulations.
    fn loss(&self, _: &ModelParams, _: &[Value]) -> Result<Act, EsError> {
        Err(EsError::Invalid {
            message: "a control problem on an MJCF model has no loss inside the program (its \
                      episodes run on the host)"
                .into(),
            fix: "train it with shardes::host_control (`shardes run` does); its program is the \
                  policy step"
                .into(),
        })
    }

    fn tasks(&self) -> usize {
        match self.fitness {
            Fitness::PerEpisode => self.episodes,
            Fitness::Mean => 1,
        }
    }

    fn member_bytes(&self) -> Option<usize> {
        MemberOutputs::member_bytes(self)
    }
}

impl MemberOutputs for PolicyStep {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        vec![("obs".into(), self.obs_type())]
    }

    /// `action f32[E, act]` per member.
    fn output_types(&self) -> Vec<(String, TensorType)> {
        vec![(
            "action".into(),
            TensorType::f32(&[self.episodes as i64, self.action_dim() as i64]),
        )]
    }

    fn outputs(
        &self,
        params: &ModelParams,
        inputs: &[Value],
        member: &MemberInfo,
    ) -> Result<Vec<Act>, EsError> {
        let [obs] = inputs else {
            return Err(EsError::Invalid {
                message: format!("the policy step takes 1 input, got {}", inputs.len()),
                fix: "pass the observations f32[n, E, obs]".into(),
            });
        };
        Ok(vec![self.actions(params, obs, &member.ids)?])
    }

    /// The widest activation: `E` episodes × the widest layer, f32.
    fn member_bytes(&self) -> Option<usize> {
        let widest = self.widths.iter().copied().max().unwrap_or(1);
        Some(self.episodes * widest * 4)
    }
}
