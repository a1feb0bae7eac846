//! The model side of the ES program: the [`Model`] trait, the parameters a model reads
//! ([`ModelParams`]), and [`check_model`], which finds leaves a model reads the wrong way.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::builder::{DType, Func, TensorType, Value};
use crate::nn::{Act, Weight};
use crate::params::ParamTree;

use super::error::EsError;
use super::strategy::LeafInfo;

/// A model the ES program can evaluate: a per-member loss written against the seams.
pub trait Model {
    /// Names and types of the batch inputs (replicated on every device).
    fn batch_types(&self) -> Vec<(String, TensorType)>;

    /// The loss of every member of a chunk: an [`Act`] with logical shape `[]`
    /// (or `[g]` for `group_relative`), f32. Read 2-D weights through
    /// [`ModelParams::weight`] and the seams in [`crate::nn`].
    fn loss(&self, params: &ModelParams, batch: &[Value]) -> Result<Act, EsError>;

    /// Fitness columns per member: 1 for a scalar loss, `g` when [`Model::loss`] returns
    /// `g` task losses (logical shape `[g]`, for `group_relative`).
    fn tasks(&self) -> usize {
        1
    }

    /// Bytes of one member's largest activation for one batch, if the model knows it
    /// (e.g. `tokens × width × 4` for f32). The programs built for this model size their
    /// default member chunk with it, keeping a chunk's activation within
    /// [`crate::es::CHUNK_BYTES`], unless [`crate::es::ShardedES::with_member_bytes`] set a
    /// size.
    fn member_bytes(&self) -> Option<usize> {
        None
    }

    /// How the default member chunk is sized for this model ([`ChunkPolicy`]).
    fn chunk_policy(&self) -> ChunkPolicy {
        ChunkPolicy::Cache
    }

    /// The model's repeated layers, when it reads them through
    /// [`ModelParams::layer_source`] inside a loop over the layer index. The ES programs
    /// then draw and scale a layer's noise inside that loop (and contract it in a loop of
    /// their own), so a layer adds no ops to the program. `None` (the default): every
    /// leaf is drawn on its own.
    fn layers(&self) -> Option<LayerLeaves> {
        None
    }
}

/// How a model's default member chunk is sized (members evaluated together in one step of
/// the member loop), unless the settings or the strategy choose one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkPolicy {
    /// Chunks whose activations stay cache-sized ([`crate::es::CHUNK_BYTES`] per chunk with
    /// [`Model::member_bytes`] the largest activation of a member) and that divide `n / 8`,
    /// so every member is computed by the same kernel shapes on 1, 2, 4 and 8 devices: the
    /// fused programs, whose work per member is small and whose bits must not depend on
    /// the device count.
    Cache,
    /// Every local member in one chunk while the chunk's memory stays within `bytes`
    /// ([`Model::member_bytes`] then a member's whole working set, e.g. its KV cache):
    /// decoding, where a chunk's members' rows are one batch through the weights and more
    /// rows per weight read is the throughput. Chunks divide `n / 8` only under
    /// [`crate::es::ShardedES::with_device_invariant`].
    Batch {
        /// The memory one chunk may use.
        bytes: usize,
    },
}

/// A model's repeated layers: leaf `name` of layer `l` is `{prefix}{l}.{name}`, for `l` in
/// `0..count` (Hugging Face's `model.layers.{l}.…`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerLeaves {
    /// The path before the layer index, e.g. `model.layers.`.
    pub prefix: String,
    /// The number of layers.
    pub count: usize,
    /// Every leaf of one layer, by its path after `{prefix}{l}.`.
    pub names: Vec<String>,
}

impl LayerLeaves {
    /// The path of leaf `name` of layer `l`.
    pub fn path(&self, l: usize, name: &str) -> String {
        format!("{}{l}.{name}", self.prefix)
    }
}

/// Where a model loop reads one layer's leaves from, by a layer index the loop traces.
pub trait LayerSource {
    /// Layer `i`'s leaves (`i` an i32 scalar, traced or constant), named as layer 0's.
    fn layer(&self, i: &Value) -> Result<ModelParams<'static>, EsError>;

    /// The members the layers' perturbed leaves are held with (`None`: all shared).
    fn members(&self) -> Option<i64>;
}

/// How a model read a leaf (for [`check_model`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read through a seam (`dense`/`embed`).
    Seam,
    /// Read as a plain tensor.
    Raw,
}

