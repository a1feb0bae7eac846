//! Sharding constraints, manual computations (shard_map) and collectives.

use super::{Mesh, Sharding};
use crate::builder::error::{HloError, Result};
use crate::builder::func::{BlockId, Func, RegionSpec, Value, P};
use crate::builder::ops::combiner;
use crate::builder::types::{fn_type, join_types, DType, TensorType};

/// The op name in errors about manual computations.
const MANUAL: &str = "manual_computation";

fn replica_groups(n: i64) -> String {
    let ids: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!("dense<[[{}]]> : tensor<1x{n}xi64>", ids.join(", "))
}

impl Value {
    /// `sdy.sharding_constraint`: asks the partitioner to place this value as `sharding`.
    pub fn shard(&self, sharding: &Sharding) -> Result<Value> {
        let f = self.func();
        let what = format!("sharding_constraint on {}", self.describe());
        if f.manual_size().is_some() {
            return Err(HloError::Sharding {
                what,
                reason: "values inside a manual_computation are per-device; constrain the inputs or outputs of the manual_computation instead".into(),
            });
        }
        let mesh = f.need_mesh(&what)?;
        sharding.check(&what, &self.ty, &mesh)?;
        let p = P::new().t("sdy.sharding_constraint ").v(self).t(format!(
            " {} : {}",
            sharding.mlir(&mesh),
            self.ty
        ));
        f.emit1("sharding_constraint", &[self], p, self.ty.clone())
    }

    fn all_reduce(&self, op: &str, mlir: &'static str) -> Result<Value> {
        let f = self.func();
        let n = f.manual_size().ok_or_else(|| HloError::Sharding {
            what: format!("{op} of {}", self.describe()),
            reason: "collectives are only valid inside a manual_computation body; wrap the per-device code in Func::manual_computation".into(),
        })?;
        if self.dtype() == DType::I1 {
            return Err(HloError::DTypeMismatch {
                op: op.into(),
                types: self.ty.to_string(),
                reason: "i1 cannot be reduced; convert to an integer type".into(),
            });
        }
        let scal = TensorType::scalar(self.dtype());
        let spec = RegionSpec::body(true);
        let (block, _) = f.region(op, spec, &[scal.clone(), scal], |a| {
            combiner(op, mlir, &a[0], &a[1]).map(|v| vec![v])
        })?;
        let ch = f.next_channel();
        let p = P::new().t("\"stablehlo.all_reduce\"(").v(self).t(format!(
            ") <{{channel_handle = #stablehlo.channel_handle<handle = {ch}, type = 1>, replica_groups = {}, use_global_device_ids}}> (",
            replica_groups(n)
        ));
        let p = p
            .region(block)
            .t(format!(") : ({}) -> {}", self.ty, self.ty));
        f.emit1(op, &[self], p, self.ty.clone())
    }

    /// Sum over all devices of the mesh (inside a manual computation).
    pub fn all_reduce_sum(&self) -> Result<Value> {
        self.all_reduce("all_reduce_sum", "add")
    }

    /// Maximum over all devices of the mesh (inside a manual computation).
    pub fn all_reduce_max(&self) -> Result<Value> {
        self.all_reduce("all_reduce_max", "maximum")
    }

    /// Concatenates every device's value along `dim`, in device order (inside a manual
    /// computation); dimension `dim` grows by the mesh size.
    pub fn all_gather(&self, dim: usize) -> Result<Value> {
        let f = self.func();
        let n = f.manual_size().ok_or_else(|| HloError::Sharding {
            what: format!("all_gather of {}", self.describe()),
            reason: "collectives are only valid inside a manual_computation body; wrap the per-device code in Func::manual_computation".into(),
        })?;
        if dim >= self.rank() {
            return Err(HloError::InvalidAttribute {
                op: "all_gather".into(),
                types: self.ty.to_string(),
                reason: format!("dimension {dim} is out of range for rank {}", self.rank()),
            });
        }
        let mut out = self.ty.clone();
        out.shape[dim] *= n;
        let ch = f.next_channel();
        let p = P::new().t("\"stablehlo.all_gather\"(").v(self).t(format!(
            ") <{{all_gather_dim = {dim} : i64, channel_handle = #stablehlo.channel_handle<handle = {ch}, type = 1>, replica_groups = {}, use_global_device_ids}}> : ({}) -> {out}",
            replica_groups(n),
            self.ty
        ));
        f.emit1("all_gather", &[self], p, out)
    }
}

impl Func {
    /// The device's index along the mesh axis as a `ui32` scalar (inside a manual computation).
    pub fn partition_id(&self) -> Result<Value> {
        if self.manual_size().is_none() {
            return Err(HloError::Sharding {
                what: "partition_id".into(),
                reason: "only meaningful inside a manual_computation body".into(),
            });
        }
        self.emit1(
            "partition_id",
            &[],
            P::new().t("stablehlo.partition_id : tensor<ui32>"),
            TensorType::scalar(DType::U32),
        )
    }

