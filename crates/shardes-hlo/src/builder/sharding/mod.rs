//! The device mesh, shardings over it, and the ops that place values on it.
//!
//! A [`Mesh`] has one axis; a [`Sharding`] says per dimension whether it is split along
//! that axis. The ops (in `ops.rs`) are `sdy.sharding_constraint` ([`super::Value::shard`]),
//! `sdy.manual_computation` ([`super::Func::manual_computation`], shard_map) and, inside
//! it, the collectives and `partition_id`. The types live here, apart from the ops, so
//! that the function arena can store shardings without depending on the ops that build
//! on it.

use super::error::{HloError, Result};
use super::types::TensorType;

mod ops;

/// A one-axis device mesh, printed `sdy.mesh @mesh = <["pop"=8]>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mesh {
    axis: String,
    size: i64,
}

impl Mesh {
    /// The `"pop"` mesh over `size` devices.
    pub fn pop(size: i64) -> Result<Self> {
        Self::new("pop", size)
    }

    /// A mesh with a custom axis name.
    pub fn new(axis: &str, size: i64) -> Result<Self> {
        if size < 1 {
            return Err(HloError::Sharding {
                what: format!("mesh axis \"{axis}\""),
                reason: format!("size {size} is not positive; use the number of devices (>= 1)"),
            });
        }
        if axis.is_empty() || !axis.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(HloError::Sharding {
                what: format!("mesh axis \"{axis}\""),
                reason: "axis names must be non-empty and use only ASCII letters, digits and `_`"
                    .into(),
            });
        }
        Ok(Mesh {
            axis: axis.into(),
            size,
        })
    }

    /// The axis name.
    pub fn axis(&self) -> &str {
        &self.axis
    }

    /// The number of devices along the axis.
    pub fn size(&self) -> i64 {
        self.size
    }
}

/// Per-dimension placement over the one mesh axis: each dimension is either split along
/// the axis or replicated. At most one dimension may be split.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sharding {
    split: Vec<bool>,
}

impl Sharding {
    /// Fully replicated over `rank` dimensions.
    pub fn replicated(rank: usize) -> Self {
        Sharding {
            split: vec![false; rank],
        }
    }

    /// Dimension `dim` of a rank-`rank` tensor split along the mesh axis.
    pub fn split(rank: usize, dim: usize) -> Result<Self> {
        if dim >= rank {
            return Err(HloError::Sharding {
                what: format!("Sharding::split({rank}, {dim})"),
                reason: format!("dimension {dim} does not exist in a rank-{rank} tensor; pick a dimension below {rank}"),
            });
        }
        let mut split = vec![false; rank];
        split[dim] = true;
        Ok(Sharding { split })
    }

    /// The rank this sharding describes.
    pub fn rank(&self) -> usize {
        self.split.len()
    }

    /// The split dimension, if any.
    pub fn split_dim(&self) -> Option<usize> {
        self.split.iter().position(|&s| s)
    }

    /// `<@mesh, [{"pop"}, {}]>` (prefix with `#sdy.sharding` for attributes).
    pub(crate) fn mlir(&self, mesh: &Mesh) -> String {
        let dims: Vec<String> = self
            .split
            .iter()
            .map(|&s| {
                if s {
                    format!("{{\"{}\"}}", mesh.axis)
                } else {
                    "{}".into()
                }
            })
            .collect();
        format!("<@mesh, [{}]>", dims.join(", "))
    }

    /// Checks that this sharding fits `ty` on `mesh`.
    pub(crate) fn check(&self, what: &str, ty: &TensorType, mesh: &Mesh) -> Result<()> {
        if self.rank() != ty.rank() {
            return Err(HloError::Sharding {
                what: what.into(),
                reason: format!(
                    "sharding has rank {} but the value is {ty}; use a sharding of rank {}",
                    self.rank(),
                    ty.rank()
                ),
            });
        }
        if let Some(d) = self.split_dim() {
            if ty.shape[d] % mesh.size != 0 {
                return Err(HloError::Sharding {
                    what: what.into(),
                    reason: format!(
                        "dimension {d} of {ty} has size {} which does not divide by the {} devices of mesh axis \"{}\"; pad it to a multiple of {} or split another dimension",
                        ty.shape[d], mesh.size, mesh.axis, mesh.size
                    ),
                });
            }
        }
        Ok(())
    }

    /// The per-device type of a global value `ty`.
    pub(crate) fn local(&self, ty: &TensorType, mesh: &Mesh) -> TensorType {
        let mut t = ty.clone();
        if let Some(d) = self.split_dim() {
            t.shape[d] /= mesh.size;
        }
        t
    }

    /// The global type of a per-device value `ty`.
    pub(crate) fn global(&self, ty: &TensorType, mesh: &Mesh) -> TensorType {
        let mut t = ty.clone();
        if let Some(d) = self.split_dim() {
            t.shape[d] *= mesh.size;
        }
        t
    }
}
