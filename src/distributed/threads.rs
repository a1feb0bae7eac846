//! A group of processes made of threads of this one: [`run`]`(P, f)` runs `f` on `P`
//! threads, each with its own [`Distributed`] handle, whose collectives meet in memory. It
//! runs the code paths of a run across processes without MPI (tests, and trying a reward
//! loop).

use std::sync::{Arc, Barrier, Mutex};

use super::{Collectives, Distributed, DistributedError};

/// What the members of a group share: one slot per rank and a barrier.
struct Shared {
    size: usize,
    barrier: Barrier,
    slots: Mutex<Vec<Vec<u8>>>,
    /// Held while a member's devices run a program ([`Collectives::device_lock`]).
    devices: Arc<Mutex<()>>,
}

/// One member of a thread group.
struct Member {
    rank: usize,
    shared: Arc<Shared>,
}

/// Runs `f` on `size` threads, each given the handle of its rank in one group, and returns
/// their results in rank order. A panic on one thread is resumed here once the others end;
/// the others must not wait for it in a collective (they would wait forever), so `f`
/// should fail with an error rather than panic where its peers go on.
pub fn run<T: Send>(size: usize, f: impl Fn(Distributed) -> T + Sync) -> Vec<T> {
    let size = size.max(1);
    let shared = Arc::new(Shared {
        size,
        barrier: Barrier::new(size),
        slots: Mutex::new(vec![Vec::new(); size]),
        devices: Arc::new(Mutex::new(())),
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (f, shared) = (&f, Arc::clone(&shared));
                s.spawn(move || f(Distributed::new(Box::new(Member { rank, shared }))))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

impl Member {
    /// Puts `mine` in this rank's slot, lets `read` see every slot once all have written,
    /// and waits until everyone has read before a slot can be written again.
    fn exchange<T>(
        &self,
        mine: Vec<u8>,
        read: impl FnOnce(&[Vec<u8>]) -> T,
    ) -> Result<T, DistributedError> {
        let poisoned = || DistributedError::Collective("a thread of the group panicked".into());
        self.shared.slots.lock().map_err(|_| poisoned())?[self.rank] = mine;
        self.shared.barrier.wait();
        let out = read(&self.shared.slots.lock().map_err(|_| poisoned())?);
        self.shared.barrier.wait();
        Ok(out)
    }
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

impl Collectives for Member {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_gather_f32(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        self.exchange(to_bytes(local), |slots| {
            slots.iter().flat_map(|s| to_f32(s)).collect()
        })
    }

    fn all_to_all_f32(&self, send: &[f32]) -> Result<Vec<f32>, DistributedError> {
        let p = self.shared.size;
        if !send.len().is_multiple_of(p) {
            return Err(DistributedError::Collective(format!(
                "an all-to-all of {} values over {p} processes",
                send.len()
            )));
        }
        let block = send.len() / p * 4;
        let rank = self.rank;
        self.exchange(to_bytes(send), |slots| {
            slots
                .iter()
                .flat_map(|s| to_f32(&s[rank * block..(rank + 1) * block]))
                .collect()
        })
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<u8>, DistributedError> {
        self.exchange(local.to_vec(), |slots| slots.concat())
    }

    fn broadcast_into(&self, data: &mut [u8]) -> Result<(), DistributedError> {
        let mine = if self.rank == 0 {
            data.to_vec()
        } else {
            Vec::new()
        };
        let root = self.exchange(mine, |slots| slots[0].clone())?;
        if root.len() != data.len() {
            return Err(DistributedError::Collective(format!(
                "a broadcast of {} bytes into {}",
                root.len(),
                data.len()
            )));
        }
        data.copy_from_slice(&root);
        Ok(())
    }

    fn device_lock(&self) -> Option<Arc<Mutex<()>>> {
        Some(Arc::clone(&self.shared.devices))
    }
}
