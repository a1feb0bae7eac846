//! Contractions: `dot_general` and the matrix products built on it.

use super::{attr_err, check_dims, check_kind, dtype_err, shape_err, ulist, DotDims, Kind};
use crate::builder::error::Result;
use crate::builder::func::{Value, P};
use crate::builder::types::TensorType;

impl Value {
    /// `dot_general`. Result dimensions: batch, then free lhs, then free rhs.
    pub fn dot_general(&self, rhs: &Value, dims: &DotDims) -> Result<Value> {
        let op = "dot_general";
        let both = [self, rhs];
        if self.dtype() != rhs.dtype() {
            return Err(dtype_err(
                op,
                &both,
                "both operands need the same element type; insert a `convert`",
            ));
        }
        check_kind(op, self, Kind::Numeric)?;
        check_dims(
            op,
            self,
            &[dims.lhs_batch.as_slice(), &dims.lhs_contract].concat(),
            "lhs batch/contracting dimension",
        )?;
        check_dims(
            op,
            rhs,
            &[dims.rhs_batch.as_slice(), &dims.rhs_contract].concat(),
            "rhs batch/contracting dimension",
        )?;
        if dims.lhs_batch.len() != dims.rhs_batch.len()
            || dims.lhs_contract.len() != dims.rhs_contract.len()
        {
            return Err(attr_err(
                op,
                &both,
                "lhs and rhs need the same number of batch and of contracting dimensions",
            ));
        }
        for (pairs, what) in [
            ((&dims.lhs_batch, &dims.rhs_batch), "batch"),
            ((&dims.lhs_contract, &dims.rhs_contract), "contracting"),
        ] {
            for (&l, &r) in pairs.0.iter().zip(pairs.1) {
                if self.shape()[l] != rhs.shape()[r] {
                    return Err(shape_err(
                        op,
                        &both,
                        format!(
                            "{what} dimension {l} of lhs (size {}) and {r} of rhs (size {}) differ",
                            self.shape()[l],
                            rhs.shape()[r]
                        ),
                    ));
                }
            }
        }
        let mut shape: Vec<i64> = dims.lhs_batch.iter().map(|&d| self.shape()[d]).collect();
        shape.extend(
            (0..self.rank())
                .filter(|d| !dims.lhs_batch.contains(d) && !dims.lhs_contract.contains(d))
                .map(|d| self.shape()[d]),
        );
        shape.extend(
            (0..rhs.rank())
                .filter(|d| !dims.rhs_batch.contains(d) && !dims.rhs_contract.contains(d))
                .map(|d| rhs.shape()[d]),
        );
        let out = TensorType::new(self.dtype(), &shape);
        let batching = if dims.lhs_batch.is_empty() {
            String::new()
        } else {
            format!(
                "batching_dims = [{}] x [{}], ",
                ulist(&dims.lhs_batch),
                ulist(&dims.rhs_batch)
            )
        };
        let p = P::new()
            .t("stablehlo.dot_general ")
            .v(self)
            .t(", ")
            .v(rhs)
            .t(format!(
                ", {batching}contracting_dims = [{}] x [{}] : ({}, {}) -> {out}",
                ulist(&dims.lhs_contract),
                ulist(&dims.rhs_contract),
                self.ty,
                rhs.ty
            ));
        self.func().emit1(op, &both, p, out)
    }

    /// Matrix product: `[..., m, k] x [k, n]`, or batched `[b..., m, k] x [b..., k, n]`.
    pub fn matmul(&self, rhs: &Value) -> Result<Value> {
        let (lr, rr) = (self.rank(), rhs.rank());
        if lr >= 1 && rr == 2 {
            return self.dot_general(
                rhs,
                &DotDims {
                    lhs_contract: vec![lr - 1],
                    rhs_contract: vec![0],
                    ..Default::default()
                },
            );
        }
        if lr == rr && lr >= 3 {
            let batch: Vec<usize> = (0..lr - 2).collect();
            return self.dot_general(
                rhs,
                &DotDims {
                    lhs_batch: batch.clone(),
                    rhs_batch: batch,
                    lhs_contract: vec![lr - 1],
                    rhs_contract: vec![lr - 2],
                },
            );
        }
        Err(shape_err(
            "matmul",
            &[self, rhs],
            "need [..., m, k] x [k, n] or equal-rank batched [b..., m, k] x [b..., k, n]",
        ))
    }

    /// `self · rhsᵀ` for a rank-2 `rhs` of shape `(out, in)`: contracts the last dimension
    /// of `self` with dimension 1 of `rhs` (the `dense(x, W)` of the spec).
    pub fn matmul_nt(&self, rhs: &Value) -> Result<Value> {
        if self.rank() < 1 || rhs.rank() != 2 {
            return Err(shape_err(
                "matmul_nt",
                &[self, rhs],
                "need [..., k] x [n, k]",
            ));
        }
        self.dot_general(
            rhs,
            &DotDims {
                lhs_contract: vec![self.rank() - 1],
                rhs_contract: vec![1],
                ..Default::default()
            },
        )
    }
}