/// A leaf as the model sees it: a 2-D weight for the seams, or any other tensor.
pub(crate) enum Leaf {
    /// Read through [`ModelParams::weight`].
    Matrix(Weight),
    /// Read through [`ModelParams::tensor`].
    Dense(Act),
}

/// The parameters as a model sees them for one member chunk.
pub struct ModelParams<'a> {
    leaves: BTreeMap<String, Leaf>,
    access: RefCell<BTreeMap<String, Vec<Access>>>,
    dtype: DType,
    layers: Option<&'a dyn LayerSource>,
}

impl<'a> ModelParams<'a> {
    pub(crate) fn new(leaves: Vec<(String, Leaf)>) -> Self {
        ModelParams {
            leaves: leaves.into_iter().collect(),
            access: RefCell::new(BTreeMap::new()),
            dtype: DType::F32,
            layers: None,
        }
    }

    /// These parameters with the layers of [`Model::layers`] read from `source` (they
    /// are not among the leaves).
    pub(crate) fn with_layer_source(self, source: &'a dyn LayerSource) -> ModelParams<'a> {
        ModelParams {
            layers: Some(source),
            ..self
        }
    }

    /// Where the model's layers come from when the ES program hands them over one layer
    /// at a time ([`Model::layers`]); `None` when every leaf is among these parameters.
    pub fn layer_source(&self) -> Option<&'a dyn LayerSource> {
        self.layers
    }

    /// Every leaf converted to `dtype` (the ES's compute dtype, [`crate::es::precision`]):
    /// weights through [`Weight::convert`] (a low-rank weight's base, factors and scale
    /// one by one, so nothing is multiplied out), other leaves elementwise. `F32` (or the
    /// dtype the leaves have) converts nothing. Models read the dtype back with
    /// [`ModelParams::compute_dtype`].
    pub fn with_compute_dtype(self, dtype: DType) -> Result<Self, EsError> {
        if dtype == self.dtype {
            return Ok(self);
        }
        let leaves = self
            .leaves
            .into_iter()
            .map(|(path, leaf)| {
                let leaf = match leaf {
                    Leaf::Matrix(w) => Leaf::Matrix(w.convert(dtype)?),
                    Leaf::Dense(a) => Leaf::Dense(a.convert(dtype)?),
                };
                Ok((path, leaf))
            })
            .collect::<Result<_, EsError>>()?;
        Ok(ModelParams {
            leaves,
            access: self.access,
            dtype,
            layers: self.layers,
        })
    }

    /// The dtype the leaves are given in: `F32`, or the ES's compute dtype
    /// ([`crate::es::ShardedES::with_compute_dtype`]). A model whose activations have
    /// their own dtype (Qwen2's) follows it.
    pub fn compute_dtype(&self) -> DType {
        self.dtype
    }

    /// Unperturbed parameters (2-D leaves as [`Weight::Plain`], others shared), for
    /// programs outside ES such as inference or decoding.
    pub fn plain(leaves: Vec<(String, Value)>) -> Self {
        let entries = leaves.into_iter().map(|(path, v)| {
            let leaf = if v.rank() == 2 {
                Leaf::Matrix(Weight::Plain(v))
            } else {
                Leaf::Dense(Act::shared(v))
            };
            (path, leaf)
        });
        Self::new(entries.collect())
    }

    /// These parameters with every matrix read as stored `(in, out)` ([`Weight::InOut`]),
    /// for values that hold their matrices' transposes ([`crate::es::Layout::in_out`]).
    pub fn matrices_in_out(mut self) -> Result<Self, EsError> {
        for leaf in self.leaves.values_mut() {
            if let Leaf::Matrix(w) = leaf {
                *w = Weight::in_out(w.clone())?;
            }
        }
        Ok(self)
    }

    fn record(&self, path: &str, a: Access) {
        self.access
            .borrow_mut()
            .entry(path.to_string())
            .or_default()
            .push(a);
    }

    fn missing(&self, path: &str) -> EsError {
        let known: Vec<&str> = self.leaves.keys().map(String::as_str).collect();
        EsError::Param {
            path: path.into(),
            reason: format!("no such leaf; the tree has: {}", known.join(", ")),
        }
    }

    /// A 2-D leaf for the seams ([`crate::nn::dense`], [`crate::nn::embed`]).
    pub fn weight(&self, path: &str) -> Result<Weight, EsError> {
        match self.leaves.get(path) {
            Some(Leaf::Matrix(w)) => {
                self.record(path, Access::Seam);
                Ok(w.clone())
            }
            Some(Leaf::Dense(_)) => Err(EsError::Param {
                path: path.into(),
                reason: "is not 2-D; read it with ModelParams::tensor".into(),
            }),
            None => Err(self.missing(path)),
        }
    }

