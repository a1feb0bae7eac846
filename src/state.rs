//! ES state on the devices, held by every [`crate::Population`].
//!
//! Parameters, key, generation and the optimizer's state (zero at the start; none under
//! `sgd`) are replicated on each of the ES's devices, as are the batch inputs. A program's [`Layout`] orders its arguments and results:
//! [`DeviceState::args_for`] lists a device's arguments for it, and
//! [`DeviceState::absorb_for`] takes the new state from its results and hands back the
//! fitness.

use std::borrow::Cow;

use shardes_hlo::es::{Layout, ProgramResults, Slot};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{Buffer, Client, Element, ElementType, Executable};

use crate::dtype::element_type;
use crate::Error;

/// The replicated state of one run.
pub(crate) struct DeviceState {
    /// The layout of the program that takes the batch (generation or ask_apply).
    pub(crate) layout: Layout,
    /// The parameter tree's structure with every leaf empty: what [`DeviceState::params`]
    /// rebuilds the tree on. Not a copy of the parameters, which would hold the model's
    /// size on the host for the whole run.
    skeleton: ParamTree,
    /// `[device][parameter argument]`, in [`Layout::slots`] order (a model's layers held
    /// as `[L, …]` stacks where the layout stacks them).
    params: Vec<Vec<Buffer>>,
    key: Vec<Buffer>,
    generation: Vec<Buffer>,
    /// `[device][batch argument]`.
    batch: Vec<Vec<Buffer>>,
    /// `[device][optimizer state tensor]`, in [`Layout::opt_state`] order.
    opt: Vec<Vec<Buffer>>,
    pub(crate) generation_host: u32,
}

/// Refuses an ES that needs more devices than the client has.
pub(crate) fn check_devices(client: &Client, devices: usize) -> Result<(), Error> {
    if client.device_count() < devices {
        return Err(Error::Invalid(format!(
            "the ES uses {devices} devices but the client has {}; lower the device count or \
             create the client with more CPU devices",
            client.device_count()
        )));
    }
    Ok(())
}

/// `data` on each of the first `devices` devices.
pub(crate) fn replicate<T: Element>(
    client: &Client,
    data: &[T],
    dims: &[usize],
    devices: usize,
) -> Result<Vec<Buffer>, Error> {
    (0..devices)
        .map(|d| Ok(client.buffer_from_host(data, dims, d)?))
        .collect()
}

/// Integer batch inputs (token ids) arrive as f32 arrays of whole numbers; they convert
/// exactly below 2^24, which is checked.
fn to_i32(name: &str, a: &Array) -> Result<Vec<i32>, Error> {
    a.data()
        .iter()
        .map(|&x| {
            if x.fract() == 0.0 && x.abs() < (1 << 24) as f32 {
                // Whole and below 2^24: the conversion is exact.
                Ok(x as i32)
            } else {
                Err(Error::Invalid(format!(
                    "batch array `{name}` is an integer input but holds {x}; pass whole numbers \
                     below 2^24"
                )))
            }
        })
        .collect()
}

