//! One population across processes: `mpirun -np P shardes run`.
//!
//! Every member's noise derives from its global id, so processes need to agree only on
//! what the ids cannot tell them: the fitness values (`how_hosts = A`, `4·n` bytes per
//! generation) or, in addition, one parameter-sized sum (`how_hosts = B`). Process `p` of
//! `P` evaluates the global members `[p·n/P, (p+1)·n/P)` on its own devices
//! ([`shardes_hlo::es::Part`]); a [`crate::Population`] built for a process
//! (`placed` with `Place::Group`) runs the generation as the programs of [`shardes_hlo::es::processes`]
//! with a [`Distributed`] between them.
//!
//! [`Distributed`] is the group of processes: rank and size, and the few collectives a run
//! needs, each with a result that is the same bits on every process:
//! - [`Distributed::gather_fitness`]: every process's values in rank order (which is member
//!   order), for the fitness and for rewards a reward loop computes per process;
//! - [`Distributed::sum_in_rank_order`]: a sum across processes added in a fixed order
//!   (process 0's values, then 1's, ...; each process's own parts in order), where MPI's
//!   own reductions leave the order open;
//! - [`Distributed::agree`]: a hash compared across processes (the config at start, the
//!   parameters every few generations), refusing with a message that names what differs;
//! - [`Distributed::broadcast_bytes`] and [`Distributed::broadcast_params`]: process 0's
//!   data (a resumed checkpoint) on every process.
//!
//! The group comes from MPI ([`Distributed::from_env`] with the cargo feature `mpi`, under
//! `mpirun` or `srun`), is a single process ([`Distributed::single`]), or is made of threads
//! of one process ([`threads::run`], for tests). A collective that waits longer than the
//! timeout ([`Distributed::with_timeout`]) ends the process: with a dead peer, a blocking MPI
//! call would otherwise never return.

#[cfg(feature = "mpi")]
mod mpi;
pub mod threads;
pub(crate) mod update;

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardes_hlo::es::Part;
use shardes_hlo::params::{Array, ParamTree};

/// What can go wrong between processes.
#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// Processes that must agree do not: `what` (the config, the parameters at a
    /// generation) hashes differently on the processes listed.
    #[error(
        "the processes disagree on {what}: process {rank} has {mine:016x}, process {other} \
         has {theirs:016x}; {hint}"
    )]
    Mismatch {
        /// What was compared, e.g. `the config` or `the parameters at generation 20`.
        what: String,
        /// This process's rank.
        rank: usize,
        /// This process's hash.
        mine: u64,
        /// The first process whose hash differs from process 0's (or 0 where this one does).
        other: usize,
        /// Its hash.
        theirs: u64,
        /// What to do about it.
        hint: String,
    },
    /// A collective was called with data that does not fit it.
    #[error("{0}")]
    Collective(String),
    /// The MPI library could not start.
    #[error("MPI: {0}")]
    Mpi(String),
}

/// The collectives a [`Distributed`] group is built on: blocking, called by every process
/// in the same order, each process's data the same length unless stated.
pub trait Collectives {
    /// This process's rank, `0..size`.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// Every process's `local` (the same length everywhere), concatenated in rank order.
    fn all_gather_f32(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError>;
    /// `send` is `size` blocks of equal length, block `q` for process `q`; returns the
    /// blocks every process sent to this one, in rank order.
    fn all_to_all_f32(&self, send: &[f32]) -> Result<Vec<f32>, DistributedError>;
    /// Every process's `local` bytes (the same length everywhere), in rank order.
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<u8>, DistributedError>;
    /// Process 0's `data` into every process's `data` (the same length everywhere).
    fn broadcast_into(&self, data: &mut [u8]) -> Result<(), DistributedError>;
    /// Marks the group as ending together, on every process: MPI is finalized when the
    /// group is dropped, which otherwise it is not (see [`Distributed::finish`]).
    fn finish(&mut self) {}
    /// A lock every process of the group must hold while its devices run a program, where
    /// the processes share one address space: XLA:CPU's collectives inside a program meet
    /// in a process-wide rendezvous keyed by device and run, which two clients running the
    /// same program at once would share ([`threads`]). `None` for separate processes.
    fn device_lock(&self) -> Option<Arc<Mutex<()>>> {
        None
    }
}

/// One process on its own: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct Single;

impl Collectives for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather_f32(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        Ok(local.to_vec())
    }
    fn all_to_all_f32(&self, send: &[f32]) -> Result<Vec<f32>, DistributedError> {
        Ok(send.to_vec())
    }
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<u8>, DistributedError> {
        Ok(local.to_vec())
    }
    fn broadcast_into(&self, _data: &mut [u8]) -> Result<(), DistributedError> {
        Ok(())
    }
}

