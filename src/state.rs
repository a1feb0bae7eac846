//! ES state on the devices, shared by [`crate::Trainer`] and [`crate::SplitTrainer`].
//!
//! Parameters, key and generation are replicated on each of the ES's devices, as are the
//! batch inputs. A program consumes `(params…, key, generation, extra…)` and returns
//! `(params'…, generation', extra…)`; [`DeviceState::absorb`] takes the new state from its
//! outputs and hands back the extra results.

use shardes_hlo::builder::DType;
use shardes_hlo::es::Layout;
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{Buffer, Client, Element};

use crate::Error;

/// The replicated state of one run.
pub(crate) struct DeviceState {
    pub(crate) layout: Layout,
    template: ParamTree,
    /// `[device][leaf]`.
    params: Vec<Vec<Buffer>>,
    key: Vec<Buffer>,
    generation: Vec<Buffer>,
    /// `[device][batch argument]`.
    batch: Vec<Vec<Buffer>>,
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
            let bufs = match ty.dtype {
                DType::F32 => replicate(client, a.data(), a.shape(), devices)?,
                DType::I32 => replicate(client, &to_i32(name, a)?, a.shape(), devices)?,
                other => {
                    return Err(Error::Invalid(format!(
                        "batch array `{name}` has element type {}; batch inputs must be f32 or i32",
                        other.mlir()
                    )))
                }
            };
            for (d, b) in bufs.into_iter().enumerate() {
                batch_dev[d].push(b);
            }
        }
        let mut params_dev: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
        for (_, a) in params.leaves() {
            for (d, b) in replicate(client, a.data(), a.shape(), devices)?
                .into_iter()
                .enumerate()
            {
                params_dev[d].push(b);
            }
        }
        Ok(DeviceState {
            layout,
            template: params.clone(),
            params: params_dev,
            key: replicate(client, &key.data(), &[2], devices)?,
            generation: replicate(client, &[generation], &[], devices)?,
            batch: batch_dev,
            generation_host: generation,
        })
    }

    /// Devices holding the state.
    pub(crate) fn devices(&self) -> usize {
        self.params.len()
    }

    /// Device `d`'s arguments: `params…, key, generation`, then the batch if `with_batch`.
    pub(crate) fn args(&self, d: usize, with_batch: bool) -> Vec<&Buffer> {
        let mut a: Vec<&Buffer> = self.params[d].iter().collect();
        a.push(&self.key[d]);
        a.push(&self.generation[d]);
        if with_batch {
            a.extend(self.batch[d].iter());
        }
        a
    }

    /// Takes `(params'…, generation', extra…)` per device as the new state (advancing the
    /// host generation by `advance`) and returns the `extra` trailing results per device.
    pub(crate) fn absorb(
        &mut self,
        outs: Vec<Vec<Buffer>>,
        extra: usize,
        advance: u32,
    ) -> Result<Vec<Vec<Buffer>>, Error> {
        let nl = self.layout.leaves.len();
        let mut extras = Vec::with_capacity(outs.len());
        for (d, mut out) in outs.into_iter().enumerate() {
            if out.len() != nl + 1 + extra {
                return Err(Error::Invalid(format!(
                    "the program returned {} results, expected {nl} leaves + generation + {extra}",
                    out.len()
                )));
            }
            let tail = out.split_off(nl + 1);
            let gen = out
                .pop()
                .ok_or_else(|| Error::Invalid("no generation result".into()))?;
            self.params[d] = out;
            self.generation[d] = gen;
            extras.push(tail);
        }
        self.generation_host += advance;
        Ok(extras)
    }

    /// Copies the parameters back to the host (from device 0; every device holds the same).
    pub(crate) fn params(&self) -> Result<ParamTree, Error> {
        let mut leaves = Vec::with_capacity(self.params[0].len());
        for (b, l) in self.params[0].iter().zip(&self.layout.leaves) {
            let shape: Vec<usize> = l.shape.iter().map(|&d| d as usize).collect();
            leaves.push(Array::new(shape, b.to_host::<f32>()?)?);
        }
        Ok(ParamTree::from_leaves(&self.template, leaves)?)
    }
}