    /// A leaf as a plain tensor (biases, norms). A 2-D leaf under a structured
    /// perturbation cannot be read this way: it has no dense value to give.
    pub fn tensor(&self, path: &str) -> Result<Act, EsError> {
        match self.leaves.get(path) {
            Some(Leaf::Dense(a)) => {
                self.record(path, Access::Raw);
                Ok(a.clone())
            }
            Some(Leaf::Matrix(Weight::Plain(w))) => {
                self.record(path, Access::Raw);
                Ok(Act::shared(w.clone()))
            }
            Some(Leaf::Matrix(Weight::Members(w))) => {
                self.record(path, Access::Raw);
                Ok(Act::per_member(w.clone())?)
            }
            Some(Leaf::Matrix(Weight::InOut(w))) => match &**w {
                // Stored (in, out): the tensor is its transpose.
                Weight::Plain(v) => {
                    self.record(path, Access::Raw);
                    Ok(Act::shared(v.transpose(&[1, 0])?))
                }
                _ => Err(self.no_dense_value(path)),
            },
            Some(Leaf::Matrix(Weight::LowRank { .. })) => Err(self.no_dense_value(path)),
            None => Err(self.missing(path)),
        }
    }

    /// The error of a raw read of a structured weight (recorded as the read it was).
    fn no_dense_value(&self, path: &str) -> EsError {
        self.record(path, Access::Raw);
        EsError::Param {
            path: path.into(),
            reason: "is a low-rank structured weight with no dense value; read it through \
                     nn::dense or nn::embed (ModelParams::weight)"
                .into(),
        }
    }

    fn accesses(&self) -> BTreeMap<String, Vec<Access>> {
        self.access.borrow().clone()
    }
}

/// The leaves of a parameter tree as the program sees them (JAX leaf order).
pub fn leaf_infos(tree: &ParamTree) -> Vec<LeafInfo> {
    tree.leaves()
        .into_iter()
        .enumerate()
        .map(|(index, (path, a))| LeafInfo {
            index,
            path,
            shape: a.shape().iter().map(|&d| d as i64).collect(),
        })
        .collect()
}

/// What [`check_model`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Leaf path.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Reports every 2-D leaf the model reads without a seam and every leaf it never reads,
/// by building the model once for a chunk of two low-rank members.
pub fn check_model(model: &dyn Model, leaves: &[LeafInfo]) -> Result<Vec<Finding>, EsError> {
    let f = Func::new("check");
    let c = 2;
    let mut entries = Vec::new();
    for l in leaves {
        let theta = f.arg(&l.path, TensorType::f32(&l.shape))?;
        let entry = if let [m, k] = l.shape.as_slice() {
            Leaf::Matrix(Weight::LowRank {
                base: theta,
                a: f.full(0.0f32, &[c, 1, *m])?,
                b: f.full(0.0f32, &[c, 1, *k])?,
                scale: f.full(0.0f32, &[c])?,
            })
        } else {
            let mut shape = vec![c];
            shape.extend_from_slice(&l.shape);
            let d: Vec<usize> = (1..shape.len()).collect();
            Leaf::Dense(Act::per_member(theta.broadcast_in_dim(&shape, &d)?)?)
        };
        entries.push((l.path.clone(), entry));
    }
    let mp = ModelParams::new(entries);
    let mut batch = Vec::new();
    for (name, ty) in model.batch_types() {
        batch.push(f.arg(&name, ty)?);
    }
    let mut findings = Vec::new();
    if let Err(e) = model.loss(&mp, &batch) {
        match e {
            EsError::Param { .. } => {}
            other => return Err(other),
        }
    }
    let acc = mp.accesses();
    for l in leaves {
        match acc.get(&l.path) {
            None => findings.push(Finding {
                path: l.path.clone(),
                message: "never read by the model: remove it from the tree or use it".into(),
            }),
            Some(a) if l.shape.len() == 2 && a.contains(&Access::Raw) => findings.push(Finding {
                path: l.path.clone(),
                message: "2-D leaf read without a seam: use nn::dense(x, params.weight(..)) \
                          or nn::embed so low-rank strategies never densify it"
                    .into(),
            }),
            _ => {}
        }
    }
    Ok(findings)
}