/// The collective in progress (what, since when), watched by the timeout thread.
type InFlight = Arc<Mutex<Option<(String, Instant)>>>;

/// The largest piece [`Distributed::broadcast_bytes`] sends at once: MPI counts are 32-bit.
const BROADCAST_PIECE: usize = 1 << 30;

/// A group of processes running one population (see the module docs).
pub struct Distributed {
    comm: Box<dyn Collectives>,
    in_flight: InFlight,
    /// Whether a timeout thread watches `in_flight`.
    watched: bool,
}

impl std::fmt::Debug for Distributed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Distributed")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl Distributed {
    /// One process on its own.
    pub fn single() -> Distributed {
        Distributed::new(Box::new(Single))
    }

    /// A group over `comm`.
    pub fn new(comm: Box<dyn Collectives>) -> Distributed {
        Distributed {
            comm,
            in_flight: Arc::new(Mutex::new(None)),
            watched: false,
        }
    }

    /// The group this process was started in: MPI's world when it was launched by
    /// `mpirun`, `mpiexec` or `srun` (and the crate has the feature `mpi`), otherwise one
    /// process on its own. Launched by MPI without the feature, it refuses to run, since
    /// every process would run the whole population on its own.
    pub fn from_env() -> Result<Distributed, DistributedError> {
        let launched = launcher_size();
        #[cfg(feature = "mpi")]
        if launched.is_some() {
            return Ok(Distributed::new(Box::new(mpi::World::init()?)));
        }
        match launched {
            Some(size) if size > 1 => Err(DistributedError::Mpi(format!(
                "started as one of {size} MPI processes, but this build has no MPI support; \
                 build with `cargo build --release -p shardes-cli --features mpi`"
            ))),
            _ => Ok(Distributed::single()),
        }
    }

    /// Ends this process (exit code 1, after a message naming the collective) when a
    /// collective waits longer than `timeout`: a peer that died or hangs would otherwise
    /// block the others forever. `on_timeout` ends the process (after the message); it
    /// must not return.
    pub fn with_timeout(mut self, timeout: Duration, on_timeout: fn() -> !) -> Distributed {
        if self.watched || self.size() == 1 {
            return self;
        }
        let watch = Arc::clone(&self.in_flight);
        let rank = self.rank();
        let spawned = std::thread::Builder::new()
            .name("shardes-mpi-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(200));
                let late = watch
                    .lock()
                    .ok()
                    .and_then(|g| g.as_ref().map(|(what, t)| (what.clone(), t.elapsed())));
                if let Some((what, waited)) = late.filter(|(_, w)| *w > timeout) {
                    eprintln!(
                        "error: process {rank}: {what} waited {:.0} s for the other processes \
                         (timeout {:.0} s); one of them has stopped or hangs, stopping too",
                        waited.as_secs_f64(),
                        timeout.as_secs_f64()
                    );
                    on_timeout();
                }
            });
        self.watched = spawned.is_ok();
        self
    }

    /// Ends the group on every process together (a run that finished, or a refusal every
    /// process reached): MPI is finalized. A process that stops on its own (an error
    /// only it saw) drops the group without this, so that it exits at once and the
    /// launcher stops the others, where finalizing would wait for them.
    pub fn finish(mut self) {
        // Finalizing waits for every process; watched like a collective, so a peer that
        // never gets there cannot keep this one alive past the timeout.
        if self.watched {
            if let Ok(mut g) = self.in_flight.lock() {
                *g = Some(("finalizing MPI".to_string(), Instant::now()));
            }
        }
        self.comm.finish();
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Whether this is process 0, the one that prints and writes the out directory.
    pub fn is_lead(&self) -> bool {
        self.rank() == 0
    }

    /// The lock of [`Collectives::device_lock`], if the group needs one.
    pub(crate) fn device_lock(&self) -> Option<Arc<Mutex<()>>> {
        self.comm.device_lock()
    }

    /// This process's place in the group, for the programs.
    pub fn part(&self) -> Part {
        Part {
            rank: self.rank(),
            processes: self.size(),
        }
    }

    /// The global ids of the members this process evaluates out of `n`.
    pub fn members(&self, n: usize) -> Range<usize> {
        self.part().members(n)
    }

    /// Runs `f` on the collectives, marked in flight for the timeout thread.
    fn guarded<T>(
        &self,
        what: &str,
        f: impl FnOnce(&dyn Collectives) -> Result<T, DistributedError>,
    ) -> Result<T, DistributedError> {
        if self.watched {
            if let Ok(mut g) = self.in_flight.lock() {
                *g = Some((what.to_string(), Instant::now()));
            }
        }
        let out = f(self.comm.as_ref());
        if self.watched {
            if let Ok(mut g) = self.in_flight.lock() {
                *g = None;
            }
        }
        out
    }

    /// Every process's fitness (or rewards) in rank order, which is global member order:
    /// each process passes its own members' values (`members(n).len()` per task column,
    /// row-major), all the same length.
    pub fn gather_fitness(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        self.guarded("the fitness gather", |c| c.all_gather_f32(local))
    }

    /// The elementwise sum of every process's `local` values, added in a fixed order on
    /// every process, so that every process gets the same bits: `local` holds `parts`
    /// vectors of equal length (the same `parts` and length everywhere), and the sum is
    /// `((x₀,₀ + x₀,₁) + … + x₁,₀) + …` over processes in rank order and each process's
    /// parts in order. With one part per device, that is the order in which one process's
    /// all-reduce adds its devices' values, so the sum has the bits of one process with
    /// every process's devices.
    ///
    /// Each process adds one `1/P` slice of the values from every process and the sums
    /// are then gathered: each process sends about `(parts + 1)·(P−1)/P` times its vector,
    /// where gathering every process's parts would move `parts·(P−1)` times it.
    pub fn sum_in_rank_order(
        &self,
        local: &[f32],
        parts: usize,
    ) -> Result<Vec<f32>, DistributedError> {
        let parts = parts.max(1);
        if !local.len().is_multiple_of(parts) {
            return Err(DistributedError::Collective(format!(
                "{} values do not split into {parts} parts",
                local.len()
            )));
        }
        let len = local.len() / parts;
        let add = |acc: &mut Vec<f32>, part: &[f32]| {
            for (a, v) in acc.iter_mut().zip(part) {
                *a += *v;
            }
        };
        let p = self.size();
        if p == 1 {
            let mut acc = local[..len].to_vec();
            for part in local.chunks_exact(len.max(1)).skip(1) {
                add(&mut acc, part);
            }
            return Ok(acc);
        }
        // Block k (for process k): slice k of every part, padded to `slice` values.
        let slice = len.div_ceil(p);
        let mut send = vec![0f32; p * parts * slice];
        for k in 0..p {
            for i in 0..parts {
                let (lo, hi) = ((k * slice).min(len), ((k + 1) * slice).min(len));
                let at = (k * parts + i) * slice;
                send[at..at + hi - lo].copy_from_slice(&local[i * len + lo..i * len + hi]);
            }
        }
        let blocks = self.guarded("the update exchange", |c| c.all_to_all_f32(&send))?;
        let mut mine = blocks[..slice].to_vec();
        for part in blocks.chunks_exact(slice).skip(1) {
            add(&mut mine, part);
        }
        let mut all = self.guarded("the update exchange", |c| c.all_gather_f32(&mine))?;
        all.truncate(len);
        Ok(all)
    }

    /// Waits until every process has called it (a one-byte gather).
    pub fn barrier(&self) -> Result<(), DistributedError> {
        self.guarded("a barrier", |c| c.all_gather_bytes(&[0]))?;
        Ok(())
    }

    /// Every process's `value`, in rank order.
    pub fn gather_u64(&self, value: u64) -> Result<Vec<u64>, DistributedError> {
        let bytes = self.guarded("a consistency check", |c| {
            c.all_gather_bytes(&value.to_le_bytes())
        })?;
        Ok(bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect())
    }

    /// Refuses unless every process's `hash` of `what` is the same (every process gets the
    /// same verdict, naming the first process that differs from process 0).
    pub fn agree(&self, what: &str, hash: u64, hint: &str) -> Result<(), DistributedError> {
        let all = self.gather_u64(hash)?;
        match all.iter().position(|h| *h != all[0]) {
            None => Ok(()),
            Some(other) => Err(DistributedError::Mismatch {
                what: what.to_string(),
                rank: self.rank(),
                mine: hash,
                other: if self.rank() == other { 0 } else { other },
                theirs: if self.rank() == other {
                    all[0]
                } else {
                    all[other]
                },
                hint: hint.to_string(),
            }),
        }
    }

    /// Process 0's `data` on every process (the others' `data` is ignored).
    pub fn broadcast_bytes(&self, data: Vec<u8>) -> Result<Vec<u8>, DistributedError> {
        if self.size() == 1 {
            return Ok(data);
        }
        let mut len = (data.len() as u64).to_le_bytes();
        self.guarded("a broadcast", |c| c.broadcast_into(&mut len))?;
        let len = usize::try_from(u64::from_le_bytes(len))
            .map_err(|_| DistributedError::Collective("a broadcast too large".into()))?;
        let mut out = if self.is_lead() { data } else { vec![0; len] };
        for piece in out.chunks_mut(BROADCAST_PIECE) {
            self.guarded("a broadcast", |c| c.broadcast_into(piece))?;
        }
        Ok(out)
    }

    /// Process 0's parameters on every process, in the shapes of `template` (every
    /// process's own parameters of the same tree).
    pub fn broadcast_params(&self, params: &ParamTree) -> Result<ParamTree, DistributedError> {
        if self.size() == 1 {
            return Ok(params.clone());
        }
        let bytes: Vec<u8> = params
            .leaves()
            .into_iter()
            .flat_map(|(_, a)| a.data().iter().flat_map(|x| x.to_le_bytes()))
            .collect();
        let bytes = self.broadcast_bytes(bytes)?;
        let mut values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut leaves = Vec::new();
        for (path, a) in params.leaves() {
            let data: Vec<f32> = values.by_ref().take(a.data().len()).collect();
            if data.len() != a.data().len() {
                return Err(DistributedError::Collective(format!(
                    "process 0's parameters end before leaf `{path}`; every process must \
                     build the same parameter tree"
                )));
            }
            leaves.push(
                Array::new(a.shape().to_vec(), data)
                    .map_err(|e| DistributedError::Collective(e.to_string()))?,
            );
        }
        ParamTree::from_leaves(params, leaves)
            .map_err(|e| DistributedError::Collective(e.to_string()))
    }
}