    /// `sdy.manual_computation` (shard_map) over the whole mesh axis. `body` receives each
    /// input's per-device (local) value and returns per-device results; `out_shardings`
    /// say how those assemble into global results (a replicated result must be equal on
    /// every device). The body is isolated: use only its arguments and values made inside.
    ///
    /// `body` may fail with the caller's own error type `E` (any type an [`HloError`]
    /// converts into); such an error is returned as is, and the function stays usable.
    pub fn manual_computation<F, E>(
        &self,
        inputs: &[&Value],
        in_shardings: &[Sharding],
        out_shardings: &[Sharding],
        body: F,
    ) -> Result<Vec<Value>, E>
    where
        F: FnOnce(&[Value]) -> Result<Vec<Value>, E>,
        E: From<HloError>,
    {
        let what = MANUAL;
        let (mesh, locals) = self.manual_inputs(inputs, in_shardings)?;
        if mesh.size() == 1 {
            // XLA does not run the partitioner for one partition, so the Shardy custom calls
            // a manual computation lowers to would stay unresolved. As JAX does, print the body
            // inline: on one device local and global values coincide.
            let ret = self.inline_region(what, 1, inputs, body)?;
            check_result_count(what, &ret, out_shardings)?;
            for (i, (v, s)) in ret.iter().zip(out_shardings).enumerate() {
                s.check(&format!("{what} output {i} ({})", v.ty), &v.ty, &mesh)?;
            }
            return Ok(ret);
        }
        let spec = RegionSpec {
            isolated: true,
            manual: Some(mesh.size()),
            header: false,
            terminator: "sdy.return",
        };
        let (block, ret) = self.region(what, spec, &locals, body)?;
        Ok(self.emit_manual(&mesh, inputs, in_shardings, out_shardings, block, &ret)?)
    }

    /// Checks a manual computation's inputs; returns the mesh and their per-device types.
    fn manual_inputs(
        &self,
        inputs: &[&Value],
        in_shardings: &[Sharding],
    ) -> Result<(Mesh, Vec<TensorType>)> {
        let what = MANUAL;
        let mesh = self.need_mesh(what)?;
        if self.manual_size().is_some() {
            return Err(HloError::Sharding {
                what: what.into(),
                reason: "manual computations cannot be nested over the same axis; keep one level"
                    .into(),
            });
        }
        if inputs.len() != in_shardings.len() {
            return Err(HloError::Sharding {
                what: what.into(),
                reason: format!(
                    "{} inputs but {} in_shardings; pass one sharding per input",
                    inputs.len(),
                    in_shardings.len()
                ),
            });
        }
        for v in inputs {
            self.check_use(what, v)?;
        }
        let mut locals = Vec::with_capacity(inputs.len());
        for (i, (v, s)) in inputs.iter().zip(in_shardings).enumerate() {
            s.check(&format!("{what} input {i} ({})", v.ty), &v.ty, &mesh)?;
            locals.push(s.local(&v.ty, &mesh));
        }
        Ok((mesh, locals))
    }

    /// Appends the `sdy.manual_computation` op over the built body `block`.
    fn emit_manual(
        &self,
        mesh: &Mesh,
        inputs: &[&Value],
        in_shardings: &[Sharding],
        out_shardings: &[Sharding],
        block: BlockId,
        ret: &[Value],
    ) -> Result<Vec<Value>> {
        let what = MANUAL;
        check_result_count(what, ret, out_shardings)?;
        let mut globals = Vec::with_capacity(ret.len());
        for (i, (v, s)) in ret.iter().zip(out_shardings).enumerate() {
            let g = s.global(&v.ty, mesh);
            s.check(&format!("{what} output {i} ({})", v.ty), &g, mesh)?;
            globals.push(g);
        }
        let shard_list = |ss: &[Sharding]| {
            ss.iter()
                .map(|s| s.mlir(mesh))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let in_types: Vec<TensorType> = inputs.iter().map(|v| v.ty.clone()).collect();
        let p = P::new()
            .t("sdy.manual_computation(")
            .vs(inputs)
            .t(format!(
                ") in_shardings=[{}] out_shardings=[{}] manual_axes={{\"{}\"}} (",
                shard_list(in_shardings),
                shard_list(out_shardings),
                mesh.axis()
            ))
            .block_args(block)
            .t(") ")
            .region(block)
            .t(format!(" : {}", fn_type(&in_types, &globals)));
        self.emit(what, inputs, p, &globals)
    }
}

/// A manual computation returns exactly one value per out_sharding.
fn check_result_count(what: &str, ret: &[Value], out_shardings: &[Sharding]) -> Result<()> {
    if ret.len() != out_shardings.len() {
        let got: Vec<TensorType> = ret.iter().map(|v| v.ty.clone()).collect();
        return Err(HloError::RegionResult {
            op: what.into(),
            got: join_types(&got),
            expected: format!("{} values, one per out_sharding", out_shardings.len()),
        });
    }
    Ok(())
}