impl DeviceState {
    /// Checks the batch against the layout and uploads everything to the first
    /// `devices` devices.
    pub(crate) fn upload(
        client: &Client,
        devices: usize,
        layout: Layout,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<DeviceState, Error> {
        let leaves = params.leaves().into_iter().map(|(_, a)| Cow::Borrowed(a));
        let skeleton = skeleton_of(params)?;
        let start = (key, batch, generation);
        Self::upload_leaves(client, devices, layout, (skeleton, leaves), start)
    }

    /// [`DeviceState::upload`] consuming `params`: each leaf's host array is freed as soon
    /// as it is on the devices, so the host never holds the tree and its device copies at
    /// once (on the CPU plugin, whose buffers are host memory, the device copies reuse
    /// the freed memory).
    pub(crate) fn upload_taking(
        client: &Client,
        devices: usize,
        layout: Layout,
        params: ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<DeviceState, Error> {
        let skeleton = skeleton_of(&params)?;
        let leaves = into_leaves(params).into_iter().map(Cow::Owned);
        let start = (key, batch, generation);
        Self::upload_leaves(client, devices, layout, (skeleton, leaves), start)
    }

    fn upload_leaves<'a>(
        client: &Client,
        devices: usize,
        layout: Layout,
        (skeleton, leaves): (ParamTree, impl Iterator<Item = Cow<'a, Array>>),
        (key, batch, generation): (Key, &[Array], u32),
    ) -> Result<DeviceState, Error> {
        if batch.len() != layout.batch.len() {
            return Err(Error::Invalid(format!(
                "the model takes {} batch arrays ({}) but {} were given",
                layout.batch.len(),
                layout
                    .batch
                    .iter()
                    .map(|(n, t)| format!("{n}: {t}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                batch.len()
            )));
        }
        let mut batch_dev: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
        for ((name, ty), a) in layout.batch.iter().zip(batch) {
            let want: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
            if a.shape() != want.as_slice() {
                return Err(Error::Invalid(format!(
                    "batch array `{name}` has shape {:?} but the model expects {ty}",
                    a.shape()
                )));
            }
            let bufs = match element_type(ty.dtype) {
                ElementType::F32 => replicate(client, a.data(), a.shape(), devices)?,
                ElementType::S32 => replicate(client, &to_i32(name, a)?, a.shape(), devices)?,
                _ => {
                    return Err(Error::Invalid(format!(
                        "batch array `{name}` has element type {}; batch inputs must be f32 or i32",
                        ty.dtype.mlir()
                    )))
                }
            };
            for (d, b) in bufs.into_iter().enumerate() {
                batch_dev[d].push(b);
            }
        }
        let params_dev = params_on_devices(client, devices, &layout, leaves)?;
        let opt = zero_opt(client, devices, &layout)?;
        let state = DeviceState {
            layout,
            skeleton,
            params: params_dev,
            key: replicate(client, &key.data(), &[2], devices)?,
            generation: replicate(client, &[generation], &[], devices)?,
            batch: batch_dev,
            opt,
            generation_host: generation,
        };
        // The leaves and the batch against the layout, once: every later argument list
        // is built from the same parts.
        for d in 0..devices {
            state.args_for(&state.layout, d, None)?;
        }
        Ok(state)
    }

    /// Devices holding the state.
    pub(crate) fn devices(&self) -> usize {
        self.params.len()
    }

    /// Starts the state again at `params` and `generation`: the parameters and the
    /// generation replaced on every device and the optimizer state zero, which is the state
    /// [`DeviceState::upload`] gives with this state's key and batch (kept on the devices).
    /// `params` must have this state's leaves (paths and shapes, in order), which the
    /// caller checks; nothing changes unless every upload succeeds.
    pub(crate) fn restart(
        &mut self,
        client: &Client,
        params: &ParamTree,
        generation: u32,
    ) -> Result<(), Error> {
        let devices = self.devices();
        let leaves = params.leaves().into_iter().map(|(_, a)| Cow::Borrowed(a));
        let params = params_on_devices(client, devices, &self.layout, leaves)?;
        let opt = zero_opt(client, devices, &self.layout)?;
        let generation_dev = replicate(client, &[generation], &[], devices)?;
        self.params = params;
        self.opt = opt;
        self.generation = generation_dev;
        self.generation_host = generation;
        Ok(())
    }

    /// Device `d`'s arguments for a `layout` program: the state, then the batch, or for a
    /// tell program the `fitness`, then the optimizer state where the program takes it. A
    /// fitness given to a program that takes none is one argument too many, which the
    /// layout refuses.
    pub(crate) fn args_for<'a>(
        &'a self,
        layout: &Layout,
        d: usize,
        fitness: Option<&'a Buffer>,
    ) -> Result<Vec<&'a Buffer>, Error> {
        let tail: Vec<&Buffer> = if layout.fitness_arg().is_some() {
            fitness.into_iter().collect()
        } else {
            self.batch[d].iter().chain(fitness).collect()
        };
        self.args_with(layout, d, tail)
    }

    /// Device `d`'s arguments for a `layout` program: the state, then `tail` (inputs
    /// uploaded per call, such as an outputs program's, or an update program's sums,
    /// [`shardes_hlo::es::ProgramKind::Update`]), then the optimizer state where the
    /// program takes it.
    pub(crate) fn args_with<'a>(
        &'a self,
        layout: &Layout,
        d: usize,
        tail: impl IntoIterator<Item = &'a Buffer>,
    ) -> Result<Vec<&'a Buffer>, Error> {
        let opt = if layout.opt_count() > 0 {
            &self.opt[d][..]
        } else {
            &[]
        };
        Ok(layout.args_with_state(
            &self.params[d],
            &self.key[d],
            &self.generation[d],
            tail,
            opt,
        )?)
    }