/// A 64-bit digest of a parameter tree's paths, shapes and bits (the first 8 bytes of its
/// sha256), for [`Distributed::agree`].
pub fn params_digest(params: &ParamTree) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (path, a) in params.leaves() {
        h.update(path.as_bytes());
        for d in a.shape() {
            h.update((*d as u64).to_le_bytes());
        }
        for x in a.data() {
            h.update(x.to_bits().to_le_bytes());
        }
    }
    digest_u64(&h.finalize())
}

/// A 64-bit digest of `bytes` (the first 8 bytes of their sha256).
pub fn bytes_digest(bytes: &[u8]) -> u64 {
    use sha2::{Digest, Sha256};
    digest_u64(&Sha256::digest(bytes))
}

fn digest_u64(d: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&d[..8]);
    u64::from_le_bytes(w)
}

/// The process count an MPI launcher announced in the environment, if one started this
/// process: Open MPI's `OMPI_COMM_WORLD_SIZE`, MPICH's and Slurm PMI's `PMI_SIZE`, or PMIx's
/// `PMIX_RANK` (size unknown until MPI starts: reported as 0).
pub fn launcher_size() -> Option<usize> {
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        if let Some(n) = std::env::var(var).ok().and_then(|v| v.parse().ok()) {
            return Some(n);
        }
    }
    std::env::var_os("PMIX_RANK").map(|_| 0)
}

#[cfg(test)]
mod tests;
