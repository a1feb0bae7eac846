//! Modules, the device mesh and shardings.

use std::fmt;

use super::error::{HloError, Result};
use super::func::{Callee, Func, Function};
use super::types::TensorType;

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

/// A StableHLO module: functions plus an optional mesh.
///
/// `mhlo.num_partitions` is the mesh size (1 without a mesh); `mhlo.num_replicas = 1`.
#[derive(Debug, Clone)]
pub struct Module {
    name: String,
    mesh: Option<Mesh>,
    funcs: Vec<Function>,
}

impl Module {
    /// An empty module without a mesh.
    pub fn new(name: &str) -> Self {
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Module {
            name,
            mesh: None,
            funcs: Vec::new(),
        }
    }

    /// An empty module whose functions may be sharded over `mesh`.
    pub fn with_mesh(name: &str, mesh: Mesh) -> Self {
        let mut m = Self::new(name);
        m.mesh = Some(mesh);
        m
    }

    /// The module's mesh, if any.
    pub fn mesh(&self) -> Option<&Mesh> {
        self.mesh.as_ref()
    }

    /// Starts a function that knows this module's mesh. `main` is public, others private.
    pub fn func(&self, name: &str) -> Func {
        match &self.mesh {
            Some(m) => Func::with_mesh(name, m),
            None => Func::new(name),
        }
    }

    /// Adds a finished function. Functions it calls must already be in the module (add
    /// helpers first); returns the callee handle for [`Func::call`].
    pub fn add(&mut self, f: Function) -> Result<Callee> {
        let callee = f.callee();
        let st = f.st.borrow();
        if self.funcs.iter().any(|g| g.name() == st.name) {
            return Err(HloError::Function {
                func: st.name.clone(),
                reason:
                    "a function of this name is already in the module; give helpers distinct names"
                        .into(),
            });
        }
        if st.uses_mesh && st.mesh != self.mesh {
            return Err(HloError::Function {
                func: st.name.clone(),
                reason: format!(
                    "it is sharded over mesh {:?} but the module's mesh is {:?}; build it with Module::func",
                    st.mesh, self.mesh
                ),
            });
        }
        for c in &st.calls {
            let found = self.funcs.iter().find(|g| g.name() == c.callee.name);
            match found {
                Some(g) if g.callee() == c.callee => {}
                Some(_) => {
                    return Err(HloError::Function {
                        func: st.name.clone(),
                        reason: format!("it calls @{} with a signature that differs from the function in the module", c.callee.name),
                    })
                }
                None => {
                    return Err(HloError::Function {
                        func: st.name.clone(),
                        reason: format!("it calls @{} which is not in the module yet; add the callee first", c.callee.name),
                    })
                }
            }
        }
        drop(st);
        self.funcs.push(f);
        Ok(callee)
    }

    /// The module as MLIR text; the same builder calls always give the same bytes.
    pub fn to_mlir(&self) -> String {
        let parts = self.mesh.as_ref().map_or(1, |m| m.size);
        let mut out = format!(
            "module @{} attributes {{mhlo.num_partitions = {parts} : i32, mhlo.num_replicas = 1 : i32}} {{\n",
            self.name
        );
        if let Some(m) = &self.mesh {
            out.push_str(&format!(
                "  sdy.mesh @mesh = <[\"{}\"={}]>\n",
                m.axis, m.size
            ));
        }
        for f in &self.funcs {
            f.st.borrow().print(&mut out);
        }
        out.push_str("}\n");
        out
    }

    /// Every value type in the module: function arguments, op results and block arguments
    /// of nested regions, in definition order per function.
    pub fn value_types(&self) -> Vec<TensorType> {
        self.funcs.iter().flat_map(|f| f.value_types()).collect()
    }

    /// The functions in the module, in the order they were added.
    pub fn functions(&self) -> &[Function] {
        &self.funcs
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_mlir())
    }
}
