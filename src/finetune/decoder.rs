//! A decode population as the reward loop's [`Sampler`].

use std::ops::Range;

use crate::decode::{Decode, PopulationDecoder};
use crate::hlo::params::ParamTree;
use crate::population::Core;
use crate::Error;

use super::Sampler;

/// A decode population's state and programs, borrowed apart: what an evaluator that holds
/// the [`Decode`] programs (while the population holds the state) hands the reward loop.
pub(crate) struct Decoding<'a> {
    pub(crate) core: &'a Core,
    pub(crate) decode: &'a Decode,
}

impl Sampler for Decoding<'_> {
    fn generation(&self) -> u32 {
        self.core.generation()
    }

    fn members(&self) -> Range<usize> {
        self.core.members()
    }

    fn decode(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<Vec<u32>>>, Error> {
        Ok(self.decode.decode(self.core, prompts)?.tokens)
    }

    /// Any number of prompts, in batches of the compiled size.
    fn decode_plain(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
        let b = self.decode.config().evaluation().batch.max(1);
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(b) {
            out.extend(self.decode.decode_plain(self.core, chunk)?);
        }
        Ok(out)
    }

    fn params(&self) -> Result<ParamTree, Error> {
        self.core.params()
    }
}

impl Sampler for PopulationDecoder {
    fn generation(&self) -> u32 {
        self.core().generation()
    }

    fn members(&self) -> Range<usize> {
        self.core().members()
    }

    fn decode(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<Vec<u32>>>, Error> {
        self.view().decode(prompts)
    }

    fn decode_plain(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
        self.view().decode_plain(prompts)
    }

    fn params(&self) -> Result<ParamTree, Error> {
        self.core().params()
    }
}

impl PopulationDecoder {
    /// The state and programs as a [`Sampler`] view.
    fn view(&self) -> Decoding<'_> {
        Decoding {
            core: self.core(),
            decode: self.evaluator(),
        }
    }
}