    /// Takes each device's results of a `layout` program (which returns the state) as the
    /// new state, advancing the host generation by `advance`, and returns each device's
    /// fitness result (none for a tell program). Nothing changes unless every device's
    /// results fit the layout.
    pub(crate) fn absorb_for(
        &mut self,
        layout: &Layout,
        outs: Vec<Vec<Buffer>>,
        advance: u32,
    ) -> Result<Vec<Option<Buffer>>, Error> {
        let results = split_all(layout, outs)?;
        Ok(self.take(results, advance))
    }

    fn take(&mut self, results: Vec<DeviceResults>, advance: u32) -> Vec<Option<Buffer>> {
        let mut fitness = Vec::with_capacity(results.len());
        for (d, (params, generation, fit, opt)) in results.into_iter().enumerate() {
            self.params[d] = params;
            self.generation[d] = generation;
            if !opt.is_empty() {
                self.opt[d] = opt;
            }
            fitness.push(fit);
        }
        self.generation_host += advance;
        fitness
    }

    /// Runs `exe`, a tell program of `layout`, with every member's fitness `values`
    /// (replicated on each device), and takes its results as the new state: the update
    /// applied, the generation advanced.
    pub(crate) fn tell(
        &mut self,
        client: &Client,
        exe: &Executable,
        layout: &Layout,
        values: &[f32],
    ) -> Result<(), Error> {
        let fit_dev = replicate(client, values, &layout.fitness_dims(), self.devices())?;
        let args: Vec<Vec<&Buffer>> = (0..self.devices())
            .map(|d| self.args_for(layout, d, Some(&fit_dev[d])))
            .collect::<Result<_, _>>()?;
        let outs = exe.execute(&args)?;
        self.absorb_for(layout, outs, 1)?;
        Ok(())
    }

    /// Waits for the last dispatch by reading device 0's generation (one scalar).
    pub(crate) fn sync(&self) -> Result<(), Error> {
        self.generation[0].to_host::<u32>()?;
        Ok(())
    }

    /// Copies the parameters back to the host (from device 0; every device holds the same),
    /// a stack cut into its layers' leaves.
    pub(crate) fn params(&self) -> Result<ParamTree, Error> {
        let layout = &self.layout;
        let mut leaves: Vec<Option<Array>> = vec![None; layout.leaves.len()];
        for (b, slot) in self.params[0].iter().zip(layout.slots()) {
            let data = b.to_host::<f32>()?;
            match *slot {
                Slot::Leaf(p) => {
                    leaves[p] = Some(Array::new(dims_of_leaf(&layout.leaves[p].shape), data)?);
                }
                Slot::Stack(s) => {
                    let st = &layout.stacks[s];
                    let size = count(&st.shape);
                    for (&p, row) in st.positions.iter().zip(data.chunks(size.max(1))) {
                        leaves[p] = Some(Array::new(dims_of_leaf(&st.shape), row.to_vec())?);
                    }
                }
            }
        }
        let leaves = leaves
            .into_iter()
            .collect::<Option<Vec<Array>>>()
            .ok_or_else(|| {
                Error::Invalid(
                    "the devices' parameters do not cover every leaf of the layout; report this"
                        .into(),
                )
            })?;
        if leaves.len() != self.skeleton.num_leaves() {
            return Err(Error::Invalid(format!(
                "the devices hold {} leaves but the parameter tree has {}",
                leaves.len(),
                self.skeleton.num_leaves()
            )));
        }
        let mut it = leaves.into_iter();
        // The counts agree (checked above), so every empty leaf finds its array.
        Ok(self
            .skeleton
            .map_leaves(|_, empty| it.next().unwrap_or_else(|| empty.clone())))
    }

