//! Modules: named collections of functions over an optional mesh.

use std::collections::BTreeMap;
use std::fmt;

use super::error::{HloError, Result};
use super::func::{Callee, Func, Function};
use super::printer;
use super::sharding::Mesh;
use super::types::TensorType;

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
        printer::module(&self.name, self.mesh.as_ref(), &self.funcs)
    }

    /// Op name -> number of such ops in [`Module::to_mlir`]'s text, every region and
    /// function included: what XLA has to compile, by kind (`stablehlo.add`,
    /// `sdy.manual_computation`, `func.call`, ...).
    ///
    /// Counted from the builder's op records, with the result a line-by-line reading of
    /// the text gives: region terminators (`stablehlo.return`, `sdy.return`) count, the
    /// functions' `return` does not, and `func.func` counts only the functions whose
    /// signature carries no sharding or donation attributes.
    pub fn op_counts(&self) -> BTreeMap<String, usize> {
        printer::op_counts(&self.funcs)
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
