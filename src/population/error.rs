//! [`PopulationError`]: what a population refuses, by kind, so that a caller can match on
//! it (a fitness of the wrong length, a group it was not built for, inputs that do not
//! fit its program).

use thiserror::Error;

/// What a [`super::Population`] refuses.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PopulationError {
    /// A tell got a fitness that is not one value per member and column.
    #[error(
        "tell got {got} fitness values but the population has n = {n} members × {columns} \
         columns = {}; pass one value per member and column, in member order",
        n * columns
    )]
    FitnessCount {
        /// Values given.
        got: usize,
        /// The population's size (every process's members).
        n: usize,
        /// Fitness columns per member.
        columns: usize,
    },
    /// A process's own fitness (before the gather) is not one value per own member and
    /// column.
    #[error(
        "process {process} got {got} fitness values for its {members} members × {columns} \
         columns = {}; pass one value per own member (and column), in member order",
        members * columns
    )]
    OwnFitnessCount {
        /// The process's rank.
        process: usize,
        /// Values given.
        got: usize,
        /// This process's members.
        members: usize,
        /// Fitness columns per member.
        columns: usize,
    },
    /// A population built for one place in a group was stepped or told in another.
    #[error(
        "this population is process {rank} of {processes} but was told as process {told_rank} \
         of {told_processes}; {}",
        if *processes == 1 {
            "build the population for the group it runs in (`placed` with `Place::Group`)"
        } else {
            "build it with the group it is stepped with (Distributed::part())"
        }
    )]
    WrongGroup {
        /// The rank it was built for.
        rank: usize,
        /// The group size it was built for.
        processes: usize,
        /// The rank it was told as.
        told_rank: usize,
        /// The group size it was told in.
        told_processes: usize,
    },
    /// A population whose program applies the update itself was told a fitness.
    #[error(
        "this population's program applies the update itself; step it instead of telling it \
         a fitness"
    )]
    UpdatesItself,
    /// `per_dispatch` generations per dispatch is not a positive 32-bit count.
    #[error("{0} generations per dispatch; use between 1 and 2^32 − 1")]
    PerDispatch(usize),
    /// `step_many(k)` with `k` not a positive multiple of the generations per dispatch.
    #[error(
        "step_many({k}): this trainer runs {per} generations per dispatch; ask for a positive \
         multiple of {per}"
    )]
    StepMany {
        /// Generations asked for.
        k: usize,
        /// Generations per dispatch.
        per: usize,
    },
    /// An outputs program got another number of inputs than it takes.
    #[error("the outputs program takes {want} inputs ({types}) but {got} were given")]
    InputCount {
        /// Inputs it takes.
        want: usize,
        /// Their names and types.
        types: String,
        /// Inputs given.
        got: usize,
    },
    /// An input whose type or shape is not the program's.
    #[error("input `{name}` is {got} but the program expects {want}")]
    InputType {
        /// The input's name.
        name: String,
        /// What was given (element type, dimensions, value count).
        got: String,
        /// The program's type for it.
        want: String,
    },
    /// A program output of an element type the host does not read back.
    #[error(
        "an output of element type {0} cannot be brought back; return f32, i32 or u32 outputs"
    )]
    OutputType(String),
    /// A program compiled over a population's state that is not an outputs program of its
    /// leaves.
    #[error(
        "only an outputs program of this population's leaves runs over its state; build it \
         with ShardedES::outputs_program or plain_outputs_program for the same parameters"
    )]
    ForeignProgram,
    /// A program for another device count than the state's.
    #[error(
        "the program runs on {program} devices but the state is on {state}; build it with an \
         ES of the same device count"
    )]
    DeviceCount {
        /// The program's devices.
        program: usize,
        /// The state's devices.
        state: usize,
    },
    /// Parameters to restart at whose leaves are not the population's.
    #[error(
        "leaf {position} of the parameters to restart at is {got} but this population's is \
         {want}; restart at a tree with the leaves (paths and shapes, in order) it was built \
         with"
    )]
    ForeignLeaf {
        /// The first leaf that differs, in leaf order.
        position: usize,
        /// That leaf of the given tree (`path [shape]`, or `none`).
        got: String,
        /// The population's leaf there (`path [shape]`, or `none`).
        want: String,
    },
    /// A program returned less than its layout promises.
    #[error("{0} returned no {1}")]
    MissingResult(&'static str, &'static str),
}