    /// Copies the optimizer's state back to the host (from device 0), named as in
    /// [`Layout::opt_state`]; empty under `sgd`.
    pub(crate) fn opt_state(&self) -> Result<Vec<(String, Array)>, Error> {
        let mut out = Vec::with_capacity(self.layout.opt_state.len());
        for ((name, ty), b) in self.layout.opt_state.iter().zip(&self.opt[0]) {
            out.push((name.clone(), Array::new(dims_of(ty), b.to_host::<f32>()?)?));
        }
        Ok(out)
    }

    /// Replaces the optimizer's state on every device with `tensors` (e.g. a checkpoint's):
    /// exactly the names and shapes of [`Layout::opt_state`], in any order. Nothing changes
    /// unless all of them fit.
    pub(crate) fn set_opt_state(
        &mut self,
        client: &Client,
        tensors: &[(String, Array)],
    ) -> Result<(), Error> {
        let want = &self.layout.opt_state;
        let names = || {
            want.iter()
                .map(|(n, t)| format!("{n}: {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if tensors.len() != want.len() {
            return Err(Error::Invalid(format!(
                "the optimizer state has {} tensors but this ES's optimizer keeps {} ({}); \
                 resume with the optimizer the state was written by",
                tensors.len(),
                want.len(),
                if want.is_empty() {
                    "none".into()
                } else {
                    names()
                }
            )));
        }
        let devices = self.devices();
        let mut opt: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
        for (name, ty) in want {
            let a = tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, a)| a)
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "the optimizer state has no tensor `{name}` (this ES's optimizer keeps {}); \
                         resume with the optimizer the state was written by",
                        names()
                    ))
                })?;
            let dims = dims_of(ty);
            if a.shape() != dims.as_slice() {
                return Err(Error::Invalid(format!(
                    "optimizer state tensor `{name}` has shape {:?} but the optimizer keeps {ty}",
                    a.shape()
                )));
            }
            for (d, b) in replicate(client, a.data(), &dims, devices)?
                .into_iter()
                .enumerate()
            {
                opt[d].push(b);
            }
        }
        self.opt = opt;
        Ok(())
    }
}

/// `leaves` (in [`ParamTree::leaves`] order) on each of the first `devices` devices as
/// `layout`'s parameter slots, `[device][slot]`: a leaf as it is, a stack of layers as one
/// `[L, …]` array. Each host leaf is dropped once it is uploaded (an owned one is freed).
fn params_on_devices<'a>(
    client: &Client,
    devices: usize,
    layout: &Layout,
    leaves: impl Iterator<Item = Cow<'a, Array>>,
) -> Result<Vec<Vec<Buffer>>, Error> {
    let mut params_dev: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
    let mut leaves: Vec<Option<Cow<'a, Array>>> = leaves.map(Some).collect();
    if leaves.len() != layout.leaves.len() {
        return Err(Error::Invalid(format!(
            "the parameter tree has {} leaves but the program takes {}; build the \
             program from this tree's leaf_infos",
            leaves.len(),
            layout.leaves.len()
        )));
    }
    for slot in layout.slots() {
        let bufs = match *slot {
            Slot::Leaf(p) => {
                let a = take_leaf(&mut leaves, p)?;
                replicate(client, a.data(), a.shape(), devices)?
            }
            Slot::Stack(s) => {
                // The layers' host arrays are freed as their stack is built.
                let st = &layout.stacks[s];
                let dims = dims_of(&st.ty());
                let mut data = Vec::with_capacity(dims.iter().product());
                for &p in &st.positions {
                    data.extend_from_slice(take_leaf(&mut leaves, p)?.data());
                }
                replicate(client, &data, &dims, devices)?
            }
        };
        for (d, b) in bufs.into_iter().enumerate() {
            params_dev[d].push(b);
        }
    }
    Ok(params_dev)
}

