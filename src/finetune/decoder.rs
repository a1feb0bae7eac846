//! [`PopulationDecoder`] as the reward loop's [`Sampler`].

use std::ops::Range;

use crate::decode::PopulationDecoder;
use crate::distributed::Distributed;
use crate::hlo::params::{Array, ParamTree};
use crate::split::HostFitness;
use crate::Error;

use super::Sampler;

impl Sampler for PopulationDecoder {
    fn population(&self) -> usize {
        self.n()
    }

    fn generation(&self) -> u32 {
        PopulationDecoder::generation(self)
    }

    fn decode(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<Vec<u32>>>, Error> {
        Ok(PopulationDecoder::decode(self, prompts)?.tokens)
    }

    /// Any number of prompts, in batches of the compiled size.
    fn decode_plain(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
        let b = self.config().evaluation().batch.max(1);
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(b) {
            out.extend(PopulationDecoder::decode_plain(self, chunk)?);
        }
        Ok(out)
    }

    fn tell(&mut self, fitness: Vec<f32>) -> Result<(), Error> {
        PopulationDecoder::tell(self, &HostFitness::F32(fitness))
    }

    fn params(&self) -> Result<ParamTree, Error> {
        PopulationDecoder::params(self)
    }

    fn members(&self) -> Range<usize> {
        PopulationDecoder::members(self)
    }

    fn tell_in(&mut self, dist: &Distributed, fitness: Vec<f32>) -> Result<(), Error> {
        PopulationDecoder::tell_in(self, dist, &HostFitness::F32(fitness))
    }

    fn optimizer_state(&self) -> Result<Vec<(String, Array)>, Error> {
        PopulationDecoder::optimizer_state(self)
    }

    fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<(), Error> {
        PopulationDecoder::set_optimizer_state(self, tensors)
    }
}
