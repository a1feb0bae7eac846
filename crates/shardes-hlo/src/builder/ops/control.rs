//! Control flow and calls: `while`, counted loops, `func.call`, `optimization_barrier`.

use super::{check_region_result, shape_err};
use crate::builder::error::{HloError, Result};
use crate::builder::func::{Callee, Func, RegionSpec, Value, P};
use crate::builder::types::{fn_type, join_types, DType, TensorType};

impl Func {
    /// `func.call` of a function in the same module (add the callee to the module first).
    pub fn call(&self, callee: &Callee, args: &[&Value]) -> Result<Vec<Value>> {
        let op = format!("call @{}", callee.name);
        let got: Vec<TensorType> = args.iter().map(|v| v.ty.clone()).collect();
        if got != callee.args {
            return Err(shape_err(
                &op,
                args,
                format!("@{} takes ({})", callee.name, join_types(&callee.args)),
            ));
        }
        let p = P::new()
            .t(format!("func.call @{}(", callee.name))
            .vs(args)
            .t(format!(") : {}", fn_type(&callee.args, &callee.results)));
        let out = self.emit(&op, args, p, &callee.results)?;
        self.record_call(callee);
        Ok(out)
    }

    /// `while` over a carried tuple: `cond` maps the carry to an `i1` scalar, `body` maps
    /// it to the next carry (same types). Both may use values from the enclosing blocks.
    /// Their error (of any type an [`HloError`] converts into) is returned as is.
    pub fn while_loop<C, B, E>(&self, init: &[&Value], cond: C, body: B) -> Result<Vec<Value>, E>
    where
        C: FnOnce(&[Value]) -> Result<Value, E>,
        B: FnOnce(&[Value]) -> Result<Vec<Value>, E>,
        E: From<HloError>,
    {
        let tys: Vec<TensorType> = init.iter().map(|v| v.ty.clone()).collect();
        for v in init {
            self.check_use("while", v)?;
        }
        let spec = || RegionSpec::body(false);
        let (cb, cr) = self.region("while", spec(), &tys, |c| cond(c).map(|v| vec![v]))?;
        check_region_result("while (cond)", &cr, &[TensorType::scalar(DType::I1)])?;
        let (bb, br) = self.region("while", spec(), &tys, body)?;
        check_region_result("while (body)", &br, &tys)?;
        let p = P::new()
            .t("\"stablehlo.while\"(")
            .vs(init)
            .t(") (")
            .region(cb)
            .t(", ")
            .region(bb)
            .t(format!(") : {}", fn_type(&tys, &tys)));
        Ok(self.emit("while", init, p, &tys)?)
    }

    /// A counted loop: runs `body(i, carry)` for `i` in `lo..hi` (an `i32` scalar) and
    /// returns the final carry. The body's error (of any type an [`HloError`] converts
    /// into) is returned as is.
    pub fn fori_loop<B, E>(
        &self,
        lo: i32,
        hi: i32,
        init: &[&Value],
        body: B,
    ) -> Result<Vec<Value>, E>
    where
        B: FnOnce(&Value, &[Value]) -> Result<Vec<Value>, E>,
        E: From<HloError>,
    {
        let i0 = self.scalar(lo)?;
        let mut all: Vec<&Value> = vec![&i0];
        all.extend_from_slice(init);
        let f = self.clone();
        let g = self.clone();
        let mut out = self.while_loop(
            &all,
            move |c| Ok(c[0].lt(&f.scalar(hi)?)?),
            move |c| -> Result<Vec<Value>, E> {
                let next = c[0].add(&g.scalar(1i32)?)?;
                let mut rest = body(&c[0], &c[1..])?;
                rest.insert(0, next);
                Ok(rest)
            },
        )?;
        out.remove(0);
        Ok(out)
    }

    /// `case`: runs branch `index` of `branches` (clamped to the last branch by StableHLO
    /// when out of range) and returns its values. Every branch returns values of the same
    /// types (`tys`); branches may use values from the enclosing blocks. Selecting among
    /// per-layer tensors this way reads one layer inside a loop without stacking the layers
    /// into one array first.
    pub fn case<B, E>(
        &self,
        index: &Value,
        tys: &[TensorType],
        branches: Vec<B>,
    ) -> Result<Vec<Value>, E>
    where
        B: FnOnce() -> Result<Vec<Value>, E>,
        E: From<HloError>,
    {
        if index.ty != TensorType::scalar(DType::I32) || branches.is_empty() {
            return Err(E::from(shape_err(
                "case",
                &[index],
                "an i32 scalar index and at least one branch".to_string(),
            )));
        }
        self.check_use("case", index)?;
        let spec = || RegionSpec {
            header: false,
            ..RegionSpec::body(false)
        };
        let mut p = P::new().t("\"stablehlo.case\"(").v(index).t(") (");
        for (i, branch) in branches.into_iter().enumerate() {
            let (b, r) = self.region("case", spec(), &[], |_| branch())?;
            check_region_result("case (branch)", &r, tys)?;
            if i > 0 {
                p = p.t(", ");
            }
            p = p.region(b);
        }
        let p = p.t(format!(
            ") : {}",
            fn_type(&[TensorType::scalar(DType::I32)], tys)
        ));
        Ok(self.emit("case", &[index], p, tys)?)
    }

    /// `optimization_barrier` over several values (returns them unchanged).
    pub fn optimization_barrier(&self, vals: &[&Value]) -> Result<Vec<Value>> {
        let tys: Vec<TensorType> = vals.iter().map(|v| v.ty.clone()).collect();
        let p = P::new()
            .t("stablehlo.optimization_barrier ")
            .vs(vals)
            .t(format!(" : {}", join_types(&tys)));
        self.emit("optimization_barrier", vals, p, &tys)
    }
}
