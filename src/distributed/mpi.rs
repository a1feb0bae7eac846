//! [`Collectives`] over MPI's world communicator (rsmpi on the system's MPI).
//!
//! MPI is initialized once, with `MPI_THREAD_FUNNELED`: only the thread that created the
//! [`World`] calls MPI (the PJRT plugin's threads never do). It is finalized only after
//! [`Collectives::finish`], which every process calls when they all end together (a run
//! that finished, or a refusal every process agreed on); a process that stops alone on an
//! error exits without finalizing, which `mpirun` and `srun` take as the job failing, and
//! they stop the others (Open MPI's `MPI_Finalize` would wait for peers that are still
//! inside a collective).

use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use super::{Collectives, DistributedError};

/// The processes `mpirun` (or `srun`) started, through MPI.
pub(super) struct World {
    /// Finalizes MPI when dropped; forgotten instead unless `finished`.
    universe: Option<mpi::environment::Universe>,
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    finished: bool,
}

impl Drop for World {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(u) = self.universe.take() {
                std::mem::forget(u);
            }
        }
    }
}

impl World {
    /// Initializes MPI (once per process).
    pub(super) fn init() -> Result<World, DistributedError> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| DistributedError::Mpi("MPI was initialized already".into()))?;
        let world = universe.world();
        let rank = usize::try_from(world.rank())
            .map_err(|_| DistributedError::Mpi("a negative MPI rank".into()))?;
        let size = usize::try_from(world.size())
            .map_err(|_| DistributedError::Mpi("a negative MPI world size".into()))?;
        Ok(World {
            universe: Some(universe),
            world,
            rank,
            size,
            finished: false,
        })
    }
}

/// Refuses a buffer MPI's 32-bit counts cannot describe.
fn fits(len: usize, what: &str) -> Result<(), DistributedError> {
    if i32::try_from(len).is_err() {
        return Err(DistributedError::Collective(format!(
            "{what} of {len} elements exceeds MPI's 32-bit counts"
        )));
    }
    Ok(())
}

impl Collectives for World {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather_f32(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        let mut out = vec![0f32; local.len() * self.size];
        fits(out.len(), "a gather")?;
        self.world.all_gather_into(local, &mut out[..]);
        Ok(out)
    }

    fn all_to_all_f32(&self, send: &[f32]) -> Result<Vec<f32>, DistributedError> {
        if !send.len().is_multiple_of(self.size) {
            return Err(DistributedError::Collective(format!(
                "an all-to-all of {} values over {} processes",
                send.len(),
                self.size
            )));
        }
        fits(send.len(), "an all-to-all")?;
        let mut out = vec![0f32; send.len()];
        self.world.all_to_all_into(send, &mut out[..]);
        Ok(out)
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<u8>, DistributedError> {
        let mut out = vec![0u8; local.len() * self.size];
        fits(out.len(), "a gather")?;
        self.world.all_gather_into(local, &mut out[..]);
        Ok(out)
    }

    fn broadcast_into(&self, data: &mut [u8]) -> Result<(), DistributedError> {
        fits(data.len(), "a broadcast")?;
        self.world.process_at_rank(0).broadcast_into(data);
        Ok(())
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}