/// `layout`'s optimizer state at zero (where every run starts) on each of the first
/// `devices` devices, `[device][tensor]`; empty under `sgd`.
fn zero_opt(client: &Client, devices: usize, layout: &Layout) -> Result<Vec<Vec<Buffer>>, Error> {
    let mut opt: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
    for (_, ty) in &layout.opt_state {
        let dims = dims_of(ty);
        let zeros = vec![0.0f32; dims.iter().product()];
        for (d, b) in replicate(client, &zeros, &dims, devices)?
            .into_iter()
            .enumerate()
        {
            opt[d].push(b);
        }
    }
    Ok(opt)
}

/// `params`' structure with every leaf an empty array (no parameter data).
fn skeleton_of(params: &ParamTree) -> Result<ParamTree, Error> {
    let empty = Array::new(vec![0], Vec::new())?;
    Ok(params.map_leaves(|_, _| empty.clone()))
}

/// `tree`'s leaves by value, in [`ParamTree::leaves`] order.
fn into_leaves(tree: ParamTree) -> Vec<Array> {
    fn go(t: ParamTree, out: &mut Vec<Array>) {
        match t {
            ParamTree::Leaf(a) => out.push(a),
            ParamTree::Map(m) => m.into_values().for_each(|v| go(v, out)),
            ParamTree::List(l) => l.into_iter().for_each(|v| go(v, out)),
        }
    }
    let mut out = Vec::new();
    go(tree, &mut out);
    out
}

/// Leaf `p` of `leaves`, taken (each leaf is uploaded once).
fn take_leaf<'a>(leaves: &mut [Option<Cow<'a, Array>>], p: usize) -> Result<Cow<'a, Array>, Error> {
    leaves.get_mut(p).and_then(Option::take).ok_or_else(|| {
        Error::Invalid(format!(
            "leaf {p} of the parameter tree is in no parameter argument or in two; report this"
        ))
    })
}

/// The number of elements of a leaf of `shape`.
fn count(shape: &[i64]) -> usize {
    shape.iter().map(|&d| d as usize).product()
}

/// A leaf shape's dimensions as host sizes.
fn dims_of_leaf(shape: &[i64]) -> Vec<usize> {
    shape.iter().map(|&d| d as usize).collect()
}

/// A tensor type's dimensions as host sizes.
fn dims_of(ty: &shardes_hlo::builder::TensorType) -> Vec<usize> {
    ty.shape.iter().map(|&d| d as usize).collect()
}

/// One device's new parameters and generation, its fitness result if any, and its new
/// optimizer state (empty where the program returns none).
type DeviceResults = (Vec<Buffer>, Buffer, Option<Buffer>, Vec<Buffer>);

/// Each device's results of a `layout` program as `(params', generation', fitness, opt')`,
/// refusing a list of the wrong length or a program that returns no state.
fn split_all(layout: &Layout, outs: Vec<Vec<Buffer>>) -> Result<Vec<DeviceResults>, Error> {
    outs.into_iter()
        .map(|out| {
            let ProgramResults {
                params,
                generation,
                fitness,
                opt_state,
            } = layout.split_results(out)?;
            let generation = generation.ok_or_else(|| {
                Error::Invalid(format!(
                    "the {} program returns no state to take; run it without absorbing",
                    layout.kind.name()
                ))
            })?;
            Ok((params, generation, fitness, opt_state))
        })
        .collect()
}
